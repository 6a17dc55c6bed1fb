"""Harden a freshly forked evaluation process before any candidate code runs.

What the OS allows is applied and what it refuses is reported, never fatal: a process group of its own (so the
supervisor can kill everything it starts), death with its parent, a host-memory cap on the CPU, no core dumps,
a private working directory, no network (a new network namespace) where permitted.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os
import resource
import signal

PR_SET_PDEATHSIG = 1
CLONE_NEWUSER = 0x10000000
CLONE_NEWNET = 0x40000000
MAX_FILE_BYTES = 1 << 30
MIN_FILE_BYTES = 64 << 20  # the largest file an evaluation writes: a compiled kernel in the Triton cache
MIN_HEADROOM_BYTES = 1 << 30  # address space beyond what the fork server maps, for inputs, outputs and compilation

_libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)


def detach(parent_pid: int, new_session: bool = True) -> None:
    """Own process group (unless the parent leads it already); die with the parent."""
    if new_session:
        os.setsid()
    _libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    if os.getppid() != parent_pid:  # the parent died before prctl took effect
        os._exit(1)
    signal.signal(signal.SIGCHLD, signal.SIG_DFL)
    signal.set_wakeup_fd(-1)


def redirect_output(workdir: str) -> None:
    """Stdin from /dev/null, stdout and stderr to files: the fork server's pipes stay out of reach."""
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)
    os.close(null)
    for fd, name in ((1, "stdout.txt"), (2, "stderr.txt")):
        target = os.open(os.path.join(workdir, name), os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        os.dup2(target, fd)
        os.close(target)


class LimitTooLow(Exception):
    """An inherited hard limit leaves less than an evaluation needs: the request cannot be evaluated here."""


def limit_resources(memory_limit_mb: int | None) -> None:
    """Cap address space (only where no CUDA context needs its huge reservations), core dumps and file sizes.

    Every limit is clamped to the inherited hard limit (a batch scheduler's or an admin's `ulimit`), which no
    unprivileged process may raise; below what an evaluation needs, `LimitTooLow` names the limit.
    """
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    _clamp(resource.RLIMIT_FSIZE, "RLIMIT_FSIZE", MAX_FILE_BYTES, needed=MIN_FILE_BYTES)
    if memory_limit_mb is not None:
        _clamp(resource.RLIMIT_AS, "RLIMIT_AS", memory_limit_mb << 20, needed=_mapped_bytes() + MIN_HEADROOM_BYTES)


def blame_address_space(what: str, exc: Exception) -> Exception:
    """The error for `what` failing to start: under an inherited finite RLIMIT_AS (CUDA reserves far more address
    space than it uses, so it fails there first) `LimitTooLow` naming the limit, otherwise `exc` itself."""
    hard = resource.getrlimit(resource.RLIMIT_AS)[1]
    if hard == resource.RLIM_INFINITY:
        return exc
    return LimitTooLow(f"RLIMIT_AS hard limit {_size(hard)} is below what {what} needs to start ({exc}); raise it "
                       "(ulimit -v) for the process that runs drkernel")


def _clamp(limit: int, name: str, wanted: int, needed: int) -> None:
    hard = resource.getrlimit(limit)[1]
    if hard != resource.RLIM_INFINITY and hard < needed:
        raise LimitTooLow(f"{name} hard limit {_size(hard)} is below the {_size(needed)} an evaluation needs; "
                          f"raise it (ulimit) for the process that runs drkernel")
    value = wanted if hard == resource.RLIM_INFINITY else min(wanted, hard)
    resource.setrlimit(limit, (value, value))


def _mapped_bytes() -> int:
    """Address space this process maps already (torch and triton are loaded before any limit is set)."""
    with open("/proc/self/statm") as f:
        return int(f.read().split()[0]) * os.sysconf("SC_PAGE_SIZE")


def _size(n: int) -> str:
    return f"{n / (1 << 30):.1f} GiB" if n >= 1 << 30 else f"{n / (1 << 20):.0f} MiB"


def isolate_network(allow_user_namespace: bool) -> bool:
    """Move into an empty network namespace: only a loopback device, down. True when it worked."""
    if _libc.unshare(CLONE_NEWNET) == 0:
        return True
    if allow_user_namespace and _libc.unshare(CLONE_NEWUSER | CLONE_NEWNET) == 0:
        return True
    return False
