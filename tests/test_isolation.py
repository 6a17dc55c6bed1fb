"""Whatever a candidate does, the harness survives and returns the right verdict within its timeout."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from drkernel.runner import supervisor as supervisor_module
from drkernel.runner.supervisor import Supervisor
from drkernel.sandbox.gpu_policy import precision_budget
from drkernel.sandbox.subject_link import SharedCopies
from drkernel.schema import EvalOptions, EvalRequest

REPO = Path(__file__).resolve().parents[1]
REFERENCE = (REPO / "examples" / "tasks" / "1_vector_add.py").read_text()
GOOD = (REPO / "examples" / "candidates" / "1_vector_add__triton.py").read_text()
DEVICE = os.environ.get("DRKERNEL_TEST_DEVICE", "cpu")  # "cuda" runs the same cases on a GPU machine
TIMEOUT_S = 8.0 if DEVICE == "cpu" else 20.0
SLACK_S = 5.0  # "within the timeout plus a few seconds"

BODY = """
import os, sys, signal, ctypes, threading, torch, torch.nn as nn
class ModelNew(nn.Module):
    def forward(self, a, b):
{body}
        return a + b
"""

CASES = {
    # name: (candidate source, expected status, expected error kind or hack reason)
    "raises": (BODY.format(body="        raise ValueError('boom')"), "runtime_error", "ValueError"),
    "infinite_loop": (BODY.format(body="        while True: pass"), "timeout", "Timeout"),
    "sys_exit": (BODY.format(body="        sys.exit(0)"), "runtime_error", "SystemExit"),
    "os_exit": (BODY.format(body="        os._exit(0)"), "crashed", "Exit"),
    "segfault": (BODY.format(body="        ctypes.string_at(0)"), "crashed", "Signal"),
    # On the CPU an address-space limit turns the bomb into a MemoryError; next to a CUDA context (which reserves
    # huge address ranges) the supervisor's resident-memory watchdog kills the process instead.
    "memory_bomb": (BODY.format(body="        x = [bytearray(1 << 26) for _ in range(10**6)]"),
                    *(("runtime_error", "MemoryError") if DEVICE == "cpu" else ("crashed", "MemoryLimit"))),
    "fault": (BODY.format(body="        import faulthandler; faulthandler._sigsegv()"), "crashed", "Signal"),
    # Signals from the candidate's code are refused (and recorded as a hack) before they are sent.
    "kill_parent": (BODY.format(body="        os.kill(os.getppid(), signal.SIGKILL)"), "hacked", "PermissionError"),
    "kill_group": (BODY.format(body="        os.killpg(0, signal.SIGKILL)"), "hacked", "PermissionError"),
    "kill_self": (BODY.format(body="        signal.pthread_kill(threading.main_thread().ident, signal.SIGKILL)"),
                  "crashed", "Signal"),
    "syntax_error": ("class ModelNew(nn.Module)\n    pass\n", "compile_error", "SyntaxError"),
    "import_error": ("import not_a_module_anywhere\n", "compile_error", "ModuleNotFoundError"),
    "no_modelnew": ("import torch\nclass Other(torch.nn.Module):\n    pass\n", "invalid", "NoModelNew"),
    "exit_at_import": ("raise SystemExit(0)\n", "runtime_error", "SystemExit"),
}


@pytest.fixture(scope="module")
def supervisor():
    box = Supervisor(device=DEVICE, gpu="0" if DEVICE == "cuda" else None)
    yield box
    box.close()


def options(**kw) -> EvalOptions:
    # On a GPU the evaluation's own processes hold about 1.4 GB (drkernel.runner.supervisor.GPU_MEMORY_FLOOR_MB).
    memory = 1024 if DEVICE == "cpu" else 4096
    return EvalOptions(timeout_s=TIMEOUT_S, memory_limit_mb=memory, perf_trials=3, warmup_trials=1, **kw)


@pytest.mark.parametrize("name", sorted(CASES))
def test_hostile_candidate_gets_its_verdict(supervisor: Supervisor, name: str) -> None:
    source, status, kind = CASES[name]
    start = time.monotonic()
    result = supervisor.run(EvalRequest(REFERENCE, source, options()))
    elapsed = time.monotonic() - start
    assert result.status == status, result.to_json(indent=1)
    assert result.error is not None and result.error.kind == kind
    assert result.error.message
    assert not result.correct
    assert elapsed < TIMEOUT_S + SLACK_S


def test_a_crash_in_a_call_names_what_the_reference_returns(supervisor: Supervisor) -> None:
    """The usual crash is a store past an output allocated too small: the message gives the size to allocate."""
    result = supervisor.run(EvalRequest(REFERENCE, CASES["segfault"][0], options()))
    assert (result.status, result.error.kind) == ("crashed", "Signal"), result.to_json(indent=1)
    assert re.search(r"killed by SIGSEGV .*; for these inputs the reference returns a float32 tensor of shape "
                     r"\(\d+,\)$", result.error.message), result.error.message


def test_next_evaluation_is_unaffected(supervisor: Supervisor) -> None:
    """After every kind of abuse above (same supervisor, same fork server), a correct kernel still passes."""
    result = supervisor.run(EvalRequest(REFERENCE, GOOD, options()))
    assert result.status == "correct", result.to_json(indent=1)
    assert result.correct and result.speedup is not None and result.speedup > 0
    assert result.timing is not None and result.timing.candidate is not None
    assert result.environment is not None
    if DEVICE == "cpu":
        assert result.timing.candidate.method == "interpreter_wall"
        assert "say nothing of GPU speed" in result.timing.note
        assert result.environment.interpreter and not result.environment.gpu
    else:
        assert result.timing.candidate.method == "cuda_event" and result.environment.gpu
        assert result.profile is not None and result.profile.meaningful and result.profile.coverage > 0.5


def test_candidate_sees_no_secrets_no_network_and_a_private_directory(supervisor: Supervisor, monkeypatch) -> None:
    probe = BODY.format(body="""
        import socket, tempfile
        leaked = [k for k in os.environ if 'SECRET' in k or 'TOKEN' in k]
        if leaked: raise RuntimeError('leaked ' + ','.join(leaked))
        if os.getcwd() != tempfile.gettempdir(): raise RuntimeError('shared cwd ' + os.getcwd())
        inductor = os.environ.get('TORCHINDUCTOR_CACHE_DIR', '')
        if not inductor.startswith(os.getcwd()): raise RuntimeError('inductor cache outside: ' + inductor)
        try:
            socket.create_connection(('127.0.0.1', 9), timeout=1)
        except OSError as exc:
            raise RuntimeError('network: ' + type(exc).__name__)
        raise RuntimeError('network: connected')""")
    monkeypatch.setenv("DRKERNEL_TEST_SECRET", "hunter2")
    monkeypatch.setenv("HF_TOKEN", "hf_abc")
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", "/tmp/drkernel-test-shared-inductor")  # passed on, but not used
    box = Supervisor(device=DEVICE, gpu="0" if DEVICE == "cuda" else None)  # a new fork server started with the secrets in the supervisor's environment
    try:
        result = box.run(EvalRequest(REFERENCE, probe, options()))
    finally:
        box.close()
    assert result.error is not None, result.to_json(indent=1)
    # No leak, a private cwd, and the connection refused by the audit hook before the (empty) network namespace
    # would have refused it.
    assert result.error.message == "network: PermissionError", result.error.message
    assert "sandbox_violation" in result.hack_reasons


def test_the_fork_servers_bytecode_is_its_own(tmp_path: Path) -> None:
    """The fork server compiles its imports into a folder of its own once and reads them from there at each later
    start; an evaluation neither writes there nor passes the folder on, and imports as it did before."""
    cache = tmp_path / "bytecode"
    probe = BODY.format(body=f"""
        import tabnanny  # imported by no fork server: compiled here, and written if writing were on
        try:
            with open({str(cache / "planted.pyc")!r}, 'wb') as planted:
                planted.write(b'not bytecode')
            outcome = 'written'
        except OSError as exc:
            outcome = type(exc).__name__
        raise RuntimeError(' '.join([str(sys.pycache_prefix), str(sys.dont_write_bytecode),
                                     os.environ.get('PYTHONPYCACHEPREFIX', '-'),
                                     os.environ.get('PYTHONDONTWRITEBYTECODE', '-'), outcome]))""")
    box = Supervisor(device=DEVICE, gpu="0" if DEVICE == "cuda" else None, bytecode_cache=cache)
    try:
        result = box.run(EvalRequest(REFERENCE, probe, options()))
    finally:
        box.close()
    assert result.error is not None, result.to_json(indent=1)
    assert result.error.message == "None True - 1 PermissionError", result.error.message
    assert "sandbox_violation" in result.hack_reasons
    compiled = {p.relative_to(cache) for p in cache.rglob("*.pyc")}
    assert any("torch" in p.parts for p in compiled)
    assert any(p.name.startswith("forkserver.") for p in compiled)
    assert not any(p.name.startswith(("tabnanny.", "planted")) for p in compiled)
    stamps = {p: p.stat().st_mtime_ns for p in cache.rglob("*.pyc")}
    again = Supervisor(device=DEVICE, gpu="0" if DEVICE == "cuda" else None, bytecode_cache=cache)
    try:
        again.server.ensure_running()
    finally:
        again.close()
    assert {p: p.stat().st_mtime_ns for p in cache.rglob("*.pyc")} == stamps  # every import read, none compiled


def test_an_evaluation_collects_garbage_though_its_fork_server_imported_without(supervisor) -> None:
    """The fork server imports with the cyclic collector off (its passes took a sixth of the imports' time on an H100's
    host) and freezes what it made; the evaluation collects the candidate's cyclic garbage between requests, on the
    candidate's own thread (drkernel.sandbox.relay: a finalizer never runs on the thread that holds the channel)."""
    probe = BODY.format(body="""
        import gc, weakref
        if not hasattr(self, "cycle"):
            class Cycle:
                pass
            for _ in range(5000):  # past the collector's first threshold
                made = Cycle()
                made.me = made
            self.cycle = weakref.ref(made)
            del made
        else:
            raise RuntimeError(f"{self.cycle() is None} {gc.isenabled()} {gc.get_freeze_count() > 100_000}")""")
    result = supervisor.run(EvalRequest(REFERENCE, probe, options()))
    assert result.error is not None and result.error.message == "True False True", result.to_json(indent=1)


