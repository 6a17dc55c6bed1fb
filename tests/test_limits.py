"""Inherited hard limits (a batch scheduler's or an admin's `ulimit`) break no evaluation: a few legitimate and
hostile candidates get their usual verdicts in a process started under a 12 GiB RLIMIT_AS and 256 open files, and
a limit really below what an evaluation needs gives `invalid` naming it. `make test-limits` runs the whole
red-team and isolation suites under the same limits.
"""

from __future__ import annotations

import json
import os
import resource
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
DEVICE = os.environ.get("DRKERNEL_TEST_DEVICE", "cpu")
GIB = 1 << 30

# Run in a child process whose hard limits are set first: prints {candidate: [status, error kind, message]}.
UNDER_LIMITS = """
import json, resource, sys
from pathlib import Path
address_space, files = int(sys.argv[1]), int(sys.argv[2])
resource.setrlimit(resource.RLIMIT_AS, (address_space, address_space))
resource.setrlimit(resource.RLIMIT_NOFILE, (files, files))
from drkernel.runner.supervisor import Supervisor
from drkernel.schema import EvalOptions, EvalRequest
box = Supervisor(device=sys.argv[3], gpu="0" if sys.argv[3] == "cuda" else None)
verdicts = {}
for path in sys.argv[4:]:
    source = Path(path).read_text()
    named = [line.split(":")[1].strip() for line in source.splitlines() if line.startswith("# task:")]
    task = named[0] if named else Path(path).name.split("__")[0] if "__" in path else "1_vector_add"
    reference = Path("examples/tasks", task + ".py").read_text()
    options = EvalOptions(device=sys.argv[3], timeout_s=30, perf_trials=3, warmup_trials=1)  # 16 GiB memory asked
    result = box.run(EvalRequest(reference, source, options))
    verdicts[path] = [result.status, result.error and result.error.kind, result.error and result.error.message]
box.close()
print(json.dumps(verdicts))
"""

CANDIDATES = {
    "examples/candidates/1_vector_add__triton.py": "correct",
    "examples/candidates/2_relu__triton.py": "correct",
    "tests/exploits/a1_pure_pytorch.py": "hacked",
    "tests/confinement/libc_direct.py": "crashed",
    "tests/confinement/tmp_stores.py": "runtime_error",
}


def evaluate_under(address_space: int, files: int, paths: list[str]) -> dict[str, list[str | None]]:
    proc = subprocess.run([sys.executable, "-c", UNDER_LIMITS, str(address_space), str(files), DEVICE, *paths],
                          cwd=REPO, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.splitlines()[-1])


@pytest.mark.slow
def test_inherited_12_gib_address_space_and_256_files_break_nothing() -> None:
    # CUDA cannot start under any such address-space limit (next test): on a GPU only the file limit applies.
    address_space = 12 * GIB if DEVICE == "cpu" else resource.RLIM_INFINITY
    verdicts = evaluate_under(address_space, 256, list(CANDIDATES))
    assert {path: v[0] for path, v in verdicts.items()} == CANDIDATES, verdicts


@pytest.mark.skipif(DEVICE != "cuda", reason="needs a GPU")
def test_cuda_under_a_12_gib_address_space_is_invalid_and_named() -> None:
    """CUDA reserves address space for all of the GPU's memory and more: on an H100 it fails to start under 12 GiB
    (cudaGetDeviceCount: out of memory). The result says which limit is to blame."""
    (verdict,) = evaluate_under(12 * GIB, 256, ["examples/candidates/1_vector_add__triton.py"]).values()
    status, kind, message = verdict
    assert (status, kind) == ("invalid", "LimitTooLow")
    assert message is not None and message.startswith("RLIMIT_AS hard limit 12.0 GiB is below what CUDA needs to start")


@pytest.mark.skipif(DEVICE != "cpu", reason="on a GPU no address-space limit is set: CUDA reserves far more")
def test_an_address_space_really_too_small_is_invalid_and_named() -> None:
    (verdict,) = evaluate_under(GIB + GIB // 2, 256, ["examples/candidates/1_vector_add__triton.py"]).values()
    status, kind, message = verdict
    assert (status, kind) == ("invalid", "LimitTooLow")
    assert message is not None and message.startswith("RLIMIT_AS hard limit 1.5 GiB is below the ")
    assert message.endswith(" GiB an evaluation needs; raise it (ulimit) for the process that runs drkernel")


def test_a_host_memory_limit_below_the_gpu_floor_is_invalid_and_named() -> None:
    """On a GPU an evaluation's own two processes hold about 1.4 GB resident (1.36-1.43 GB on an H100): a
    `memory_limit_mb` of 1024 made the watchdog end every evaluation as `crashed` / MemoryLimit before its candidate
    ran. Below the floor the request is refused before anything is forked, naming the limit to raise."""
    from drkernel.runner.supervisor import GPU_MEMORY_FLOOR_MB, memory_floor_refusal

    refused = memory_floor_refusal("cuda", 1024, 65536)
    assert refused is not None and (refused.status, refused.error.kind) == ("invalid", "LimitTooLow")
    assert refused.error.message.startswith(f"memory_limit_mb=1024 is below the {GPU_MEMORY_FLOOR_MB} MB")
    capped = memory_floor_refusal("cuda", 16384, 1500)
    assert capped is not None and capped.error.message.startswith("the sandbox's memory cap of 1500 MB is below")
    assert memory_floor_refusal("cuda", GPU_MEMORY_FLOOR_MB, 65536) is None
    assert memory_floor_refusal("cpu", 1024, 65536) is None  # the CPU's floor is the address-space limit's


@pytest.mark.skipif(DEVICE != "cuda", reason="needs a GPU")
def test_a_gpu_evaluation_under_1024_mb_of_host_memory_is_invalid_not_crashed() -> None:
    from drkernel.runner.supervisor import Supervisor
    from drkernel.schema import EvalOptions, EvalRequest

    box = Supervisor(device="cuda", gpu="0")
    try:
        reference = (REPO / "examples" / "tasks" / "1_vector_add.py").read_text()
        good = (REPO / "examples" / "candidates" / "1_vector_add__triton.py").read_text()
        result = box.run(EvalRequest(reference, good, EvalOptions(timeout_s=60, memory_limit_mb=1024)))
    finally:
        box.close()
    assert (result.status, result.error.kind) == ("invalid", "LimitTooLow"), result.to_json(indent=1)
