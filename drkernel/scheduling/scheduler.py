"""The embedded scheduler: a queue in front of one worker process per GPU (or N CPU workers).

Workers start with the scheduler, so their start-up (Python, the fork server's imports) is paid before the first
job rather than by it (`wait_ready`). Each worker holds the next jobs, whose processes start while the first ones
run (two prepared beyond those running: CUDA start-up takes seconds); on a GPU three run at once, their
loading, compilation and correctness checks overlapping, while the device gate gives each one's timing and profiling
the GPU alone (timings stay clean; `overlap=1` runs one at a time). A worker that dies (killed, crashed outside any evaluation) takes nothing with it: its jobs go
back to the front of the queue and run again, up to `max_attempts`. A candidate's own failure is a result, never
retried. No server, no ports, no extra processes beyond the workers. Identical requests are judged once
(drkernel.scheduling.cache): a duplicate gets the earlier verdict, marked `cached`, or waits for its twin's run.
"""

from __future__ import annotations

import collections
import itertools
import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import IO, Callable, Iterable, Iterator, Protocol

from drkernel.runner.devices import discover_gpus, resolve_device
from drkernel.runner.supervisor import GPU_OVERLAP, memory_share_mb
from drkernel.scheduling.cache import DEFAULT_ENTRIES, ResultCache, blames_harness
from drkernel.schema import ErrorInfo, ErrorKind, EvalRequest, EvalResult, Status

PREPARED_AHEAD = 2  # jobs forked and starting up per worker beyond those running (CUDA start-up takes seconds)
JOBS_PER_WORKER = GPU_OVERLAP + PREPARED_AHEAD
START_ALLOWANCE_S = 120.0  # beyond a job's own timeout: process start, CUDA initialisation, the job before it


class Backend(Protocol):
    """What the CLI and the service need from an evaluation engine (embedded or Ray)."""

    def submit(self, request: EvalRequest) -> Future[EvalResult]: ...

    def workers(self) -> list[dict[str, object]]: ...

    def close(self) -> None: ...


@dataclass
class _Job:
    id: str
    request: EvalRequest
    future: Future[EvalResult]
    attempts: int = 0
    process: subprocess.Popen[bytes] | None = None  # the worker it was last sent to


@dataclass
class _Slot:
    name: str
    device: str
    gpu: str | None
    process: subprocess.Popen[bytes] | None = None
    inflight: dict[str, _Job] = field(default_factory=dict)  # insertion order: the first one runs
    head_since: float = 0.0
    completed: int = 0
    restarts: int = -1
    ready: threading.Event = field(default_factory=threading.Event)  # its worker's supervisor has started