def test_no_evaluation_imports_torch_dynamo(supervisor) -> None:
    """torch._dynamo (with inductor's configuration, a quarter of the fork server's imports on an H100's host) is
    imported by neither the fork server nor the evaluation's own steps: a correct candidate that fails once it is
    loaded passes every call (on a GPU the profiled ones too, where `torch.profiler` would import it). The judge's
    calls through torch's `_disable_dynamo` wrappers without importing it stay in the judge's process."""
    probe = GOOD + """
import sys as _sys
_forward = ModelNew.forward


def _probed(self, *args):
    if "torch._dynamo" in _sys.modules:
        raise RuntimeError("torch._dynamo was imported in the evaluation")
    import torch.utils.checkpoint
    wrapper = torch.utils.checkpoint.checkpoint  # one of torch's `_disable_dynamo` wrappers
    cells = dict(zip(wrapper.__code__.co_freevars, wrapper.__closure__))
    if hasattr(cells["fn"].cell_contents, "__dynamo_disable"):
        raise RuntimeError("the judge's way round torch._disable_dynamo reached the subject")
    return _forward(self, *args)


ModelNew.forward = _probed
"""
    result = supervisor.run(EvalRequest(REFERENCE, probe, options()))
    assert result.status == "correct", result.to_json(indent=1)
    assert result.profile is not None or DEVICE == "cpu"


