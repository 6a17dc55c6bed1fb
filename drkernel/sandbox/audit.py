"""Refuse, from the candidate's code, the operations that reach into the harness or out of the sandbox.

A Python audit hook (PEP 578), added once when the fork server starts, sees frame and object introspection
(`sys._getframe`, traceback and generator frames, `gc.get_objects`), file writes and removals, `ctypes`, imports,
signals and new processes. In the subject (drkernel.sandbox.subject) an event is the candidate's when code of the
candidate's file is anywhere on the call stack: a library that writes a file, opens a socket or starts a process on
the candidate's behalf acts for it. The event is recorded as a finding and the operation raises `PermissionError`
(ctypes and CUDA's own Python bindings are only recorded: a crash they cause stays a crash). Two things stay allowed:

- writes (and renames, removals) inside the candidate's scratch space and the Triton cache, on anyone's behalf:
  Triton compiling the candidate's kernels writes there;
- new processes started by Triton's compiler (ptxas, the C compiler for launcher stubs) while it compiles them.

Frame introspection counts only when the candidate's code asks for it, directly or through a standard-library
function that hands frames back (`inspect`, `traceback.walk_stack`, ...: a frame's `f_back` and `f_locals` are never
audited, so any frame leads to the harness's): collections, warnings and traceback formatting use frames for their
own bookkeeping. An audit hook cannot be removed.
The verdict does not rest on this hook (the judge never runs candidate code); it keeps the subject's own
measurements honest and the candidate's side effects inside its scratch space.
"""

from __future__ import annotations

import os
import sys
import sysconfig
import threading
import types
from typing import Any, Callable

REFUSED = {
    "gc.get_objects", "gc.get_referrers", "gc.get_referents", "sys._current_frames", "sys.settrace",
    "sys.setprofile", "sys.addaudithook", "os.kill", "os.killpg", "os.fork", "os.forkpty", "os.system", "os.exec",
    "os.posix_spawn", "os.spawn", "subprocess.Popen", "socket.connect", "socket.bind", "socket.__new__",
}
PROCESS_EVENTS = {"os.fork", "os.forkpty", "os.system", "os.exec", "os.posix_spawn", "os.spawn", "subprocess.Popen"}
# (event, index of each path argument): allowed inside the writable roots only.
PATH_EVENTS = {
    "os.rename": (0, 1), "os.replace": (0, 1), "os.remove": (0,), "os.rmdir": (0,), "os.unlink": (0,),
    "os.truncate": (0,), "os.chmod": (0,), "os.symlink": (0, 1), "os.link": (0, 1), "shutil.rmtree": (0,),
    "shutil.move": (0, 1), "os.mkdir": (0,),
}
FRAME_EVENTS = {"sys._getframe", "sys._getframemodulename"}
FRAME_ATTRIBUTES = {"tb_frame", "gi_frame", "cr_frame", "ag_frame", "f_back", "f_locals", "f_globals", "gi_code"}
# Python bindings of CUDA's runtime and driver: from the candidate they count as ctypes does.
CUDA_BINDINGS = ("cuda", "cupy", "cupy_backends", "numba.cuda", "pycuda", "cuda_bindings")
TRITON_COMPILER = (os.sep + "triton" + os.sep + "compiler" + os.sep, os.sep + "triton" + os.sep + "backends" + os.sep,
                   os.sep + "triton" + os.sep + "runtime" + os.sep + "build.py")

# Libraries whose own use of ctypes and CUDA's bindings (lazily, inside a call the candidate made) is their business.
TRUSTED_LIBRARIES = tuple(os.sep + name + os.sep for name in ("torch", "triton"))
STDLIB = sysconfig.get_paths()["stdlib"]
# The standard library's functions that hand the frames they ask for (or read off a traceback or a coroutine) back
# to their caller, by file (None: every function of it): the caller is the asker. Elsewhere the standard library
# reads frames for its own bookkeeping (namedtuple's module, warnings' stack level, print_exc's traceback).
FRAME_GIVERS = {os.path.join(STDLIB, *path.split("/")): names for path, names in {
    "inspect.py": None, "traceback.py": {"walk_stack", "walk_tb"}, "logging/__init__.py": {"<lambda>", "currentframe"},
    "bdb.py": {"get_stack"}, "pdb.py": {"setup"}, "asyncio/base_tasks.py": {"_task_get_stack"}}.items()}

