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

Frame introspection counts only when the candidate's code asks for it (directly, or through `inspect`): dataclasses,
collections and traceback formatting use frames for their own bookkeeping. An audit hook cannot be removed.
The verdict does not rest on this hook (the judge never runs candidate code); it keeps the subject's own
measurements honest and the candidate's side effects inside its scratch space.
"""

from __future__ import annotations

import os
import sys
import sysconfig
import threading
from typing import Callable

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
INSPECT_MODULES = ("inspect.py",)
# Python bindings of CUDA's runtime and driver: from the candidate they count as ctypes does.
CUDA_BINDINGS = ("cuda", "cupy", "cupy_backends", "numba.cuda", "pycuda", "cuda_bindings")
TRITON_COMPILER = (os.sep + "triton" + os.sep + "compiler" + os.sep, os.sep + "triton" + os.sep + "backends" + os.sep,
                   os.sep + "triton" + os.sep + "runtime" + os.sep + "build.py")

# Libraries whose own use of ctypes and CUDA's bindings (lazily, inside a call the candidate made) is their business.
TRUSTED_LIBRARIES = tuple(os.sep + name + os.sep for name in ("torch", "triton"))
STDLIB = sysconfig.get_paths()["stdlib"]

_state = threading.local()


class CandidateAudit:
    """The hook's state: which file is the candidate's, where it may write, and who to tell about a refusal."""

    def __init__(self) -> None:
        self.candidate_file: str | None = None
        self.writable: tuple[str, ...] = ()
        self.on_violation: Callable[[str], None] = lambda event: None
        self._installed = False

    def install(self) -> None:
        if not self._installed:
            sys.addaudithook(self._hook)
            self._installed = True

    def watch(self, candidate_file: str, writable: list[str], on_violation: Callable[[str], None]) -> None:
        """From now on, refuse what the code of `candidate_file` does outside `writable` (folders)."""
        self.writable = tuple(os.path.realpath(p) + os.sep for p in writable if p)
        self.on_violation = on_violation
        self.candidate_file = candidate_file

    def _hook(self, event: str, args: tuple) -> None:
        if self.candidate_file is None or getattr(_state, "busy", False):
            return
        kind = self._kind(event, args)
        if kind is None:
            return
        _state.busy = True  # sys._getframe below raises an audit event of its own
        try:
            refused = self._refused(kind, event, sys._getframe(1))
        finally:
            _state.busy = False
        if refused:
            self.on_violation(event if kind != "import" else f"import {args[0]}")
            if kind not in ("record", "import"):  # recorded, not stopped: a crash they cause stays a crash
                raise PermissionError(f"drkernel sandbox: {event} is not allowed in a candidate")

    def _kind(self, event: str, args: tuple) -> str | None:
        """What the event is, if it is watched at all: "frame", "process", "record", "import" or "refuse"."""
        if event in FRAME_EVENTS or (event == "object.__getattr__" and len(args) > 1 and args[1] in FRAME_ATTRIBUTES):
            return "frame"
        if event == "open":
            return None if not _writes(args) or self._inside(args[0]) else "refuse"
        if event in PATH_EVENTS:
            paths = [args[i] for i in PATH_EVENTS[event] if i < len(args)]
            return None if all(self._inside(p) for p in paths) else "refuse"
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

    def _refused(self, kind: str, event: str, frame: object) -> bool:
        assert self.candidate_file is not None
        if kind == "frame":
            return called_directly(self.candidate_file, frame)
        on_stack, compiler = on_call_stack(self.candidate_file, frame)
        if kind in ("record", "import"):  # torch or Triton acting on their own behalf uses these legitimately
            return on_stack and not any(lib in _acting_file(frame) for lib in TRUSTED_LIBRARIES)
        return on_stack and not (kind == "process" and compiler)

    def _inside(self, path: object) -> bool:
        if isinstance(path, int) or path is None:  # an open descriptor: the path was checked when it was opened
            return True
        try:
            real = os.path.realpath(os.fsdecode(path))  # type: ignore[arg-type]
        except (TypeError, ValueError):
            return False
        return real == os.devnull or (real + os.sep).startswith(self.writable)


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
    """Whether `frame` is code of `filename` itself, looking through `inspect`."""
    while frame is not None and frame.f_code.co_filename.endswith(INSPECT_MODULES):  # type: ignore
        frame = frame.f_back  # type: ignore[attr-defined]
    return frame is not None and frame.f_code.co_filename == filename  # type: ignore[attr-defined]


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