def test_the_judges_estimate_of_a_tasks_memory_imports_no_torch_dynamo_and_is_as_with_it() -> None:
    """On the meta device the reference runs torch's Python references, each wrapped in `torch._disable_dynamo`, whose
    first call imports torch._dynamo (1.7 s of each evaluation's judge on an H100's host): the judge calls them
    directly, with the same sizes as with dynamo imported."""
    script = """
import json, sys
import drkernel.sandbox.forkserver
from drkernel.sandbox import reference, startup
from drkernel.tasks import synthetic
startup.find_dynamo_disabled()
if sys.argv[1] == "direct":
    startup.call_dynamo_disabled_directly()
else:
    import torch._dynamo
sizes = []
for task in synthetic.generate_tasks("test", 6):
    module = type(sys)("reference")
    exec(task.code, module.__dict__)
    sizes.append(reference.sizes_on_meta(module))
print(json.dumps([len(startup._DYNAMO_DISABLED), "torch._dynamo" in sys.modules, sizes]))
"""
    runs = {}
    for mode in ("direct", "dynamo"):
        out = subprocess.run([sys.executable, "-c", script, mode], capture_output=True, text=True, timeout=300,
                             cwd=REPO)
        assert out.returncode == 0, out.stderr[-2000:]
        runs[mode] = json.loads(out.stdout.strip().splitlines()[-1])
    (found, imported, sizes), (_, imported_there, sizes_there) = runs["direct"], runs["dynamo"]
    assert found > 100 and not imported and imported_there
    assert sizes == sizes_there and all(inputs and outputs for inputs, outputs in sizes)