_state = threading.local()


WATCH_EVENT = "drkernel.audit.watch"
# Reads of a function's (or a frame's) code and defaults: refused where they are the harness's own.
CODE_ATTRIBUTES = {"__code__", "__defaults__", "__kwdefaults__", "f_code"}
HARNESS_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + os.sep  # the drkernel package
SEALED = "drkernel.audit.sealed"  # the constant `sealed` replaces


class CandidateAudit:
    """Adds the hook, once. What it watches (the candidate's file, where it may write, who to tell) lives in the
    hook's closure alone, set once by `watch`: audit hooks cannot be listed, so no object the candidate can reach
    holds that state, or the subject it reports to (whose findings, timer and relay would otherwise be a chain of
    attributes away from any harness module)."""

    def __init__(self) -> None:
        self._installed = False

    def install(self) -> None:
        if not self._installed:
            sys.addaudithook(_hook())
            self._installed = True

    @staticmethod
    def watch(candidate_file: str, writable: list[str], on_violation: Callable[[str], None]) -> None:
        """From now on, refuse what the code of `candidate_file` does outside `writable` (folders). Only the first
        call counts: a candidate cannot point the hook elsewhere."""
        sys.audit(WATCH_EVENT, candidate_file, tuple(os.path.realpath(p) + os.sep for p in writable if p),
                  on_violation)


def _hook() -> Callable[[str, tuple], None]:
    candidate_file: str | None = None
    writable: tuple[str, ...] = ()
    on_violation: Callable[[str], None] = lambda event: None

    def hook(event: str, args: tuple) -> None:
        nonlocal candidate_file, writable, on_violation
        if event == WATCH_EVENT:
            if candidate_file is None:
                candidate_file, writable, on_violation = args
            return
        if candidate_file is None or getattr(_state, "busy", False):
            return
        _state.busy = True  # what the hook reads (a frame, a function's code) raises audit events of its own
        try:
            kind = _kind(event, args, writable)
            refused = kind is not None and _refused(candidate_file, kind, sys._getframe(1))
        finally:
            _state.busy = False
        if refused:
            on_violation(event if kind != "import" else f"import {args[0]}")
            if kind not in ("record", "import"):  # recorded, not stopped: a crash they cause stays a crash
                raise PermissionError(f"drkernel sandbox: {event} is not allowed in a candidate")

    return hook


def _kind(event: str, args: tuple, writable: tuple[str, ...]) -> str | None:
    """What the event is, if it is watched at all: "frame", "process", "record", "import" or "refuse"."""
    if event in FRAME_EVENTS or (event == "object.__getattr__" and len(args) > 1 and args[1] in FRAME_ATTRIBUTES):
        return "frame"
    if event == "object.__getattr__" and len(args) > 1 and args[1] in CODE_ATTRIBUTES and _harness(args[0]):
        # Its code holds what the harness's hooks in the libraries use (`sealed`). A frame's code only when asked
        # for directly: torch's compiler reads every frame's on the stack to record where it traced from.
        return "frame" if args[1] == "f_code" else "refuse"
    if event == "open":
        return None if not _writes(args) or _inside(args[0], writable) else "refuse"
    if event in PATH_EVENTS:
        paths = [args[i] for i in PATH_EVENTS[event] if i < len(args)]
        return None if all(_inside(p, writable) for p in paths) else "refuse"
    if event in PROCESS_EVENTS:
        return "process"
    if event in REFUSED:
        return "refuse"
    if event.startswith("ctypes."):
        return "record"
    if event == "import" and args and isinstance(args[0], str) and args[0].startswith(CUDA_BINDINGS):
        name = args[0]
        return "import" if any(name == b or name.startswith(b + ".") for b in CUDA_BINDINGS) else None
    return None


def _refused(candidate_file: str, kind: str, frame: object) -> bool:
    if kind == "frame":
        return called_directly(candidate_file, frame)
    on_stack, compiler = on_call_stack(candidate_file, frame)
    if kind in ("record", "import"):  # torch or Triton acting on their own behalf uses these legitimately
        return on_stack and not any(lib in _acting_file(frame) for lib in TRUSTED_LIBRARIES)
    return on_stack and not (kind == "process" and compiler)


