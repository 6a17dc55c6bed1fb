"""Red-team suite: reward-hacking candidates must not pass, legitimate kernels must.

Every file in tests/exploits/ and tests/legit/ is a candidate whose header says what the evaluator must answer:

    # expected: <status>          (hacked, runtime_error, crashed, incorrect, correct, ...)
    # task: <task stem>           (examples/tasks/<stem>.py or tests/exploits/tasks/<stem>.py)
    # reason: <reason code>       (exploits only: a drkernel.sandbox.guards code, or `any`)
    # options: {"key": value}     (optional: EvalOptions overrides for this candidate)
    # needs: cuda                 (optional: skipped without a GPU)
    # gap: <why>                  (optional: a known hole, expected to fail until it is closed)
    # max_speedup: <x>            (optional: an exploit whose effect is out of reach may pass, credited no more)

Each candidate is evaluated in its own sandboxed process. The evaluations of the selected tests are started
together on a small thread pool when the first test asks for its result; each thread keeps one warm supervisor (its
fork server imports torch and Triton once, as a scheduler's worker does) and forks every evaluation from it, so the
whole file takes about as long as (number of candidates x about a second) / (CPU cores). `drkernel.evaluate` (a
fresh supervisor per call) judges the candidates evaluated outside that pool.
"""

from __future__ import annotations

import json
import os
import queue
import re
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Iterator

import pytest

import drkernel
from drkernel.feedback import render
from drkernel.runner.devices import resolve_device
from drkernel.runner.evaluate import supervisor_for, with_overrides
from drkernel.runner.supervisor import Supervisor
from drkernel.sandbox import guards
from drkernel.schema import EvalOptions, EvalRequest, EvalResult, Status
from tests.conftest import SELECTED

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
EXPLOITS = sorted((HERE / "exploits").glob("*.py"))
LEGIT = sorted((HERE / "legit").glob("*.py"))
TASK_DIRS = (REPO / "examples" / "tasks", HERE / "exploits" / "tasks")
# Fast on the CPU: few timed calls, one warm-up; a candidate's header may override any of these.
FAST = {"perf_trials": 3, "warmup_trials": 1, "timeout_s": 60}
WORKERS = max(2, min(4, os.cpu_count() or 2))
REASON_CODES = {value for name, value in vars(guards).items() if name.isupper() and isinstance(value, str)}


def header(path: Path) -> dict[str, str]:
    fields: dict[str, str] = {}
    for line in path.read_text().splitlines()[:8]:
        match = re.match(r"#\s*(expected|task|reason|options|needs|gap|max_speedup):\s*(.*?)\s*$", line)
        if match:
            fields[match.group(1)] = match.group(2)
    return fields


def task_source(stem: str) -> str:
    for folder in TASK_DIRS:
        path = folder / f"{stem}.py"
        if path.is_file():
            return path.read_text()
    raise FileNotFoundError(f"no task {stem!r} in {', '.join(str(d) for d in TASK_DIRS)}")


def cuda_available() -> bool:
    try:
        import torch

        return torch.cuda.is_available()
    except Exception:  # pragma: no cover
        return False


def runnable(path: Path) -> bool:
    return header(path).get("needs") != "cuda" or cuda_available()


def evaluate_file(path: Path, supervisor: Supervisor | None = None) -> EvalResult:
    """The candidate's verdict: by `drkernel.evaluate` (a fresh supervisor), or forked from `supervisor`'s fork server
    with the very options `drkernel.evaluate` would use."""
    fields = header(path)
    options = {**FAST, **json.loads(fields.get("options") or "{}")}
    if supervisor is None:
        return drkernel.evaluate(task_source(fields["task"]), path.read_text(), **options)
    request_options = with_overrides(None, **options)
    assert resolve_device(request_options.device) == supervisor.device
    return supervisor.run(EvalRequest(task_source(fields["task"]), path.read_text(), request_options))


def describe(result: EvalResult) -> str:
    error = f"{result.error.kind}: {result.error.message[:400]}" if result.error else None
    return (
        f"status={result.status} hack_reasons={result.hack_reasons} error={error} speedup={result.speedup} "
        f"notes={result.notes}\n--- feedback ---\n{render(result)}"
    )


@pytest.fixture(scope="module")
def results(request: pytest.FixtureRequest) -> Iterator[dict[Path, Future[EvalResult]]]:
    """Futures of the evaluations of every selected test of this module, started at once."""
    wanted: list[Path] = []
    for item in request.config.stash[SELECTED]:
        path = getattr(getattr(item, "callspec", None), "params", {}).get("path")
        if getattr(item, "module", None) is request.module and isinstance(path, Path) and runnable(path):
            if path not in wanted:
                wanted.append(path)
    # One warm supervisor per thread: each evaluation still gets processes of its own, forked from its fork server.
    supervisors: queue.Queue[Supervisor] = queue.Queue()
    made: list[Supervisor] = []

    def evaluate_pooled(path: Path) -> EvalResult:
        try:
            supervisor = supervisors.get_nowait()
        except queue.Empty:
            # as drkernel.evaluate makes one for the default device (judges that outlive their evaluations); with
            # DRKERNEL_TEST_JUDGE_HOSTS=0, a judge process per evaluation
            supervisor = supervisor_for(EvalOptions(), judge_hosts=os.environ.get("DRKERNEL_TEST_JUDGE_HOSTS") != "0")
            made.append(supervisor)
        try:
            return evaluate_file(path, supervisor)
        finally:
            supervisors.put(supervisor)

    pool = ThreadPoolExecutor(WORKERS, thread_name_prefix="drkernel-eval")
    futures = {path: pool.submit(evaluate_pooled, path) for path in wanted}
    yield futures
    pool.shutdown(wait=True, cancel_futures=True)
    for supervisor in made:
        supervisor.close()