class Scheduler:
    def __init__(
        self, device: str = "auto", workers: int | None = None, max_attempts: int = 3, overlap: int | None = None,
        cache_entries: int = DEFAULT_ENTRIES, judge_hosts: bool = True,
    ) -> None:
        """`cache_entries`: verdicts kept for identical requests (least recently used dropped); 0 switches the
        cache off, every request then runs. `judge_hosts`: each evaluation slot's judge outlives its evaluations
        (drkernel.sandbox.judge_host): one process started per evaluation instead of two; False: a judge process
        per evaluation."""
        self.device = resolve_device(device)
        if cache_entries < 0:
            raise ValueError("cache_entries must be >= 0 (0 switches the result cache off)")
        self.cache = ResultCache(self.device, cache_entries) if cache_entries else None
        self.max_attempts = max_attempts
        self.overlap = overlap  # evaluations running at once per worker (drkernel.runner.supervisor.DeviceQueue)
        self.judge_hosts = judge_hosts
        self.jobs_per_worker = JOBS_PER_WORKER if overlap is None else overlap + PREPARED_AHEAD
        if self.device == "cuda":
            gpus = discover_gpus()
            slots = [_Slot(f"gpu{g}", "cuda", g) for g in gpus[: workers or len(gpus)]]
        else:
            count = workers or max(1, (os.cpu_count() or 2) // 2)
            slots = [_Slot(f"cpu{i}", "cpu", None) for i in range(count)]
        self._slots = slots
        self._queue: collections.deque[_Job] = collections.deque()
        self._cond = threading.Condition()
        self._ids = itertools.count()
        self._closed = False
        self._log_dir = tempfile.mkdtemp(prefix="drkernel-workers-")
        for slot in slots:
            self._start_worker(slot)
        self._threads = [threading.Thread(target=self._feed, args=(s,), daemon=True, name=f"drkernel-{s.name}")
                         for s in slots]
        for thread in self._threads:
            thread.start()

    # Public ------------------------------------------------------------------------------------------------

    def submit(self, request: EvalRequest) -> Future[EvalResult]:
        if self.cache is not None:
            return self.cache.submit(request, self._enqueue)
        return self._enqueue(request)

    def _enqueue(self, request: EvalRequest) -> Future[EvalResult]:
        """Queue the request for a worker, whatever the cache holds."""
        future: Future[EvalResult] = Future()
        with self._cond:
            if self._closed:
                raise RuntimeError("the scheduler is closed")
            self._queue.append(_Job(f"j{next(self._ids)}", request, future))
            self._cond.notify_all()
        return future

    def evaluate_many(
        self, requests: Iterable[EvalRequest], on_result: Callable[[int, EvalResult], None] | None = None
    ) -> list[EvalResult]:
        """Evaluate all requests; results come back in the order given, `on_result` sees them as they finish."""
        futures = [self.submit(r) for r in requests]
        if on_result is not None:
            index = {id(f): i for i, f in enumerate(futures)}
            lock = threading.Lock()

            def report(f: Future[EvalResult]) -> None:
                with lock:
                    on_result(index[id(f)], f.result())

            for f in futures:
                f.add_done_callback(report)
        return [f.result() for f in futures]

    def workers(self) -> list[dict[str, object]]:
        with self._cond:
            return [
                {
                    "name": s.name,
                    "device": s.device,
                    "gpu": s.gpu,
                    "pid": s.process.pid if s.process and s.process.poll() is None else None,
                    "busy": bool(s.inflight),
                    "inflight": len(s.inflight),
                    "completed": s.completed,
                    "restarts": max(s.restarts, 0),
                }
                for s in self._slots
            ]

    def wait_ready(self, timeout: float | None = None) -> bool:
        """Wait until every worker's start-up is over (its fork server up, or the worker gone: the next job starts
        another); False if one's was not within `timeout`."""
        deadline = None if timeout is None else time.monotonic() + timeout
        for slot in self._slots:
            left = None if deadline is None else max(deadline - time.monotonic(), 0.0)
            if not slot.ready.wait(left):
                return False
        return True

    @property
    def queued(self) -> int:
        with self._cond:
            return len(self._queue)

    def close(self) -> None:
        with self._cond:
            self._closed = True
            pending = list(self._queue)
            self._queue.clear()
            self._cond.notify_all()
        for job in pending:
            job.future.cancel()
        for slot in self._slots:
            if slot.process is not None and slot.process.poll() is None:
                assert slot.process.stdin is not None
                slot.process.stdin.close()
                with self._cond:  # no job reaches a worker once closed
                    idle = not slot.inflight
                if idle and not slot.ready.is_set():  # still starting, nothing to finish: no need to wait for it
                    slot.process.terminate()
                try:
                    slot.process.wait(10)
                except subprocess.TimeoutExpired:
                    slot.process.kill()
        for thread in self._threads:
            thread.join(timeout=10)
        shutil.rmtree(self._log_dir, ignore_errors=True)

    def __enter__(self) -> Scheduler:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # Worker management -------------------------------------------------------------------------------------

    def _start_worker(self, slot: _Slot) -> subprocess.Popen[bytes]:
        # jobs_per_worker evaluation processes per worker may be alive at once: the machine's memory is shared.
        cap = memory_share_mb(self.jobs_per_worker * len(self._slots))
        command = [sys.executable, "-m", "drkernel.scheduling.worker", "--device", slot.device,
                   "--memory-cap-mb", str(cap)]
        if slot.gpu is not None:
            command += ["--gpu", slot.gpu]
        if self.overlap is not None:
            command += ["--overlap", str(self.overlap)]
        command.append("--judge-hosts" if self.judge_hosts else "--no-judge-hosts")
        log = open(os.path.join(self._log_dir, f"{slot.name}.log"), "ab")
        process = subprocess.Popen(command, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=log)
        log.close()
        slot.process, slot.restarts = process, slot.restarts + 1
        slot.ready = threading.Event()
        threading.Thread(target=self._read, args=(slot, process, slot.ready), daemon=True).start()
        return process

    def _feed(self, slot: _Slot) -> None:
        """Keep the slot's worker supplied with up to jobs_per_worker jobs; kill it if its head job hangs."""
        while True:
            with self._cond:
                while not self._closed and not (self._queue and len(slot.inflight) < self.jobs_per_worker):
                    self._cond.wait(timeout=1.0)
                    self._check_hung(slot)
                if self._closed:
                    return
                job = self._queue.popleft()
                if job.future.cancelled():
                    continue
                if slot.process is None or slot.process.poll() is not None:
                    self._start_worker(slot)
                if not slot.inflight:
                    slot.head_since = time.monotonic()
                slot.inflight[job.id] = job
                job.attempts += 1
                process = job.process = slot.process
            assert process is not None and process.stdin is not None
            try:
                process.stdin.write((json.dumps({"job": job.id, "request": job.request.to_dict()}) + "\n").encode())
                process.stdin.flush()
            except OSError:
                pass  # the reader sees the worker's end and requeues its jobs

    def _check_hung(self, slot: _Slot) -> None:
        if not slot.inflight or slot.process is None:
            return
        head = next(iter(slot.inflight.values()))
        if time.monotonic() - slot.head_since > head.request.options.timeout_s + START_ALLOWANCE_S:
            slot.process.kill()

    def _read(self, slot: _Slot, process: subprocess.Popen[bytes], ready: threading.Event) -> None:
        assert process.stdout is not None
        for line in _lines(process.stdout):
            message = json.loads(line)
            if "ready" in message:
                ready.set()
                continue
            result = EvalResult.from_dict(message["result"])
            with self._cond:
                job = slot.inflight.pop(message["job"], None)
                slot.completed += 1
                slot.head_since = time.monotonic()
                again = job is not None and blames_harness(result) and job.attempts < self.max_attempts
                if again:  # the harness failed, not the candidate: the job runs again, first in line
                    self._queue.appendleft(job)  # type: ignore[arg-type]
                self._cond.notify_all()
            if job is not None and not again and not job.future.done():
                job.future.set_result(result)
        process.wait()
        ready.set()  # nobody waits for a start-up that will not come
        with self._cond:  # the worker is gone: its jobs go back to the front of the queue
            orphans = [job for job in slot.inflight.values() if job.process is process]
            for job in orphans:
                del slot.inflight[job.id]
            retry = [j for j in orphans if j.attempts < self.max_attempts]
            self._queue.extendleft(reversed(retry))
            self._cond.notify_all()
        for job in orphans:
            if job not in retry and not job.future.done():
                job.future.set_result(_worker_lost(job, process.returncode))


def _lines(stream: IO[bytes]) -> Iterator[bytes]:
    for line in stream:
        if line.strip():
            yield line


def _worker_lost(job: _Job, returncode: int | None) -> EvalResult:
    return EvalResult(
        status=Status.CRASHED,
        error=ErrorInfo(
            kind=ErrorKind.WORKER_LOST,
            message=f"the worker process died {job.attempts} time(s) while holding this evaluation "
                    f"(last exit code {returncode}); given up",
        ),
    )
