"""The per-GPU gate between evaluation processes: several may load, compile and check correctness at once, but
timing and profiling have the GPU to themselves.

A reader-writer lock over two files, with `fcntl.flock` (released by the kernel if the process dies): phases that
only need the GPU to be shared (correctness trials, building models, ablation) hold the lock file shared; timing
and profiling hold it exclusively. A turnstile file taken exclusively before either makes the lock writer-preferring:
once a timing phase waits, no new shared phase starts, so a stream of correctness trials cannot starve it. While a
process waits, the file `waiting` exists in its working directory: the supervisor does not count that time against
the evaluation's deadline (an evaluation is not late because others were using the GPU).

Triton compiles a candidate's kernels on the CPU at their first launch, inside a correctness trial. A shared holder
lets the lock go for the compilation (after waiting for the work it has already queued), so another evaluation's
timing can run meanwhile, and takes it again before the kernel launches.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Callable, Iterator

GATE_FILE = "gate"  # in an evaluation's working directory: the path of its GPU's lock file, written by the supervisor
WAITING_FILE = "waiting"


class DeviceGate:
    def __init__(self, lock_path: str | Path, workdir: str | Path | None) -> None:
        self.path = Path(lock_path)
        self._lock = os.open(lock_path, os.O_RDWR | os.O_CREAT, 0o600)
        self._turnstile = os.open(f"{lock_path}.turnstile", os.O_RDWR | os.O_CREAT, 0o600)
        self._waiting = Path(workdir) / WAITING_FILE if workdir is not None else None  # for a supervisor's clock
        self._yielding: int | None = None  # the mode of a hold that is let go while Triton compiles
        self._compiling = False

    @classmethod
    def for_workdir(cls, workdir: Path) -> DeviceGate | None:
        """The gate the supervisor named for this evaluation, or None when it runs alone on its device."""
        named = workdir / GATE_FILE
        return cls(named.read_text().strip(), workdir) if named.exists() else None

    def shared(self) -> contextlib.AbstractContextManager[None]:
        """Correctness checks and the like: beside others' checks, never beside a timing; let go to compile."""
        return self._hold(fcntl.LOCK_SH, yield_to_compile=True)

    def exclusive(self, yield_to_compile: bool = False) -> contextlib.AbstractContextManager[None]:
        """Timing and profiling (or checks too large in memory to share the GPU, which may let go to compile)."""
        return self._hold(fcntl.LOCK_EX, yield_to_compile)

    @contextmanager
    def _hold(self, mode: int, yield_to_compile: bool) -> Iterator[None]:
        self._acquire(mode)
        self._yielding = mode if yield_to_compile else None
        try:
            yield
        finally:
            self._yielding, self._compiling = None, False
            fcntl.flock(self._lock, fcntl.LOCK_UN)

    def make_way(self, sync: Callable[[], None]) -> None:
        """Within a long shared hold (a policy generating beside evaluations), between two of its steps: wait for the
        work queued so far, let go, and take the lock back behind any timing that waits for it."""
        sync()
        fcntl.flock(self._lock, fcntl.LOCK_UN)
        self._acquire(fcntl.LOCK_SH)

    def compile_outside(self, sync: Callable[[], None]) -> None:
        """Let a yielding hold go while Triton compiles (its JIT hooks run before and after each compilation);
        `sync` waits for the work already queued on the device, which must not run beside another's timing."""
        from triton import knobs

        if not hasattr(knobs.runtime, "jit_post_compile_hook"):  # a Triton without JIT hooks compiles under the lock
            return

        def before(*args: Any, **kwargs: Any) -> None:
            if self._yielding is not None and not self._compiling:
                sync()
                fcntl.flock(self._lock, fcntl.LOCK_UN)
                self._compiling = True
            return None  # anything true would make Triton skip the compilation

        def after(*args: Any, **kwargs: Any) -> None:
            if self._compiling and self._yielding is not None:
                self._compiling = False
                self._acquire(self._yielding)

        knobs.runtime.jit_cache_hook, knobs.runtime.jit_post_compile_hook = before, after

    def _acquire(self, mode: int) -> None:
        if self._waiting is not None:
            self._waiting.touch()
        try:
            fcntl.flock(self._turnstile, fcntl.LOCK_EX)
            try:
                fcntl.flock(self._lock, mode)
            finally:
                fcntl.flock(self._turnstile, fcntl.LOCK_UN)
        finally:
            if self._waiting is not None:
                self._waiting.unlink(missing_ok=True)
