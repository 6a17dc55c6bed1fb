"""Identical candidates judged once (drkernel.scheduling.cache), in the embedded scheduler."""

from __future__ import annotations

import threading
from concurrent.futures import Future

import pytest

from drkernel.scheduling.cache import ResultCache, cache_key
from drkernel.scheduling.scheduler import Scheduler
from drkernel.schema import ErrorInfo, EvalOptions, EvalRequest, EvalResult, Status
from tests.test_scheduler import example


class FakeBackend:
    """Runs nothing: hands out futures the test completes, and counts them."""

    def __init__(self) -> None:
        self.runs: list[tuple[EvalRequest, Future[EvalResult]]] = []

    def run(self, request: EvalRequest) -> Future[EvalResult]:
        future: Future[EvalResult] = Future()
        self.runs.append((request, future))
        return future


def request(candidate: str = "class ModelNew: ...", task: str = "t", **options: object) -> EvalRequest:
    return EvalRequest("class Model: ...", candidate, EvalOptions.from_dict({"device": "cpu", **options}), task)


def verdict(status: Status = Status.CORRECT, kind: str | None = None) -> EvalResult:
    return EvalResult(status=status.value, correct=status is Status.CORRECT, speedup=1.5, duration_s=2.0,
                      phases_s={"load": 0.5}, error=None if kind is None else ErrorInfo(kind, "x"))


def test_a_duplicate_gets_the_same_result_marked_cached() -> None:
    backend, cache = FakeBackend(), ResultCache("cpu")
    first = cache.submit(request(), backend.run)
    backend.runs[0][1].set_result(verdict())
    second = cache.submit(request(), backend.run)
    assert len(backend.runs) == 1 and cache.hits == 1
    assert first.result().cached is False and second.result().cached is True
    assert {**second.result().to_dict(), "cached": False} == first.result().to_dict()
    second.result().phases_s["load"] = 9.0  # a copy: editing one result edits no other
    assert cache.submit(request(), backend.run).result().phases_s == {"load": 0.5}
    assert EvalResult.from_json(second.result().to_json()).cached is True


@pytest.mark.parametrize(
    "other",
    [request(task="u"), request("class ModelNew: pass"), request(seed=7), request(correctness_trials=2),
     EvalRequest("class Model: pass", "class ModelNew: ...", EvalOptions(device="cpu"), "t")],
    ids=["task", "candidate", "seed", "trials", "reference"],
)
def test_a_cached_result_never_crosses_tasks_options_or_code(other: EvalRequest) -> None:
    backend, cache = FakeBackend(), ResultCache("cpu")
    cache.submit(request(), backend.run)
    backend.runs[0][1].set_result(verdict())
    assert cache_key(other, "cpu") != cache_key(request(), "cpu")
    future = cache.submit(other, backend.run)
    assert len(backend.runs) == 2 and not future.done() and cache.hits == 0


def test_the_device_type_is_part_of_the_key_and_auto_is_resolved() -> None:
    assert cache_key(request(device="auto"), "cpu") == cache_key(request(device="cpu"), "cpu")
    assert cache_key(request(), "cuda") != cache_key(request(), "cpu")


def test_concurrent_duplicates_share_one_evaluation() -> None:
    backend, cache = FakeBackend(), ResultCache("cpu")
    futures = [cache.submit(request(), backend.run) for _ in range(5)]
    assert len(backend.runs) == 1 and not any(f.done() for f in futures)
    backend.runs[0][1].set_result(verdict())
    assert [f.result().cached for f in futures] == [False, True, True, True, True]
    assert len({f.result().speedup for f in futures}) == 1


