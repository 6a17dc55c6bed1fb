"""Turn reference and candidate sources into modules.

Sources are written to real files first: `@triton.jit` reads a kernel's source through `inspect`, and tracebacks
then show the candidate's own lines.
"""

from __future__ import annotations

import importlib.util
import sys
import types
from pathlib import Path


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
