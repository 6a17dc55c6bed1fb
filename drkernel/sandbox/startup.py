"""Start-up of the judge's side: what is paid before an evaluation's start signal, what torch's wrappers would
import at their first call, and what the result says of the environment.
"""

from __future__ import annotations

import contextlib
import gc
import os
import platform
import sys
import types
from typing import Any, Callable

import torch
import triton

from drkernel.sandbox import guards, profiling
from drkernel.schema import Environment

_DYNAMO_DISABLED: list[Callable[..., Any]] = []  # found by the fork server (`find_dynamo_disabled`) before it forks


def find_dynamo_disabled() -> None:
    """torch's functions wrapped in `torch._disable_dynamo`, its Python references and meta kernels among them (the
    estimate of a task's memory on the meta device runs them): each wrapper imports torch._dynamo at its first call,
    only to keep dynamo from tracing its function. That import took 1.7 s of each evaluation's judge on an H100's host
    once the fork server no longer made it (docs/performance.md)."""
    _DYNAMO_DISABLED[:] = [fn for obj in gc.get_objects() if type(obj) is types.FunctionType
                           and (fn := guards.dynamo_wrapped(obj)) is not None]


def call_dynamo_disabled_directly() -> None:
    """In the judge's process only (the subject, forked before, keeps torch's own wrappers for the candidate), while
    torch._dynamo is not imported, and not when the reference is compiled: each wrapper finds its function as the
    one to call and imports nothing. Where dynamo is not imported nothing traces, and the function called as it is
    behaves as `torch._dynamo.disable` would make it behave."""
    if "torch._dynamo" in sys.modules:
        return
    for fn in _DYNAMO_DISABLED:
        with contextlib.suppress(AttributeError, TypeError):  # a builtin takes no attributes: its wrapper imports
            setattr(fn, "__dynamo_disable", fn)  # the name torch._compile's wrapper looks up



def warm_up(device: torch.device, profiles: bool = True) -> None:
    """Start-up costs paid before the evaluation's start signal, while the previous evaluation may still run:
    the CUDA context, the caching allocator and, in a process that will profile (the subject), CUPTI's
    initialisation. The judge never profiles, and every process start adds to a host's busiest lock
    (docs/performance.md)."""
    if device.type != "cuda":
        return
    with profiling.cuda_profiler(cpu=False) if profiles else contextlib.nullcontext():
        torch.ones(1, device=device).add_(1)
        torch.cuda.synchronize()


def environment(device: torch.device) -> Environment:
    gpu = device.type == "cuda"
    return Environment(
        device=torch.cuda.get_device_name(device) if gpu else "cpu",
        torch=torch.__version__,
        triton=triton.__version__,
        python=platform.python_version(),
        interpreter=interpreting(),
        gpu=gpu,
    )


def interpreting() -> bool:
    return os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")