@pytest.mark.parametrize(
    "result",
    [verdict(Status.TIMEOUT, "Timeout"), verdict(Status.CRASHED, "Signal"), verdict(Status.CRASHED, "WorkerLost"),
     verdict(Status.INVALID, "SandboxError")],
    ids=["timeout", "crash", "lost-worker", "sandbox"],
)
def test_verdicts_that_may_not_reproduce_are_not_shared(result: EvalResult) -> None:
    backend, cache = FakeBackend(), ResultCache("cpu")
    first, waiting = cache.submit(request(), backend.run), cache.submit(request(), backend.run)
    backend.runs[0][1].set_result(result)
    assert first.result() is result
    assert len(backend.runs) == 2 and not waiting.done()  # the waiting duplicate runs for itself
    backend.runs[1][1].set_result(verdict())
    assert waiting.result().cached is False and waiting.result().status == "correct"
    later = cache.submit(request(), backend.run)
    assert later.result().cached is True and len(backend.runs) == 2


def test_cached_statuses() -> None:
    backend, cache = FakeBackend(), ResultCache("cpu")
    for i, status in enumerate([Status.CORRECT, Status.INCORRECT, Status.HACKED, Status.COMPILE_ERROR,
                                Status.RUNTIME_ERROR, Status.INVALID]):
        cache.submit(request(str(i)), backend.run)
        backend.runs[-1][1].set_result(verdict(status))
        assert cache.submit(request(str(i)), backend.run).result().cached is True
    assert len(backend.runs) == 6


def test_least_recently_used_entries_go_first() -> None:
    backend, cache = FakeBackend(), ResultCache("cpu", entries=2)
    for name in ("a", "b"):
        cache.submit(request(name), backend.run)
        backend.runs[-1][1].set_result(verdict())
    cache.submit(request("a"), backend.run)  # "a" used again: "b" is now the oldest
    cache.submit(request("c"), backend.run)
    backend.runs[-1][1].set_result(verdict())
    assert cache.submit(request("a"), backend.run).done()
    assert not cache.submit(request("b"), backend.run).done() and len(backend.runs) == 4


def test_a_cancelled_evaluation_cancels_its_waiting_duplicates() -> None:
    backend, cache = FakeBackend(), ResultCache("cpu")
    cache.submit(request(), backend.run)
    waiting = cache.submit(request(), backend.run)
    backend.runs[0][1].cancel()
    assert waiting.cancelled()
    assert not cache.submit(request(), backend.run).done() and len(backend.runs) == 2


def test_many_threads_submitting_the_same_request_run_it_once() -> None:
    backend, cache = FakeBackend(), ResultCache("cpu")
    futures: list[Future[EvalResult]] = []
    lock = threading.Lock()

    def submit() -> None:
        future = cache.submit(request(), backend.run)
        with lock:
            futures.append(future)

    threads = [threading.Thread(target=submit) for _ in range(16)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert len(backend.runs) == 1
    backend.runs[0][1].set_result(verdict())
    assert sorted(f.result().cached for f in futures) == [False] + [True] * 15


def test_bad_sizes_are_refused() -> None:
    with pytest.raises(ValueError, match="at least one"):
        ResultCache("cpu", entries=0)
    with pytest.raises(ValueError, match="cache_entries"):
        Scheduler(device="cpu", workers=1, cache_entries=-1)


@pytest.mark.slow
@pytest.mark.parametrize("cache_entries", [64, 0], ids=["cache", "no-cache"])
def test_the_scheduler_judges_duplicates_once(cache_entries: int) -> None:
    """Real evaluations: a batch with duplicates (in it and across batches) runs each distinct request once."""
    correct, _ = example("2_relu", "2_relu__triton")
    wrong, _ = example("2_relu", "2_relu__wrong")
    with Scheduler(device="cpu", workers=1, cache_entries=cache_entries) as scheduler:
        batch = scheduler.evaluate_many([correct, wrong, correct, correct, wrong])
        again = scheduler.evaluate_many([correct])
        completed = scheduler.workers()[0]["completed"]
    assert [r.status for r in batch + again] == ["correct", "incorrect", "correct", "correct", "incorrect", "correct"]
    if cache_entries:
        assert completed == 2
        assert [r.cached for r in batch + again] == [False, False, True, True, True, True]
        for twin, copy in ((batch[0], batch[2]), (batch[1], batch[4]), (batch[0], again[0])):
            assert {**copy.to_dict(), "cached": False} == twin.to_dict()
    else:
        assert completed == 6 and not any(r.cached for r in batch + again)
