"""The per-GPU gate between evaluation processes: several may load, compile and check correctness at once, but
timing and profiling have the GPU to themselves.

A reader-writer lock over two files, with `fcntl.flock` (released by the kernel if the process dies): phases that
only need the GPU to be shared (correctness trials, building models, ablation) hold the lock file shared; timing
and profiling hold it exclusively. A turnstile file taken exclusively before either makes the lock writer-preferring:
once a timing phase waits, no new shared phase starts, so a stream of correctness trials cannot starve it. While a
judge waits, it says so (`on_wait`, reported to the supervisor on its own pipe): the supervisor does not count that
time against the evaluation's deadline (an evaluation is not late because others were using the GPU).

Triton compiles a candidate's kernels on the CPU at their first launch, inside a correctness trial. A yielding holder
lets the lock go for the compilation (`pause`, after the work already queued is done), so another evaluation's
timing can run meanwhile, and takes it again before the kernel launches (`resume`).

An evaluation whose trials need a large part of the GPU's memory (`large`) shares the GPU with others' ordinary
checks, and keeps its hold while it compiles: its memory then never meets a timing's (out-of-memory failures measured
on an H100). Large evaluations take slots (LARGE_SLOTS files, held exclusively): one whose phase fits within a pair's
share of the memory (the judge's estimate) takes one and checks beside one other such; any other takes them all. A
turnstile before the slots keeps their order: one that waits for every slot is not passed by those that need one.

Each gate keeps account (`spent`) of the seconds its holder waited for the GPU, held it alone, held it as the one
large evaluation (`large`) or as one of a pair (`paired`): the phases others must wait for, from which a run's rate
is bounded.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Callable, Iterator

GATE_FILE = "gate"  # in an evaluation's working directory: the path of its GPU's lock file, written by the supervisor
LARGE_SLOTS = 2  # large evaluations that may check correctness at once, when each fits within a pair's share
SLOT_POLL_S = 0.01  # how often one waiting for any free slot looks again (flock cannot wait for one of several)


class DeviceGate:
    def __init__(self, lock_path: str | Path, on_wait: Callable[[bool], None] | None = None) -> None:
        self.path = Path(lock_path)
        self._lock = os.open(lock_path, os.O_RDWR | os.O_CREAT, 0o600)
        self._turnstile = os.open(f"{lock_path}.turnstile", os.O_RDWR | os.O_CREAT, 0o600)
        self._slots = [os.open(f"{lock_path}.large{i}", os.O_RDWR | os.O_CREAT, 0o600) for i in range(LARGE_SLOTS)]
        self._slot_turnstile = os.open(f"{lock_path}.large-turnstile", os.O_RDWR | os.O_CREAT, 0o600)
        self._on_wait = on_wait  # told True when a wait for the lock begins, False when it ends
        self._yielding: int | None = None  # the mode of a hold that is let go while Triton compiles
        self._compiling = False
        # Seconds blocked at the gate, holding it exclusively, holding every large slot, holding one of them (shared
        # holds overlap others', and a paired one may overlap one other's).
        self.spent = {"wait": 0.0, "alone": 0.0, "large": 0.0, "paired": 0.0}

    @classmethod
    def for_workdir(cls, workdir: Path, on_wait: Callable[[bool], None]) -> DeviceGate | None:
        """The gate the supervisor named for this evaluation, or None when it runs alone on its device."""
        named = workdir / GATE_FILE
        return cls(named.read_text().strip(), on_wait) if named.exists() else None

    def shared(self) -> contextlib.AbstractContextManager[None]:
        """Correctness checks and the like: beside others' checks, never beside a timing; let go to compile."""
        return self._hold(fcntl.LOCK_SH, yield_to_compile=True)

    def exclusive(self) -> contextlib.AbstractContextManager[None]:
        """Timing and profiling: no other evaluation's work beside."""
        return self._hold(fcntl.LOCK_EX, yield_to_compile=False)

    @contextmanager
    def large(self, paired: bool) -> Iterator[None]:
        """Checks of an evaluation large in memory: beside others' ordinary checks and, `paired`, beside one other
        large evaluation that fits a pair's share too (one slot; otherwise every slot), the hold kept while
        compiling."""
        taken: list[int] = []
        self._waiting(lambda: taken.extend(self._take_slots(paired)))
        try:
            with self._hold(fcntl.LOCK_SH, yield_to_compile=False):
                held = time.perf_counter()  # from the GPU taken (not the wait for others' timing) to its release
                try:
                    yield
                finally:
                    self.spent["paired" if paired else "large"] += time.perf_counter() - held
        finally:
            for slot in taken:
                fcntl.flock(slot, fcntl.LOCK_UN)

    def _take_slots(self, paired: bool) -> list[int]:
        """Through the slots' turnstile: the first large slot that is free (`paired`), or all of them in order."""
        fcntl.flock(self._slot_turnstile, fcntl.LOCK_EX)
        try:
            if not paired:
                for slot in self._slots:
                    fcntl.flock(slot, fcntl.LOCK_EX)
                return list(self._slots)
            while True:
                for slot in self._slots:
                    try:
                        fcntl.flock(slot, fcntl.LOCK_EX | fcntl.LOCK_NB)
                        return [slot]
                    except BlockingIOError:
                        continue
                time.sleep(SLOT_POLL_S)
        finally:
            fcntl.flock(self._slot_turnstile, fcntl.LOCK_UN)

    @contextmanager
    def _hold(self, mode: int, yield_to_compile: bool) -> Iterator[None]:
        self._acquire(mode)
        self._yielding = mode if yield_to_compile else None
        held = time.perf_counter()
        try:
            yield
        finally:
            self._yielding, self._compiling = None, False
            fcntl.flock(self._lock, fcntl.LOCK_UN)
            if mode == fcntl.LOCK_EX:
                self.spent["alone"] += time.perf_counter() - held

    def make_way(self, sync: Callable[[], None]) -> None:
        """Within a long shared hold (a policy generating beside evaluations), between two of its steps: wait for the
        work queued so far, let go, and take the lock back behind any timing that waits for it."""
        sync()
        fcntl.flock(self._lock, fcntl.LOCK_UN)
        self._acquire(fcntl.LOCK_SH)

    def pause(self, sync: Callable[[], None]) -> None:
        """A yielding hold lets the lock go while a kernel compiles; `sync` waits for the work already queued on the
        device, which must not run beside another's timing."""
        if self._yielding is not None and not self._compiling:
            sync()
            fcntl.flock(self._lock, fcntl.LOCK_UN)
            self._compiling = True

    def resume(self) -> None:
        """The compilation is over: take the lock back before the kernel launches."""
        if self._compiling and self._yielding is not None:
            self._compiling = False
            self._acquire(self._yielding)

    def _acquire(self, mode: int) -> None:
        def through_turnstile() -> None:
            fcntl.flock(self._turnstile, fcntl.LOCK_EX)
            try:
                fcntl.flock(self._lock, mode)
            finally:
                fcntl.flock(self._turnstile, fcntl.LOCK_UN)

        self._waiting(through_turnstile)

    def _waiting(self, take: Callable[[], None]) -> None:
        """Block in `take` as a wait: the supervisor is told (it is not the evaluation's time) and it is counted."""
        if self._on_wait is not None:
            self._on_wait(True)
        started = time.perf_counter()
        try:
            take()
        finally:
            self.spent["wait"] += time.perf_counter() - started
            if self._on_wait is not None:
                self._on_wait(False)
