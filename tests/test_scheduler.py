"""The embedded scheduler: results in order, killed and hung workers retried, candidate failures never retried.

Also the helpers the service's tests share: cheap example requests with the verdict each one expects.
"""

from __future__ import annotations

import contextlib
import os
import signal
import time
from pathlib import Path

import pytest

from drkernel.sandbox import procfs
from drkernel.scheduling import scheduler as scheduler_module
from drkernel.scheduling.scheduler import Scheduler
from drkernel.schema import EvalOptions, EvalRequest, EvalResult

REPO = Path(__file__).resolve().parents[1]
# Real evaluations in the sandbox, as cheap as they get: one correctness trial, no timing, no profile.
CHEAP = {"device": "cpu", "measure_performance": False, "profile": False, "correctness_trials": 1}
# (task, candidate) pairs of the examples covering each verdict a service must get right.
MIX = [
    ("1_vector_add", "1_vector_add__triton"),  # correct
    ("2_relu", "2_relu__triton"),  # correct
    ("2_relu", "2_relu__wrong"),  # incorrect
    ("2_relu", "2_relu__pytorch_only"),  # hacked
    ("5_layernorm", "5_layernorm__raises"),  # runtime_error
]


def example(task: str, candidate: str, prefix: str = "", **options: object) -> tuple[EvalRequest, str]:
    """An example request (the candidate's source after `prefix`) and the status its `# expected:` line names."""
    code = (REPO / "examples" / "candidates" / f"{candidate}.py").read_text()
    expected = code.splitlines()[0].removeprefix("# expected:").strip()
    reference = (REPO / "examples" / "tasks" / f"{task}.py").read_text()
    return EvalRequest(reference, prefix + code, EvalOptions.from_dict({**CHEAP, **options})), expected


STARTED = "drkernel-test: the candidate is being imported"


def stalled(seconds: float) -> str:
    """Candidate prefix: say so on stdout as the candidate is imported, then sleep (time to act on its worker).

    The sandbox refuses file writes from candidate code, but sends its stdout to `stdout.txt` in its job folder.
    """
    return f"import time\nprint({STARTED!r}, flush=True)\ntime.sleep({seconds})\n"


def started(root: Path) -> bool:
    """Whether a stalled candidate has started, in a sandbox whose temporary folder is `root` (TMPDIR)."""
    # the candidate's process writes there: in its judge host's folder, or in its evaluation's (a judge per evaluation)
    outputs = [*root.glob("drkernel-*/judge-*/subject-*/subject/stdout.txt"),
               *root.glob("drkernel-*/job-*/subject/stdout.txt")]
    for output in outputs:
        with contextlib.suppress(OSError):  # its job may end and vanish meanwhile
            if STARTED in output.read_text(errors="replace"):
                return True
    return False


def assert_verdicts(results: list[EvalResult], expected: list[str]) -> None:
    """Every status as expected; a failure names each wrong one with its error."""
    wrong = [(i, r.status, e, r.error and f"{r.error.kind}: {r.error.message}")
             for i, (r, e) in enumerate(zip(results, expected)) if r.status != e]
    assert len(results) == len(expected) and not wrong, wrong[:5]


def wait_for(condition, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:g} s waiting for {what}")
        time.sleep(0.05)


