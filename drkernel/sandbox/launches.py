"""Record every Triton kernel launch, compiled or interpreted, with the name the profiler will show.

The recorder wraps `run` of Triton's `JITFunction` (compiled kernels; autotuners and heuristics end there too) and
of the interpreter's `InterpretedFunction`, once, before the candidate is imported; the wrapper holds the recorder
where candidate code cannot reach it (`audit.sealed`), so that no record is made but by a launch. A launch counts as
the candidate's own when the kernel's Python function was defined in the candidate's source file.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from typing import Any, Callable

import torch

from drkernel.sandbox import audit


@dataclass
class Launch:
    name: str  # the compiled kernel's name (what torch.profiler shows), or the function name under the interpreter
    filename: str
    grid: tuple[int, ...] | None
    own: bool
    tensor_args: list[torch.Tensor] = field(default_factory=list, repr=False)


# Errors Triton's autotuner catches itself while it benchmarks configurations: not a candidate's fallback.
AUTOTUNER_SKIPS = frozenset({"OutOfResources", "CompileTimeAssertionFailure", "PTXASError"})

AfterLaunchHook = Callable[[Launch], None]


class LaunchRecorder:
    """Collects launches while `active`; optional hook runs after each launch (used for decoy ablation)."""

    def __init__(self) -> None:
        self.own_files: set[str] = set()
        self.launches: list[Launch] = []
        self.failures: list[str] = []  # kernels whose launch raised while the candidate ran
        self.active = False
        self.after_launch: AfterLaunchHook | None = None
        self._lock = threading.Lock()
        self._installed = False
        audit.pin_methods(self)  # as its class is now: a method swapped on the class later does not reach it

    def install(self) -> None:
        if self._installed:
            return
        from triton.runtime.interpreter import InterpretedFunction
        from triton.runtime.jit import JITFunction

        for cls in (JITFunction, InterpretedFunction):
            cls.run = audit.sealed(_launcher, (self, cls.run), "run")
        self._installed = True

    def launched(self, original: Callable[..., Any], kernel_fn: Any, args: tuple, grid: Any, warmup: bool,
                 kwargs: dict) -> Any:
        """Triton's `original` launcher called, and the launch recorded."""
        try:
            result = original(kernel_fn, *args, grid=grid, warmup=warmup, **kwargs)
        except BaseException as exc:
            if self.active and type(exc).__name__ not in AUTOTUNER_SKIPS:
                self.failures.append(kernel_fn.fn.__name__)
            raise
        if not warmup and self.active:
            self._record(kernel_fn, result, args, kwargs, grid)
        return result

    def _record(self, kernel_fn: Any, compiled: Any, args: tuple, kwargs: dict, grid: Any) -> None:
        fn = kernel_fn.fn
        filename = fn.__code__.co_filename
        compiled_name = getattr(compiled, "name", None) or getattr(getattr(compiled, "metadata", None), "name", None)
        launch = Launch(
            name=compiled_name or fn.__name__,
            filename=filename,
            grid=_resolve_grid(kernel_fn, grid, args, kwargs),
            own=filename in self.own_files,
            # Kept only while a hook needs them: holding every launch's tensors would pin every output in memory.
            tensor_args=[a for a in list(args) + list(kwargs.values()) if isinstance(a, torch.Tensor)]
            if self.after_launch is not None else [],
        )
        with self._lock:
            self.launches.append(launch)
        if self.after_launch is not None:
            self.after_launch(launch)

    def take(self) -> list[Launch]:
        """Return and forget the launches recorded so far."""
        with self._lock:
            launches, self.launches = self.launches, []
        return launches

    def failed_launches(self) -> list[str]:
        """Return and forget the kernels whose launch raised."""
        with self._lock:
            failures, self.failures = self.failures, []
        return failures


def _launcher(kernel_fn: Any, *args: Any, grid: Any, warmup: bool, **kwargs: Any) -> Any:
    """Triton's launcher as the recorder wraps it: `audit.sealed` puts (recorder, Triton's own launcher) in its code,
    where no closure cell or global would leave them for a candidate to reach, append to or swap."""
    recorder, original = "drkernel.audit.sealed"  # audit.SEALED, a constant of the code  # type: ignore[misc]
    return recorder.launched(original, kernel_fn, args, grid, warmup, kwargs)


def _resolve_grid(kernel_fn: Any, grid: Any, args: tuple, kwargs: dict) -> tuple[int, ...] | None:
    if callable(grid):
        meta = dict(zip(getattr(kernel_fn, "arg_names", []), args))
        meta.update(kwargs)
        try:
            grid = grid(meta)
        except Exception:  # a grid lambda that needs what the autotuner adds later: size unknown
            return None
    try:
        return tuple(int(g) for g in grid)
    except (TypeError, ValueError):
        return None