@pytest.mark.skipif(DEVICE != "cuda", reason="the warm-up and the profile run on a GPU only")
def test_the_judges_warm_up_and_the_profile_import_no_torch_dynamo() -> None:
    script = """
import sys, torch
from drkernel.sandbox import profiling, startup
startup.warm_up(torch.device("cuda"))
profiling.profile_cuda([lambda: torch.ones(8, device="cuda").add_(1)], set())
print("torch._dynamo" in sys.modules)
"""
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300, cwd=REPO)
    assert out.returncode == 0 and out.stdout.strip().splitlines()[-1] == "False", out.stdout + out.stderr[-2000:]


def test_the_fork_server_keeps_bytecode_only_where_the_installation_has_none(tmp_path: Path, monkeypatch) -> None:
    package = tmp_path / "site" / "compiled_here"
    package.mkdir(parents=True)
    (package / "__init__.py").write_text("")
    monkeypatch.syspath_prepend(str(tmp_path / "site"))
    assert not supervisor_module.installation_has_bytecode("compiled_here")
    compiled = package / "__pycache__" / f"__init__.{sys.implementation.cache_tag}.pyc"
    compiled.parent.mkdir()
    compiled.write_bytes(b"")
    assert supervisor_module.installation_has_bytecode("compiled_here")
    assert supervisor_module.installation_has_bytecode("no_such_package_anywhere")  # nothing to compile

    monkeypatch.delenv("DRKERNEL_BYTECODE_CACHE", raising=False)
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    for has_bytecode, expected in ((True, None), (False, tmp_path / "home" / ".cache" / "drkernel" / "bytecode")):
        monkeypatch.setattr(supervisor_module, "installation_has_bytecode", lambda package, has=has_bytecode: has)
        assert supervisor_module.fork_server_bytecode() == expected
    assert expected.is_dir() and expected.stat().st_mode & 0o777 == 0o700
    monkeypatch.setattr(supervisor_module, "installation_has_bytecode", lambda package: True)
    assert supervisor_module.fork_server_bytecode(tmp_path / "chosen") == tmp_path / "chosen"  # asked for: always
    monkeypatch.setenv("DRKERNEL_BYTECODE_CACHE", str(tmp_path / "from_env"))
    assert supervisor_module.fork_server_bytecode() == tmp_path / "from_env"
    (tmp_path / "a_file").write_text("")
    assert supervisor_module.fork_server_bytecode(tmp_path / "a_file" / "bytecode") is None  # cannot be made: as before


def test_cli_json_gives_one_object_and_survives(tmp_path: Path) -> None:
    ref = tmp_path / "ref.py"
    ref.write_text(REFERENCE)
    for source, status in ((GOOD, "correct"), (CASES["segfault"][0], "crashed")):
        cand = tmp_path / "cand.py"
        cand.write_text(source)
        proc = subprocess.run(
            [sys.executable, "-m", "drkernel.cli.main", "eval", "-r", str(ref), "-c", str(cand), "--device", DEVICE,
             "--timeout", str(TIMEOUT_S), "--perf-trials", "3", "--json"],
            capture_output=True, text=True, timeout=120,
        )
        assert proc.returncode == 0, proc.stderr
        result = json.loads(proc.stdout)  # exactly one JSON object, nothing else on stdout
        assert result["status"] == status


def test_cli_bad_arguments_exit_nonzero_with_a_message(tmp_path: Path) -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "drkernel.cli.main", "eval", "-r", str(tmp_path / "missing.py"),
         "-c", str(tmp_path / "missing2.py"), "--json"],
        capture_output=True, text=True, timeout=60,
    )
    assert proc.returncode == 2
    assert "cannot read the reference" in proc.stderr
    assert proc.stdout == ""


def test_the_memory_watch_scans_proc_once_per_interval_for_all_evaluations(monkeypatch) -> None:
    """The watchdog's /proc scan is shared and rate-limited (one per evaluation every 50 ms kept half a core of a
    worker busy on a loaded host), and still sees a group's memory: a process in its own process group holding 200 MB."""
    holder = subprocess.Popen([sys.executable, "-c", "import sys, time; x = bytearray(200 << 20); "
                               "print('ready', flush=True); time.sleep(60)"], stdout=subprocess.PIPE, text=True,
                              start_new_session=True)
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "ready"
        memory = supervisor_module.GroupMemory()
        assert memory.rss(holder.pid) > 190 << 20
        assert memory.rss(os.getpgrp()) > 0 and memory.rss(2 ** 22 + 7) == 0  # ours; a group that cannot exist

        scans = []
        real = supervisor_module.procfs.processes
        monkeypatch.setattr(supervisor_module.procfs, "processes", lambda: scans.append(1) or real())
        memory = supervisor_module.GroupMemory()
        for _ in range(100):  # three evaluations' watches, many times within one interval
            memory.rss(holder.pid), memory.rss(os.getpgrp()), memory.rss(1)
        assert len(scans) == 1
        time.sleep(supervisor_module.MEMORY_CHECK_S)
        assert memory.rss(holder.pid) > 190 << 20 and len(scans) == 2
    finally:
        holder.kill()
        holder.wait()


@pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA IPC exists only on a GPU")
def test_what_the_judge_shares_lies_alone_in_its_allocations() -> None:
    """CUDA IPC opens the whole allocation a shared tensor lies in (exploit l9 writes through it): the judge's copy
    for the subject lies in an allocation with nothing else in it, away from the values it computes with, and the
    pool's memory is given back at `release`."""
    device = torch.device("cuda", 0)
    inputs = torch.randn(16, 300, device=device)
    ref_out = torch.relu(inputs)  # what the judge computes before it shares the inputs, beside them
    shares = SharedCopies(device)
    shared = shares.copy(inputs)
    torch.cuda.synchronize()
    assert torch.equal(shared, inputs) and shared.data_ptr() != inputs.data_ptr()

    segments = torch.cuda.memory_snapshot()

    def segment_of(tensor: torch.Tensor) -> dict:
        ptr = tensor.untyped_storage().data_ptr()
        return next(s for s in segments if s["address"] <= ptr < s["address"] + s["total_size"])

    assert segment_of(shared)["address"] not in {segment_of(inputs)["address"], segment_of(ref_out)["address"]}
    assert [b["size"] for b in segment_of(shared)["blocks"] if b["state"] == "active_allocated"] == [
        shared.untyped_storage().nbytes() + (-shared.untyped_storage().nbytes()) % 512]
    reserved = torch.cuda.memory_reserved(device)
    del shared
    shares.release()
    torch.cuda.empty_cache()
    assert torch.cuda.memory_reserved(device) < reserved


@pytest.mark.skipif(DEVICE != "cuda", reason="the GPU's caching allocator")
def test_a_large_evaluations_checks_hold_few_copies_of_its_inputs(supervisor: Supervisor) -> None:
    """Two large evaluations check at once only if each phase's memory is a small multiple of its inputs. In the
    correctness phase the judge needs the inputs, the reference's outputs and the copy it shares (3 copies of a ReLU's
    input) and its float64 slice's allowance; the subject its own copy and the outputs (2). Two more segments were
    held in the judge on an H100 (docs/performance.md, 2026-11-26): the previous trial's shared copy,
    kept mapped by the subject, and one pinned by a 4 MiB sample of the reference's output (measured without them:
    3 copies and the allowance). In the ablation the judge needs the inputs and their shared copy (2), the subject
    two inputs and an output, then an input and two outputs (3); it held six, with all four of its copies at once and
    the last mode's outputs still mapped by the judge (docs/performance.md, 2026-11-27)."""
    total = torch.cuda.get_device_properties(0).total_memory
    elements = int(total / 20 / 4 * 1.05)  # inputs just over a twentieth of the GPU: a large evaluation
    rows = 1024
    task = (REPO / "examples" / "tasks" / "2_relu.py").read_text().replace(
        "batch_size = 16\ndim = 300", f"batch_size = {rows}\ndim = {elements // rows}")
    good = (REPO / "examples" / "candidates" / "2_relu__triton.py").read_text()
    result = supervisor.run(EvalRequest(task, good, EvalOptions(timeout_s=120, perf_trials=3, warmup_trials=1)))
    assert result.correct, result.to_json(indent=1)
    inputs_gib = rows * (elements // rows) * 4 / 2**30
    float64_gib = precision_budget(total, large=True) / 2**30
    judge, subject = result.memory_gib["correctness_judge"], result.memory_gib["correctness_subject"]
    assert judge <= 3 * inputs_gib + float64_gib + 0.5, (judge, inputs_gib, float64_gib)  # 5 copies and it before
    assert subject <= 2 * inputs_gib + 2.0, (subject, inputs_gib)
    judge, subject = result.memory_gib["ablation_judge"], result.memory_gib["ablation_subject"]
    assert judge <= 2 * inputs_gib + 0.5, (judge, inputs_gib)
    assert subject <= 3 * inputs_gib + 2.0, (subject, inputs_gib)
