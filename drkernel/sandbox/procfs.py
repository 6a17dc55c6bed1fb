"""Processes: facts from /proc and killing a process group; shared by the sandbox and the supervisor."""

from __future__ import annotations

import os
import signal
from typing import Iterator, NamedTuple

PAGE_SIZE = os.sysconf("SC_PAGE_SIZE")


class ProcessStat(NamedTuple):
    pid: int
    state: str
    ppid: int
    pgrp: int
    rss_bytes: int


def processes() -> Iterator[ProcessStat]:
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()  # the command name may contain spaces and ')'
        except OSError:
            continue
        yield ProcessStat(int(entry), fields[0], int(fields[1]), int(fields[2]), int(fields[21]) * PAGE_SIZE)


def kill_group(pid: int) -> None:
    """SIGKILL the process group led by `pid` (an evaluation and whatever it started), or the process alone."""
    for kill in (os.killpg, os.kill):
        try:
            kill(pid, signal.SIGKILL)
        except OSError:
            pass
