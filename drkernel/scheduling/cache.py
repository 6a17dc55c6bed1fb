"""Identical requests judged once: the one cache key, which verdicts may be shared, and an in-memory LRU.

RL batches repeat themselves (a converged policy samples the same completion many times), and a verdict depends only
on what the key covers: both sources, the full options, the task name and the device type. The embedded scheduler
keeps the last `entries` shareable verdicts in memory (`ResultCache`); the service keeps them in its SQLite store
under the same key (drkernel.service.store). A concurrent duplicate waits for its twin's evaluation instead of
running beside it. A shared result says so: `EvalResult.cached` is True on every copy but the one that ran.
"""

from __future__ import annotations

import collections
import dataclasses
import hashlib
import json
import threading
from concurrent.futures import Future
from typing import Callable

from drkernel.schema import EvalRequest, EvalResult, HackReason, Status

DEFAULT_ENTRIES = 4096  # results are a few kB each: a few tens of MB at most

# Verdicts a rerun reproduces: they depend only on the sources, the options and the device type.
# TIMEOUT and CRASHED are left out: they mix the candidate's behaviour with the machine's state (load, memory
# caps, a killed worker), so a rerun may well end differently.
REPRODUCIBLE_STATUSES = frozenset(
    {Status.CORRECT, Status.INCORRECT, Status.HACKED, Status.COMPILE_ERROR, Status.RUNTIME_ERROR, Status.INVALID}
)
# Hack reasons read from timing noise (drkernel.sandbox.guards SIDE_STREAM, IMPOSSIBLE_SPEED): not reproducible.
TIMING_HACK_REASONS = frozenset({HackReason.SIDE_STREAM.value, HackReason.IMPOSSIBLE_SPEED.value})


def blames_harness(result: EvalResult) -> bool:
    """The harness failed, not the candidate (schema.HARNESS_ERRORS: the scheduler's lost worker, the evaluation's
    set-up, a backend that raised): the verdict says nothing about the kernel."""
    return result.error is not None and result.error.blames_harness


def cacheable(result: EvalResult) -> bool:
    """Whether a rerun of the same request on the same device type would give the same verdict."""
    return (
        result.status in REPRODUCIBLE_STATUSES
        and not blames_harness(result)
        and not TIMING_HACK_REASONS.intersection(result.hack_reasons)
    )


def cache_key(request: EvalRequest, device: str) -> str:
    """sha256 of what decides a verdict and whom it is for: both sources, the options, the task name and the
    device type that runs them.

    The options' `device` is replaced by the resolved device, so "auto" and "cpu" on a CPU machine share entries.
    The task name changes nothing in an evaluation, but a result is never handed across tasks (their records and
    the signals computed from them stay the task's own).
    """
    options = {**request.options.to_dict(), "device": device}
    payload = json.dumps(
        {"reference": request.reference, "candidate": request.candidate, "options": options, "device": device,
         "task_name": request.task_name},
        sort_keys=True,
    )
    return hashlib.sha256(payload.encode()).hexdigest()


def as_cached(result: EvalResult) -> EvalResult:
    """A copy of `result` marked as shared (a copy: a consumer that edits its result edits no one else's)."""
    return dataclasses.replace(EvalResult.from_dict(result.to_dict()), cached=True)


class ResultCache:
    """Shareable verdicts by key (least recently used dropped beyond `entries`) and evaluations under way.

    `submit(request, run)` answers from the cache, or joins the evaluation of an identical request under way, or
    starts one with `run`. A joined evaluation that ends with an unshareable verdict (a timeout, a crash) says
    nothing about the candidate: each waiting duplicate then runs for itself.
    """

    def __init__(self, device: str, entries: int = DEFAULT_ENTRIES) -> None:
        if entries < 1:
            raise ValueError("a result cache needs at least one entry")
        self.device = device
        self.entries = entries
        self.hits = 0
        self._results: collections.OrderedDict[str, EvalResult] = collections.OrderedDict()
        self._running: dict[str, Future[EvalResult]] = {}
        self._lock = threading.RLock()  # a backend may complete a future inside `run`

    def submit(self, request: EvalRequest, run: Callable[[EvalRequest], Future[EvalResult]]) -> Future[EvalResult]:
        key = cache_key(request, self.device)
        with self._lock:
            hit = self._results.get(key)
            if hit is not None:
                self._results.move_to_end(key)
                self.hits += 1
                future: Future[EvalResult] = Future()
                future.set_result(as_cached(hit))
                return future
            twin = self._running.get(key)
            if twin is None:
                future = run(request)  # raises when the backend is closed: nothing recorded then
                self._running[key] = future
                future.add_done_callback(lambda f: self._settle(key, f))
                return future
        follower: Future[EvalResult] = Future()
        twin.add_done_callback(lambda f: self._follow(request, run, f, follower))
        return follower

    def _settle(self, key: str, future: Future[EvalResult]) -> None:
        with self._lock:
            if self._running.get(key) is future:
                del self._running[key]
            if future.cancelled() or future.exception() is not None or not cacheable(future.result()):
                return
            self._results[key] = future.result()
            self._results.move_to_end(key)
            while len(self._results) > self.entries:
                self._results.popitem(last=False)

    def _follow(self, request: EvalRequest, run: Callable[[EvalRequest], Future[EvalResult]],
                twin: Future[EvalResult], follower: Future[EvalResult]) -> None:
        """The twin is done: share its verdict, or run the duplicate itself when the verdict is not shareable."""
        if follower.cancelled():
            return
        if twin.cancelled():
            follower.cancel()
            return
        error = twin.exception()
        if error is None and cacheable(twin.result()):
            with self._lock:
                self.hits += 1
            follower.set_result(as_cached(twin.result()))
            return
        try:
            own = self.submit(request, run)
        except RuntimeError:  # the backend closed meanwhile
            follower.cancel()
            return
        own.add_done_callback(lambda f: _copy_outcome(f, follower))


def _copy_outcome(source: Future[EvalResult], target: Future[EvalResult]) -> None:
    if target.done():
        return
    if source.cancelled():
        target.cancel()
    elif source.exception() is not None:
        target.set_exception(source.exception())  # type: ignore[arg-type]
    else:
        target.set_result(source.result())
