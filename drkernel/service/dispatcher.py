"""Move work between the store and a backend, and wake whoever waits for a result.

The server process owns one `Dispatcher`: a submission is committed to the store first, then queued here; one
thread hands queued rows to the backend, a few per worker at a time (the rest wait in the store, where a restart
finds them), and writes each result as its future completes. Everything the thread owns (the pending queue, what is
running, duplicates parked behind their twin) changes only on that thread, fed by one event queue, so there are no
locks to get wrong and no callback ever runs store writes on a backend's thread.

Duplicates: a request whose cache key already has a reproducible verdict is answered from the store; one whose
twin is running waits for it (parked) and shares its verdict when it is reproducible, or runs itself when not.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import logging
import queue
import threading
import time
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Iterator

from drkernel.scheduling.cache import cache_key, cacheable
from drkernel.scheduling.scheduler import JOBS_PER_WORKER, Backend
from drkernel.schema import ErrorKind, EvalRequest, EvalResult, Status
from drkernel.service.store import Record, Store

log = logging.getLogger(__name__)

PURGE_INTERVAL_S = 3600.0
RECHECK_S = 60.0  # a waiter rereads its row at least this often, whatever happens to its wake-up


class Waiters:
    """Async waiters (long-polls) for rows, woken from any thread when a row is done."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._events: dict[str, list[tuple[asyncio.AbstractEventLoop, asyncio.Event]]] = collections.defaultdict(list)

    @contextlib.contextmanager
    def watch(self, id: str) -> Iterator[asyncio.Event]:
        """Register before reading the row, so a result written in between still sets the event."""
        entry = (asyncio.get_running_loop(), asyncio.Event())
        with self._lock:
            self._events[id].append(entry)
        try:
            yield entry[1]
        finally:
            with self._lock:
                self._events[id].remove(entry)
                if not self._events[id]:
                    del self._events[id]

    def notify(self, ids: list[str]) -> None:
        with self._lock:
            entries = [e for id in ids for e in self._events.get(id, ())]
        for loop, event in entries:
            with contextlib.suppress(RuntimeError):  # that loop has closed: nobody waits any more
                loop.call_soon_threadsafe(event.set)


@dataclass
class Metrics:
    """Counters since this process started (Prometheus counters may reset on restart, never go down)."""

    by_status: collections.Counter[str] = field(default_factory=collections.Counter)
    duration_sum_s: float = 0.0
    duration_count: int = 0
    cache_hits: int = 0
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def record(self, result: EvalResult, rows: int, ran: bool) -> None:
        """`rows` rows got `result`; one of them ran it when `ran`, the others were cache hits."""
        with self._lock:
            self.by_status[result.status] += rows
            self.cache_hits += rows - ran
            if ran and result.duration_s is not None:
                self.duration_sum_s += result.duration_s
                self.duration_count += 1

    def snapshot(self) -> Metrics:
        """A consistent copy, safe to read while the dispatcher keeps counting."""
        with self._lock:
            return Metrics(collections.Counter(self.by_status), self.duration_sum_s, self.duration_count,
                           self.cache_hits)