@pytest.fixture
def sandbox_tmp(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The temporary folder of the sandboxes of workers started from now on: their job folders appear there."""
    monkeypatch.setenv("TMPDIR", str(tmp_path))
    return tmp_path


@pytest.mark.slow
def test_results_come_back_in_order_with_the_right_verdicts() -> None:
    requests, expected = zip(*(example(*pair) for pair in MIX * 2))
    seen: list[int] = []
    with Scheduler("cpu", workers=2) as scheduler:
        results = scheduler.evaluate_many(requests, on_result=lambda index, _: seen.append(index))
        completed = sum(w["completed"] for w in scheduler.workers())
    assert [r.status for r in results] == list(expected)
    assert sorted(seen) == list(range(len(requests)))  # each reported once
    assert completed == len(MIX)  # the second half repeats the first: answered by the result cache
    assert [r.cached for r in results] == [False] * len(MIX) + [True] * len(MIX)


@pytest.mark.slow
def test_a_worker_killed_mid_evaluation_loses_nothing(sandbox_tmp: Path) -> None:
    slow, slow_expected = example("1_vector_add", "1_vector_add__triton", prefix=stalled(2))
    others = [example(*pair) for pair in MIX]
    with Scheduler("cpu", workers=1) as scheduler:
        futures = [scheduler.submit(slow)] + [scheduler.submit(r) for r, _ in others]
        wait_for(lambda: started(sandbox_tmp), 60, "the slow evaluation to start")
        os.kill(scheduler.workers()[0]["pid"], signal.SIGKILL)
        results = [f.result(timeout=120) for f in futures]
        (worker,) = scheduler.workers()
    assert [r.status for r in results] == [slow_expected] + [e for _, e in others]
    assert worker["restarts"] == 1
    assert worker["completed"] == len(futures)  # every job answered exactly once, by the new worker or the old


@pytest.mark.slow
def test_a_hung_worker_is_killed_by_the_watchdog(sandbox_tmp: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(scheduler_module, "START_ALLOWANCE_S", 1.0)
    request, expected = example("1_vector_add", "1_vector_add__triton", prefix=stalled(0.2), timeout_s=6.0)
    with Scheduler("cpu", workers=1) as scheduler:
        future = scheduler.submit(request)
        wait_for(lambda: started(sandbox_tmp), 60, "the evaluation to start")
        pid = scheduler.workers()[0]["pid"]
        os.kill(pid, signal.SIGSTOP)  # alive, holding its job, answering nothing
        try:
            result = future.result(timeout=60)
        finally:
            with contextlib.suppress(ProcessLookupError):  # never leave a stopped process behind
                os.kill(pid, signal.SIGCONT)
        (worker,) = scheduler.workers()
    assert result.status == expected
    assert worker["restarts"] == 1  # the watchdog killed the stopped worker, a new one ran the job


CANDIDATE_FAILURES = {  # forward's body -> the verdict, which is final: the worker survives, nothing is retried
    "os._exit(3)": "crashed",
    "import faulthandler; faulthandler._sigsegv()": "crashed",
    "raise ValueError('boom')": "runtime_error",
}


def test_candidate_failures_are_results_not_retries() -> None:
    reference, _ = example(*MIX[0])
    template = "import os, torch\nclass ModelNew(torch.nn.Module):\n    def forward(self, a, b):\n        {}\n"
    requests = [EvalRequest(reference.reference, template.format(body), reference.options)
                for body in CANDIDATE_FAILURES]
    with Scheduler("cpu", workers=1) as scheduler:
        assert scheduler.wait_ready(timeout=120)  # started with the scheduler, before any job
        (idle,) = scheduler.workers()
        assert idle["pid"] is not None and idle["completed"] == 0
        assert any(p.ppid == idle["pid"] for p in procfs.processes())  # and its fork server is up
        results = scheduler.evaluate_many(requests)
        (worker,) = scheduler.workers()
    assert [r.status for r in results] == list(CANDIDATE_FAILURES.values())
    assert all(r.error is not None and r.error.kind != "WorkerLost" for r in results)
    assert worker["restarts"] == 0
    assert worker["completed"] == len(requests)


def test_closing_while_a_worker_starts_ends_it_and_its_fork_server_at_once() -> None:
    """A scheduler closed before its worker is ready, with no job for it (a bench run whose model refuses the key),
    waits neither for the fork server's imports nor leaves it behind."""
    scheduler = Scheduler("cpu", workers=1)
    worker = scheduler.workers()[0]["pid"]
    try:
        wait_for(lambda: any(p.ppid == worker for p in procfs.processes()), 30, "the worker to start its fork server")
        fork_server = next(p.pid for p in procfs.processes() if p.ppid == worker)
        assert not scheduler.wait_ready(timeout=0)  # still importing torch and Triton
    finally:
        started = time.monotonic()
        scheduler.close()
        closed_in = time.monotonic() - started
    assert closed_in < 2.0
    assert not any(p.pid in (worker, fork_server) and p.state != "Z" for p in procfs.processes())


def test_a_failure_of_the_judge_s_own_gpu_work_runs_again_and_is_never_the_candidate_s() -> None:
    # cudaErrorMapBufferObjectFailed reached a legitimate candidate as runtime_error on an H100 (and its twin got it
    # from the cache). The judge's own CUDA error is the harness's: SandboxError, run again, never cached. Here the
    # reference (run by the judge alone) raises one.
    task = (REPO / "examples/tasks/2_relu.py").read_text().replace(
        "return torch.relu(x)", 'raise torch.AcceleratorError("CUDA error: mapping of buffer object failed")')
    assert "AcceleratorError" in task
    request = EvalRequest(task, (REPO / "examples/candidates/2_relu__triton.py").read_text(),
                          EvalOptions.from_dict(CHEAP), task_name="2_relu")
    with Scheduler("cpu", workers=1, max_attempts=2) as scheduler:
        first, twin = scheduler.evaluate_many([request, request])
        (worker,) = scheduler.workers()
    assert first.status == "crashed" and first.error.kind == "SandboxError", first.error
    assert "mapping of buffer object failed" in first.error.message and not twin.cached
    assert worker["completed"] == 4  # each ran twice (max_attempts), the twin too: a harness failure is not cached
