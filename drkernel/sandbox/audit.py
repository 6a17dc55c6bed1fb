"""Refuse, from the candidate's own code, the operations that reach into the harness or out of the sandbox.

A Python audit hook (PEP 578) sees frame and object introspection (`sys._getframe`, traceback and generator
frames, `gc.get_objects`), file writes, `ctypes`, signals and new processes. When such an event comes from code in
the candidate's file - directly, or through a standard-library helper that it called - the finding is recorded and
the operation raises `PermissionError` (ctypes calls are only recorded), whether or not the candidate catches it. Torch, Triton and
the standard library acting on their own behalf are never refused. An audit hook cannot be removed once added.
"""

from __future__ import annotations

import os
import sys
import sysconfig
import threading
from typing import Callable

# Events refused when they come from the candidate, however indirectly.
ANYWHERE = {
    "gc.get_objects", "gc.get_referrers", "gc.get_referents", "sys._current_frames", "sys.settrace",
    "sys.setprofile", "os.kill", "os.killpg", "os.fork", "os.forkpty", "os.system", "os.exec", "os.posix_spawn",
    "os.spawn", "subprocess.Popen", "os.rename", "os.replace", "os.remove", "os.rmdir", "os.unlink",
    "os.truncate", "os.chmod", "os.symlink", "os.link", "shutil.rmtree", "shutil.move", "socket.connect",
    "socket.bind", "socket.__new__",
}
# Frame access refused when the candidate's code calls it, or calls `inspect` for it; others (dataclasses,
# collections, traceback formatting) use frames for their own bookkeeping.
FRAME_EVENTS = {"sys._getframe", "sys._getframemodulename"}
FRAME_ATTRIBUTES = {"tb_frame", "gi_frame", "cr_frame", "ag_frame", "f_back", "f_locals", "f_globals", "gi_code"}
INSPECT_MODULES = ("inspect.py",)
STDLIB = sysconfig.get_paths()["stdlib"]

_state = threading.local()


class CandidateAudit:
    """The hook's state: which file is the candidate's, and who to tell about a refusal."""

    def __init__(self, on_violation: Callable[[str], None]) -> None:
        self.candidate_file: str | None = None
        self.on_violation = on_violation

    def install(self) -> None:
        sys.addaudithook(self._hook)

    def _hook(self, event: str, args: tuple) -> None:
        if self.candidate_file is None or getattr(_state, "busy", False):
            return
        watched = (
            event in ANYWHERE or event in FRAME_EVENTS or event.startswith("ctypes.")
            or (event == "open" and _writes(args))
            or (event == "object.__getattr__" and len(args) > 1 and args[1] in FRAME_ATTRIBUTES)
        )
        if not watched:
            return
        _state.busy = True  # sys._getframe below raises an audit event of its own
        try:
            refused = self._from_candidate(event, sys._getframe(1))
        finally:
            _state.busy = False
        if refused:
            self.on_violation(event)
            if not event.startswith("ctypes."):  # ctypes is recorded, not stopped: a crash it causes stays a crash
                raise PermissionError(f"drkernel sandbox: {event} is not allowed in a candidate")

    def _from_candidate(self, event: str, frame: object) -> bool:
        assert self.candidate_file is not None
        return called_from(self.candidate_file, frame, direct=event in FRAME_EVENTS or event == "object.__getattr__")


def called_from(filename: str, frame: object, direct: bool = False) -> bool:
    """Whether `frame` is code of `filename`, or standard-library code that it called.

    With `direct`, only the caller itself counts (looking through `inspect`): dataclasses, collections or traceback
    formatting use frames for their own bookkeeping.
    """
    if direct:
        while frame is not None and frame.f_code.co_filename.endswith(INSPECT_MODULES):  # type: ignore
            frame = frame.f_back  # type: ignore[attr-defined]
        return frame is not None and frame.f_code.co_filename == filename  # type: ignore[attr-defined]
    while frame is not None:  # the first frame outside the standard library decides
        current = frame.f_code.co_filename  # type: ignore[attr-defined]
        if current == filename:
            return True
        if not (current.startswith(STDLIB) or current.startswith("<")):
            return False  # torch, triton or the harness acting on their own behalf
        frame = frame.f_back  # type: ignore[attr-defined]
    return False


def _writes(args: tuple) -> bool:
    mode, flags = (args[1] if len(args) > 1 else "r"), (args[2] if len(args) > 2 else 0)
    if isinstance(mode, str) and any(c in mode for c in "wax+"):
        return True
    return bool(isinstance(flags, int) and flags & (os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_TRUNC))