class Dispatcher:
    def __init__(self, store: Store, backend: Backend, device: str, retention_s: float | None = None) -> None:
        self.store, self.backend, self.device = store, backend, device
        self.retention_s = retention_s
        self.waiters = Waiters()
        self.metrics = Metrics()
        # As many per worker as the embedded scheduler keeps in flight: the running job and those being prepared.
        self._window = JOBS_PER_WORKER * max(1, len(backend.workers()))
        self._events: queue.Queue[tuple] = queue.Queue()
        self._pending: collections.deque[tuple[str, str]] = collections.deque()  # (id, key), oldest first
        self._running: dict[str, str] = {}  # key -> id handed to the backend
        self._parked: dict[str, list[str]] = collections.defaultdict(list)  # key -> ids waiting for that run
        self._stopping = False
        self._thread = threading.Thread(target=self._loop, daemon=True, name="drkernel-dispatcher")

    # Public ------------------------------------------------------------------------------------------------

    def start(self) -> None:
        """Resume every queued or running row left by an earlier process, then start dispatching."""
        self._events.put(("new", self.store.unfinished()))
        self._thread.start()

    def submit(self, requests: list[EvalRequest], client: str = "") -> list[str]:
        """Store `client`'s requests (committed when this returns) and queue those the cache did not answer."""
        rows = self.store.add(((r, cache_key(r, self.device)) for r in requests), client)
        for row in rows:
            if row.result is not None:
                self.metrics.record(row.result, 1, ran=False)
        self.waiters.notify([row.id for row in rows if row.result is not None])
        self._events.put(("new", [(row.id, row.key) for row in rows if row.result is None]))
        return [row.id for row in rows]

    async def wait(self, id: str, timeout: float | None) -> Record | None:
        """The row once done, or as it stands after `timeout` seconds (None: until done); None for unknown ids."""
        deadline = None if timeout is None else time.monotonic() + timeout
        with self.waiters.watch(id) as event:
            record = await asyncio.to_thread(self.store.get, id)
            while record is not None and record.state != "done":
                left = RECHECK_S if deadline is None else min(RECHECK_S, deadline - time.monotonic())
                if left <= 0:
                    break
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(event.wait(), left)
                event.clear()
                record = await asyncio.to_thread(self.store.get, id)
        return record

    def close(self) -> None:
        """Stop handing out work, let the backend finish (results still get written), then close the store."""
        self._stopping = True
        self.backend.close()
        self._events.put(("exit",))
        self._thread.join(timeout=60)
        self.store.close()

    # The dispatcher thread ---------------------------------------------------------------------------------

    def _loop(self) -> None:
        next_purge = time.monotonic()
        while True:
            try:
                event: tuple | None = self._events.get(timeout=PURGE_INTERVAL_S)
            except queue.Empty:
                event = None
            if event is not None and event[0] == "exit":
                return
            try:
                if event is not None:
                    self._handle(event)
                if self._events.empty():  # take in every event waiting before handing out more work
                    self._pump()
                if self.retention_s is not None and time.monotonic() >= next_purge:
                    next_purge = time.monotonic() + PURGE_INTERVAL_S
                    log.info("retention: deleted %d done evaluations", self.store.purge(self.retention_s))
            except Exception:  # a store failure must not stop the service; the row is retried after a restart
                log.exception("dispatcher: could not handle %s", event[0] if event is not None else "retention")

    def _handle(self, event: tuple) -> None:
        if event[0] == "new":
            self._pending.extend(event[1])
        else:
            self._complete(*event[1:])

    def _pump(self) -> None:
        """Hand pending rows to the backend while it has room; answer or park duplicates on the way."""
        while self._pending and not self._stopping and len(self._running) < self._window:
            id, key = self._pending.popleft()
            if key in self._running:
                self._parked[key].append(id)
                continue
            hit = self.store.cached(key)
            if hit is not None:
                self._write([id], hit, ran=False)
                continue
            self.store.mark_running(id)
            future = self.backend.submit(self.store.request(id))
            self._running[key] = id
            future.add_done_callback(lambda f, id=id, key=key: self._events.put(("done", id, key, f)))

    def _complete(self, id: str, key: str, future: Future[EvalResult]) -> None:
        del self._running[key]
        followers = self._parked.pop(key, [])
        if future.cancelled():  # the backend is closing: the rows stay unfinished for the next start
            return
        result = _outcome(future)
        if cacheable(result):
            self._write([id, *followers], result, ran=True)
        else:
            self._write([id], result, ran=True)
            self._pending.extendleft(reversed([(f, key) for f in followers]))  # each runs for itself

    def _write(self, ids: list[str], result: EvalResult, ran: bool) -> None:
        written = self.store.finish(ids, result)
        self.metrics.record(result, len(written), ran=ran and ids[0] in written)
        self.waiters.notify(written)


def _outcome(future: Future[EvalResult]) -> EvalResult:
    """The future's result; a backend that raised is an infrastructure failure, never the candidate's."""
    error = future.exception()
    if error is None:
        return future.result()
    return EvalResult.failed(Status.CRASHED, ErrorKind.BACKEND_ERROR, f"the evaluation backend failed: {error!r}")
