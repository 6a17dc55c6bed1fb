"""The subject's two threads: the harness's, which alone holds the channel to the judge, and the candidate's, which
runs the harness's handlers and every line of candidate code, under a system-call filter that keeps it (and every
thread it starts) off the channel's descriptor (drkernel.sandbox.seccomp.channel_filter).

Why two: a candidate that finds the channel (`os.fstat` over descriptor numbers is enough) could otherwise read the
judge's requests and answer them itself, claiming launches, ablations, profiles and timings it never made. The
harness's thread never runs candidate code: the cyclic garbage collector, which runs finalizers on whichever thread
it interrupts, is driven from the candidate's thread only (`CandidateThread.collect`).
"""

from __future__ import annotations

import _thread
import fcntl
import gc
import os
import queue
import resource
import socket
from typing import Any, Callable

from drkernel.sandbox import audit, seccomp
from drkernel.sandbox.channel import Channel
from drkernel.schema import ErrorKind, Status

TELL, ASK, REPLY = "tell", "ask", "reply"  # a message to the judge: no answer awaited, one awaited, the request's end
HIGHEST_CHANNEL_FD = 4095
Handler = Callable[[dict[str, Any], list[bytearray]], tuple[dict[str, Any], list[bytes]]]


def _tell(header: dict[str, Any]) -> None:
    """A message to the judge in the middle of a request; returns once it is sent (this thread waits, so the
    harness's takes the interpreter at once: a timed call's end reaches the judge's clock without delay)."""
    to_judge, to_worker = "drkernel.audit.sealed"  # audit.SEALED, a constant of the code  # type: ignore[misc]
    to_judge.put(("tell", header, []))  # TELL: a sealed function has no globals
    to_worker.get()


def _ask(header: dict[str, Any]) -> tuple[dict[str, Any], list[bytearray]]:
    """A message to the judge, and the judge's answer to it."""
    to_judge, to_worker = "drkernel.audit.sealed"  # type: ignore[misc]
    to_judge.put(("ask", header, []))  # ASK
    return to_worker.get()


def channel_out_of_the_way(sock: socket.socket) -> socket.socket:
    """The channel moved to the highest descriptor the process may hold: a filter names it by number, and processes
    the candidate's thread starts (Triton's compiler, which inherits the filter) open files from the lowest free
    number up, so theirs never meet it."""
    soft = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
    target = HIGHEST_CHANNEL_FD if soft == resource.RLIM_INFINITY else min(soft - 1, HIGHEST_CHANNEL_FD)
    for number in range(target, 2, -1):
        try:
            os.fstat(number)
        except OSError:
            break
    else:
        raise OSError("no free descriptor for the channel")
    moved = fcntl.fcntl(sock.fileno(), fcntl.F_DUPFD_CLOEXEC, number)
    sock.close()
    return socket.socket(fileno=moved)


class CandidateThread:
    """Runs each request's handler on the candidate's thread and relays what it says to the judge.

    `serve` binds the handler and both queues, before any candidate code runs, where candidate code cannot reach
    them: in the frames of the two threads' loops and in the code of `tell` and `ask` (`audit.sealed`). Read off this
    object, a candidate that reached it could swap the handler (and edit every reply) or put replies of its own on
    the queue to the judge."""

    def __init__(self, conn: Channel, handle: Handler) -> None:
        self.conn, self.handle = conn, handle
        self.filtered = ""  # why the candidate's thread is not filtered ("" when it is)
        audit.pin_methods(self)  # as its class is now: a method swapped on the class later does not reach it

    def serve(self) -> None:
        """The harness's thread: receive a request, relay the handler's messages, until `finish` is answered."""
        gc.disable()  # collections run on the candidate's thread (`collect`), never here
        conn, handle = self.conn, self.handle
        to_worker: queue.SimpleQueue[Any] = queue.SimpleQueue()
        to_judge: queue.SimpleQueue[Any] = queue.SimpleQueue()
        self.tell = audit.sealed(_tell, (to_judge, to_worker), "tell")
        self.ask = audit.sealed(_ask, (to_judge, to_worker), "ask")
        # no threading.Thread: nothing in `threading` leads to it
        _thread.start_new_thread(self._work, (handle, to_worker, to_judge))
        while True:
            request = conn.receive()
            to_worker.put(request)
            while True:
                kind, header, payloads = to_judge.get()
                conn.send(header, payloads)
                if kind == REPLY:
                    break
                to_worker.put(conn.receive() if kind == ASK else None)
            if request[0].get("op") == "finish":
                return

    def _work(self, handle: Handler, to_worker: Any, to_judge: Any) -> None:
        try:
            seccomp.install(seccomp.channel_filter([self.conn.fileno()]))
        except OSError as exc:
            self.filtered = f"unavailable: {exc}"
        while True:
            header, payloads = to_worker.get()
            try:
                reply, reply_payloads = handle(header, payloads)
            except BaseException as exc:  # the handler answers failures itself; this is the harness's own
                reply, reply_payloads = {"failure": {"status": Status.CRASHED.value,
                                                     "kind": ErrorKind.SANDBOX_ERROR.value,
                                                     "message": f"the subject's handler failed: {exc!r}",
                                                     "traceback": ""}}, []
            to_judge.put((REPLY, reply, reply_payloads))
            if header.get("op") == "finish":
                return

    @staticmethod
    def collect() -> None:
        """The collection the interpreter would have made by now (its thresholds), on this thread, between requests:
        automatic collection is off in this process (`serve`), so cyclic garbage made inside one request waits for
        the next."""
        counts, thresholds = gc.get_count(), gc.get_threshold()
        for generation in (2, 1, 0):
            if counts[generation] > thresholds[generation]:
                gc.collect(generation)
                return
