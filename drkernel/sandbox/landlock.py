"""Landlock (Linux 5.13+, unprivileged) through ctypes: after `restrict`, this process and its children may open
only the paths given, read-only or read-write, and (ABI 4+) neither bind nor connect TCP sockets, (ABI 6+) nor
signal processes or reach abstract Unix sockets outside their own Landlock domain.

Why a kernel mechanism and not a check in Python: a candidate's code (or a native library it loads) can open any
file through any route; only the kernel sees every one. Rules name inodes, so they are taken while the paths exist.
"""

from __future__ import annotations

import ctypes
import os

SYS_CREATE_RULESET, SYS_ADD_RULE, SYS_RESTRICT_SELF = 444, 445, 446  # the same numbers on every architecture
CREATE_RULESET_VERSION = 1
RULE_PATH_BENEATH = 1
PR_SET_NO_NEW_PRIVS = 38

EXECUTE, WRITE_FILE, READ_FILE, READ_DIR = 1 << 0, 1 << 1, 1 << 2, 1 << 3
REMOVE_DIR, REMOVE_FILE, MAKE_CHAR, MAKE_DIR, MAKE_REG = 1 << 4, 1 << 5, 1 << 6, 1 << 7, 1 << 8
MAKE_SOCK, MAKE_FIFO, MAKE_BLOCK, MAKE_SYM = 1 << 9, 1 << 10, 1 << 11, 1 << 12
REFER, TRUNCATE = 1 << 13, 1 << 14  # ABI 2, ABI 3
NET_BIND_TCP, NET_CONNECT_TCP = 1 << 0, 1 << 1  # ABI 4
SCOPE_ABSTRACT_UNIX_SOCKET, SCOPE_SIGNAL = 1 << 0, 1 << 1  # ABI 6

FILE_RIGHTS = EXECUTE | WRITE_FILE | READ_FILE | TRUNCATE  # the only rights a rule on a file (not a dir) may hold
READ = EXECUTE | READ_FILE | READ_DIR
WRITE = (WRITE_FILE | REMOVE_DIR | REMOVE_FILE | MAKE_DIR | MAKE_REG | MAKE_SOCK | MAKE_FIFO | MAKE_SYM
         | REFER | TRUNCATE)

_libc = ctypes.CDLL(None, use_errno=True)
_libc.syscall.restype = ctypes.c_long


class _RulesetAttr(ctypes.Structure):
    _fields_ = [("handled_access_fs", ctypes.c_uint64), ("handled_access_net", ctypes.c_uint64),
                ("scoped", ctypes.c_uint64)]


class _PathBeneathAttr(ctypes.Structure):
    _pack_ = 1
    _fields_ = [("allowed_access", ctypes.c_uint64), ("parent_fd", ctypes.c_int32)]


def abi_version() -> int:
    """The kernel's Landlock ABI (1, 2, ...), or 0 when Landlock is absent or disabled."""
    version = _libc.syscall(SYS_CREATE_RULESET, None, ctypes.c_size_t(0), ctypes.c_uint32(CREATE_RULESET_VERSION))
    return max(int(version), 0)


def restrict(read_only: list[str], read_write: list[str]) -> int:
    """Confine this process (and what it starts) to the given paths; missing paths are skipped. Returns the ABI
    used; raises OSError when the kernel refuses (e.g. no Landlock: check `abi_version` first)."""
    abi = abi_version()
    if abi < 1:
        raise OSError("Landlock is not available in this kernel")
    handled = READ | WRITE | MAKE_CHAR | MAKE_BLOCK
    if abi < 2:
        handled &= ~REFER
    if abi < 3:
        handled &= ~TRUNCATE
    attr = _RulesetAttr(handled, (NET_BIND_TCP | NET_CONNECT_TCP) if abi >= 4 else 0,
                        (SCOPE_ABSTRACT_UNIX_SOCKET | SCOPE_SIGNAL) if abi >= 6 else 0)
    size = 24 if abi >= 6 else 16 if abi >= 4 else 8
    ruleset = _check(_libc.syscall(SYS_CREATE_RULESET, ctypes.byref(attr), ctypes.c_size_t(size), ctypes.c_uint32(0)),
                     "landlock_create_ruleset")
    try:
        for paths, access in ((read_only, READ), (read_write, READ | WRITE)):
            for path in paths:
                _allow(ruleset, path, access & handled)
        _check(_libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0), "prctl(PR_SET_NO_NEW_PRIVS)")
        _check(_libc.syscall(SYS_RESTRICT_SELF, ctypes.c_int(ruleset), ctypes.c_uint32(0)), "landlock_restrict_self")
    finally:
        os.close(ruleset)
    return abi


def _allow(ruleset: int, path: str, access: int) -> None:
    try:
        fd = os.open(path, os.O_PATH | os.O_CLOEXEC)
    except OSError:
        return  # a path this machine does not have
    try:
        if not os.path.isdir(path):
            access &= FILE_RIGHTS
        rule = _PathBeneathAttr(access, fd)
        _check(_libc.syscall(SYS_ADD_RULE, ctypes.c_int(ruleset), ctypes.c_int(RULE_PATH_BENEATH),
                             ctypes.byref(rule), ctypes.c_uint32(0)), f"landlock_add_rule({path})")
    finally:
        os.close(fd)


def _check(value: int, what: str) -> int:
    if value < 0:
        errno = ctypes.get_errno()
        raise OSError(errno, f"{what}: {os.strerror(errno)}")
    return value