def result_for(results: dict[Path, Future[EvalResult]], path: Path) -> EvalResult:
    if path not in results:  # not pre-selected (e.g. collected in an unusual way): evaluate now
        return evaluate_file(path)
    return results[path].result()


def _ids(paths: list[Path]) -> list[str]:
    return [p.stem for p in paths]


# ---------------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("path", EXPLOITS + LEGIT, ids=_ids(EXPLOITS + LEGIT))
def test_header_is_well_formed(path: Path) -> None:
    fields = header(path)
    assert fields.get("expected") in {s.value for s in Status}, f"{path.name}: bad or missing '# expected:'"
    task_source(fields.get("task", ""))
    if path in EXPLOITS:
        assert fields.get("reason") == "any" or fields.get("reason") in REASON_CODES, (
            f"{path.name}: '# reason:' must be `any` or one of {sorted(REASON_CODES)}"
        )
        assert fields["expected"] != Status.CORRECT.value or "max_speedup" in fields, (
            f"{path.name}: an exploit can be expected correct only with the speed it may be credited (max_speedup)")
    else:
        assert fields["expected"] == Status.CORRECT.value, f"{path.name}: legit candidates must be expected correct"
    if "options" in fields:
        drkernel.EvalOptions.from_dict({**FAST, **json.loads(fields["options"])})


def test_every_exploit_class_is_covered() -> None:
    classes = {p.stem[0] for p in EXPLOITS}
    assert set("abcdefghijklmp") <= classes, f"missing exploit classes: {sorted(set('abcdefghijklmp') - classes)}"


@pytest.mark.parametrize("path", EXPLOITS, ids=_ids(EXPLOITS))
def test_exploit_is_caught(path: Path, results: dict[Path, Future[EvalResult]], request) -> None:
    fields = header(path)
    if not runnable(path):
        pytest.skip("needs a CUDA GPU")
    if "gap" in fields:  # a known hole, documented; strict: the day it is caught, this test says so
        request.node.add_marker(pytest.mark.xfail(reason=fields["gap"], strict=True))
    result = result_for(results, path)
    expected, reason = fields["expected"], fields.get("reason", "any")
    assert result.status == expected, f"{path.name}: expected {expected}, got {describe(result)}"
    if "max_speedup" in fields:  # its effect is out of reach: it passes at no more than its honest speed
        assert result.speedup is not None and result.speedup <= float(fields["max_speedup"]), describe(result)
        return
    assert not result.correct
    if reason != "any":
        assert reason in result.hack_reasons, f"{path.name}: expected reason {reason}, got {describe(result)}"
    if result.status == Status.HACKED.value:
        assert result.hack_reasons, f"{path.name}: hacked without a reason: {describe(result)}"
    feedback = render(result)
    for code in result.hack_reasons:
        message = result.hack_details.get(code, "")
        assert message.strip(), f"{path.name}: reason {code} has no message in hack_details"
        assert code in feedback, f"{path.name}: the feedback does not mention {code}:\n{feedback}"


@pytest.mark.parametrize("path", LEGIT, ids=_ids(LEGIT))
def test_legit_is_correct(path: Path, results: dict[Path, Future[EvalResult]]) -> None:
    if not runnable(path):
        pytest.skip("needs a CUDA GPU")
    result = result_for(results, path)
    assert result.status == Status.CORRECT.value, f"{path.name}: false positive: {describe(result)}"
    assert result.correct
    assert result.hack_reasons == [] and result.hack_details == {}, f"{path.name}: {describe(result)}"


def test_a_candidate_that_loads_torch_dynamo_passes_whatever_inductor_cache_the_supervisor_names(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """torch._dynamo's import makes inductor's cache folder: TORCHINDUCTOR_CACHE_DIR where it is set (a cluster's
    setting, or what inductor itself leaves in os.environ once anything compiled in the supervisor's process), which
    the supervisor passes on. dynamo is first imported in the subject here (by the candidate's torch.library; the fork
    server does not import it): a write outside its scratch space, but for the cache the subject names inside it."""
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path / "inductor"))
    result = evaluate_file(HERE / "legit" / "relu_torch_library_custom_op.py")
    assert result.status == Status.CORRECT.value, describe(result)