def _harness(value: object) -> bool:
    """Whether a function or a frame is the harness's own, by its code's file (which cannot change)."""
    code = value.f_code if isinstance(value, types.FrameType) else getattr(value, "__code__", None)
    return isinstance(code, types.CodeType) and code.co_filename.startswith(HARNESS_DIR)


def pin_methods(obj: object) -> None:
    """Bind every method of `obj`'s class to `obj` itself, now: the harness then calls what the class held when `obj`
    was made, whatever is swapped on the class later. CPython audits no change to a class, and a method swapped for
    one call (and put back before any check) is handed `self`, the way to the object's state (`q7`). Special methods
    are looked up on the class, not the instance: the harness calls none of them on these objects while candidate
    code runs."""
    for klass in reversed(type(obj).__mro__[:-1]):  # object's own methods aside
        for name, value in vars(klass).items():
            if isinstance(value, types.FunctionType) and not (name.startswith("__") and name.endswith("__")):
                obj.__dict__[name] = types.MethodType(value, obj)


def sealed(fn: Callable[..., Any], value: object, name: str) -> Callable[..., Any]:
    """`fn` with `value` in its code where `fn`'s code has the constant SEALED, and no globals: `value` is then
    reachable only through the function's `__code__`, which the hook refuses candidate code (a closure's cells, a
    function's globals and a bound method's `__self__` are read, and cells written, without any audit event)."""
    code = fn.__code__
    sealed_fn = types.FunctionType(code.replace(co_consts=tuple(value if c == SEALED else c for c in code.co_consts)),
                                   {}, name)
    sealed_fn.__qualname__ = name
    return sealed_fn


def _inside(path: object, writable: tuple[str, ...]) -> bool:
    if isinstance(path, int) or path is None:  # an open descriptor: the path was checked when it was opened
        return True
    try:
        real = os.path.realpath(os.fsdecode(path))  # type: ignore[arg-type]
    except (TypeError, ValueError):
        return False
    return real == os.devnull or (real + os.sep).startswith(writable)


AUDIT = CandidateAudit()


def on_call_stack(filename: str, frame: object) -> tuple[bool, bool]:
    """Whether code of `filename` is anywhere on the stack from `frame` down, and whether Triton's compiler stands
    between it and the event (a compilation the candidate's launch set off)."""
    compiler = False
    while frame is not None:
        current = frame.f_code.co_filename  # type: ignore[attr-defined]
        if current == filename:
            return True, compiler
        compiler = compiler or any(part in current for part in TRITON_COMPILER)
        frame = frame.f_back  # type: ignore[attr-defined]
    return False, False


def called_from(filename: str, frame: object) -> bool:
    """Whether code of `filename` is on the stack from `frame` down (a thread's or a callback's origin)."""
    return on_call_stack(filename, frame)[0]


def called_directly(filename: str, frame: object) -> bool:
    """Whether `frame` is code of `filename` itself, looking through the standard library's `FRAME_GIVERS`."""
    while frame is not None and _gives_frames(frame.f_code):  # type: ignore[attr-defined]
        frame = frame.f_back  # type: ignore[attr-defined]
    return frame is not None and frame.f_code.co_filename == filename  # type: ignore[attr-defined]


def _gives_frames(code: types.CodeType) -> bool:
    names = FRAME_GIVERS.get(code.co_filename, ())
    return names is None or code.co_name in names


def _acting_file(frame: object) -> str:
    """The file of the first frame outside the standard library and the import machinery: who asked for it."""
    while frame is not None:
        current = frame.f_code.co_filename  # type: ignore[attr-defined]
        if not (current.startswith(STDLIB) or current.startswith("<")):
            return current
        frame = frame.f_back  # type: ignore[attr-defined]
    return ""


def _writes(args: tuple) -> bool:
    mode, flags = (args[1] if len(args) > 1 else "r"), (args[2] if len(args) > 2 else 0)
    if isinstance(mode, str) and any(c in mode for c in "wax+"):
        return True
    return bool(isinstance(flags, int) and flags & (os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_TRUNC))
