"""Turn reference and candidate sources into modules and models, and their errors into tracebacks of their own.

Sources are written to real files first: `@triton.jit` reads a kernel's source through `inspect`, and tracebacks
then show the candidate's own lines.
"""

from __future__ import annotations

import importlib.util
import os
import sys
import traceback
import types
from pathlib import Path
from typing import Any, Callable

import torch

TRACEBACK_CHARS = 4000


class SourceLoadError(Exception):
    """Executing a source failed; `__cause__` holds the original exception."""


def load_module(source: str, path: Path, module_name: str) -> types.ModuleType:
    path.write_text(source)
    spec = importlib.util.spec_from_file_location(module_name, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[module_name] = module  # dataclasses, pickling and triton's source lookup expect it there
    try:
        spec.loader.exec_module(module)
    except BaseException as exc:  # SystemExit and KeyboardInterrupt from module-level code included
        sys.modules.pop(module_name, None)
        raise SourceLoadError(f"{type(exc).__name__}: {exc}") from exc
    return module


def require(module: types.ModuleType, names: tuple[str, ...], what: str) -> None:
    missing = [name for name in names if not hasattr(module, name)]
    if missing:
        raise LookupError(f"the {what} defines no {', '.join(missing)}")


def trimmed_traceback(exc: BaseException, folder: Path) -> str:
    """The exception with the frames of the evaluation's own files only: nothing of the harness's or the libraries'
    paths goes back to the client."""
    summary = traceback.TracebackException(type(exc), exc, exc.__traceback__)
    parts, seen = [summary], set()
    while parts:  # the exception and those it was raised from or during
        part = parts.pop()
        if id(part) not in seen:
            seen.add(id(part))
            part.stack = traceback.StackSummary.from_list(
                [frame for frame in part.stack if frame.filename.startswith(str(folder) + os.sep)])
            parts += [p for p in (part.__cause__, part.__context__) if p is not None]
    text = "".join(summary.format()).replace(str(folder) + os.sep, "")
    return text if len(text) <= TRACEBACK_CHARS else "...\n" + text[-TRACEBACK_CHARS:]


def seeded(seed: int, device: torch.device, fn: Callable[[], Any]) -> Any:
    """`fn` with every RNG seeded and `device` as the default one (tensors made without naming a device are born
    there): the judge builds the reference and the subject the candidate this way, so a candidate that initialises
    its parameters like the reference gets the same values."""
    import random

    import numpy as np

    random.seed(seed)
    np.random.seed(seed % (2**32))
    torch.manual_seed(seed)
    with device:
        return fn()
