"""System-call filters (seccomp BPF, unprivileged under no_new_privs) for the subject, the candidate's process.

Two filters, both refusing with an error (never a kill: a library that probes a call goes on):

- `process_filter`, for every thread of the subject: no tracing or reading another process's memory (ptrace,
  process_vm_readv/writev, pidfd_getfd, kcmp), no new namespaces (unshare, setns, clone with a namespace flag),
  no performance counters (perf_event_open), no io_uring (its requests bypass per-call filters), no mounts, no
  kernel modules, keys, BPF or userfaultfd. `clone3` answers ENOSYS (its flags sit in memory a filter cannot read;
  the C library then uses `clone`, whose flags it can).
- `channel_filter`, for the thread that runs candidate code and every thread it starts: no I/O, duplication,
  closing or option changes on the descriptors of the subject's channel to the judge. The harness's own thread,
  which started before the candidate loaded, talks on it alone (drkernel.sandbox.subject).

Why in the kernel: a candidate that finds the channel's descriptor (`os.fstat` over numbers is enough) could answer
the judge itself, with any evidence it likes; Python-level checks see none of `os.read`/`os.write`.
Filters are inherited by threads and processes started later and cannot be removed.
"""

from __future__ import annotations

import ctypes
import errno
import os
import platform
import struct
from dataclasses import dataclass

PR_SET_NO_NEW_PRIVS, PR_SET_SECCOMP, PR_GET_SECCOMP = 38, 22, 21
SECCOMP_MODE_FILTER = 2
SECCOMP_SET_MODE_FILTER_OP, SECCOMP_FILTER_FLAG_TSYNC = 1, 1
SECCOMP_SYSCALL = {"x86_64": 317, "aarch64": 277}
RET_ALLOW, RET_ERRNO = 0x7FFF0000, 0x00050000
LD_ABS_W, JEQ_K, JGE_K, JSET_K, RET_K = 0x20, 0x15, 0x35, 0x45, 0x06
OFFSET_NR, OFFSET_ARCH = 0, 4
MAX_INSTRUCTIONS = 4096
X32_SYSCALL_BIT = 0x40000000
NAMESPACE_FLAGS = 0x7E020080  # CLONE_NEWNS, NEWCGROUP, NEWUTS, NEWIPC, NEWUSER, NEWPID, NEWNET, NEWTIME

# The numbers differ by architecture; dup2 exists on x86-64 only.
SYSCALLS = {
    "x86_64": (0xC000003E, {
        "read": 0, "write": 1, "close": 3, "ioctl": 16, "pread64": 17, "pwrite64": 18, "readv": 19, "writev": 20,
        "dup": 32, "dup2": 33, "sendfile": 40, "connect": 42, "accept": 43, "sendto": 44, "recvfrom": 45,
        "sendmsg": 46, "recvmsg": 47, "shutdown": 48, "bind": 49, "listen": 50, "getsockname": 51,
        "getpeername": 52, "setsockopt": 54, "getsockopt": 55, "clone": 56, "fcntl": 72, "ptrace": 101,
        "pivot_root": 155, "chroot": 161, "mount": 165, "umount2": 166, "init_module": 175, "delete_module": 176,
        "kexec_load": 246, "add_key": 248, "request_key": 249, "keyctl": 250, "unshare": 272, "splice": 275,
        "tee": 276, "vmsplice": 278, "accept4": 288, "dup3": 292, "preadv": 295, "pwritev": 296,
        "perf_event_open": 298, "recvmmsg": 299, "name_to_handle_at": 303, "open_by_handle_at": 304,
        "sendmmsg": 307, "setns": 308, "process_vm_readv": 310, "process_vm_writev": 311, "kcmp": 312,
        "finit_module": 313, "kexec_file_load": 320, "bpf": 321, "userfaultfd": 323, "copy_file_range": 326,
        "preadv2": 327, "pwritev2": 328, "io_uring_setup": 425, "io_uring_enter": 426, "io_uring_register": 427,
        "clone3": 435, "close_range": 436, "pidfd_getfd": 438, "process_madvise": 440,
    }),
    "aarch64": (0xC00000B7, {
        "read": 63, "write": 64, "close": 57, "ioctl": 29, "pread64": 67, "pwrite64": 68, "readv": 65, "writev": 66,
        "dup": 23, "sendfile": 71, "connect": 203, "accept": 202, "sendto": 206, "recvfrom": 207, "sendmsg": 211,
        "recvmsg": 212, "shutdown": 210, "bind": 200, "listen": 201, "getsockname": 204, "getpeername": 205,
        "setsockopt": 208, "getsockopt": 209, "clone": 220, "fcntl": 25, "ptrace": 117, "pivot_root": 41,
        "chroot": 51, "mount": 40, "umount2": 39, "init_module": 105, "delete_module": 106, "kexec_load": 104,
        "add_key": 217, "request_key": 218, "keyctl": 219, "unshare": 97, "splice": 76, "tee": 77,
        "vmsplice": 75, "accept4": 242, "dup3": 24, "preadv": 69, "pwritev": 70, "perf_event_open": 241,
        "recvmmsg": 243, "name_to_handle_at": 264, "open_by_handle_at": 265, "sendmmsg": 269, "setns": 268,
        "process_vm_readv": 270, "process_vm_writev": 271, "kcmp": 272, "finit_module": 273,
        "kexec_file_load": 294, "bpf": 280, "userfaultfd": 282, "copy_file_range": 285, "preadv2": 286,
        "pwritev2": 287, "io_uring_setup": 425, "io_uring_enter": 426, "io_uring_register": 427, "clone3": 435,
        "close_range": 436, "pidfd_getfd": 438, "process_madvise": 440,
    }),
}

# Refused outright in the subject.
PROCESS_REFUSED = (
    "ptrace", "process_vm_readv", "process_vm_writev", "pidfd_getfd", "kcmp", "process_madvise", "unshare", "setns",
    "perf_event_open", "io_uring_setup", "io_uring_enter", "io_uring_register", "mount", "umount2", "pivot_root",
    "chroot", "init_module", "finit_module", "delete_module", "kexec_load", "kexec_file_load", "add_key",
    "request_key", "keyctl", "bpf", "userfaultfd", "name_to_handle_at", "open_by_handle_at",
)
# Refused on a channel descriptor, by the argument positions that name a descriptor.
CHANNEL_ARGUMENTS = {
    "read": (0,), "write": (0,), "readv": (0,), "writev": (0,), "pread64": (0,), "pwrite64": (0,),
    "preadv": (0,), "pwritev": (0,), "preadv2": (0,), "pwritev2": (0,), "recvfrom": (0,), "sendto": (0,),
    "recvmsg": (0,), "sendmsg": (0,), "recvmmsg": (0,), "sendmmsg": (0,), "shutdown": (0,), "setsockopt": (0,),
    "getsockopt": (0,), "connect": (0,), "bind": (0,), "listen": (0,), "accept": (0,), "accept4": (0,),
    "getsockname": (0,), "getpeername": (0,), "fcntl": (0,), "ioctl": (0,), "close": (0,), "dup": (0,),
    "dup2": (0, 1), "dup3": (0, 1), "sendfile": (0, 1), "splice": (0, 2), "tee": (0, 1), "vmsplice": (0,),
    "copy_file_range": (0, 2),
}


class SeccompUnavailable(OSError):
    """The kernel refused the filter (no seccomp, or no_new_privs could not be set)."""


@dataclass(frozen=True)
class Rule:
    """Refuse `syscall` with `error`: always, when argument `argument` equals `value` (all 64 bits), or when it has
    any bit of `mask` set."""

    syscall: str
    error: int = errno.EPERM
    argument: int | None = None
    value: int | None = None
    mask: int | None = None


def process_filter() -> list[Rule]:
    rules = [Rule(name) for name in PROCESS_REFUSED]
    rules.append(Rule("clone", argument=0, mask=NAMESPACE_FLAGS))
    rules.append(Rule("clone3", error=errno.ENOSYS))
    return rules


def channel_filter(descriptors: list[int]) -> list[Rule]:
    rules = [Rule(name, argument=position, value=fd)
             for fd in descriptors for name, positions in CHANNEL_ARGUMENTS.items() for position in positions]
    rules.append(Rule("close_range"))  # it could close a channel descriptor among others
    return rules


def compile_rules(rules: list[Rule], machine: str | None = None) -> bytes:
    """The BPF program: other architectures' calls (x86-64's 32-bit and x32 ones) are refused, each rule is a block
    that reloads the call's number, and whatever no rule refuses is allowed. Rules for calls this architecture
    lacks are left out."""
    arch, numbers = SYSCALLS[machine or platform.machine()]
    program: list[tuple[int, int, int, int]] = [
        (LD_ABS_W, 0, 0, OFFSET_ARCH), (JEQ_K, 1, 0, arch), (RET_K, 0, 0, RET_ERRNO | errno.ENOSYS),
        (LD_ABS_W, 0, 0, OFFSET_NR), (JGE_K, 0, 1, X32_SYSCALL_BIT), (RET_K, 0, 0, RET_ERRNO | errno.ENOSYS),
    ]
    for rule in rules:
        if rule.syscall in numbers:
            program += _block(rule, numbers[rule.syscall])
    program.append((RET_K, 0, 0, RET_ALLOW))
    if len(program) > MAX_INSTRUCTIONS:
        raise ValueError(f"a seccomp program of {len(program)} instructions (at most {MAX_INSTRUCTIONS})")
    return b"".join(struct.pack("HBBI", *instruction) for instruction in program)


def _block(rule: Rule, number: int) -> list[tuple[int, int, int, int]]:
    refuse = (RET_K, 0, 0, RET_ERRNO | rule.error)
    if rule.argument is None:
        return [(LD_ABS_W, 0, 0, OFFSET_NR), (JEQ_K, 0, 1, number), refuse]
    low, high = 16 + 8 * rule.argument, 20 + 8 * rule.argument  # seccomp_data.args, little-endian halves
    if rule.mask is not None:  # namespace flags live in the low half
        return [(LD_ABS_W, 0, 0, OFFSET_NR), (JEQ_K, 0, 3, number), (LD_ABS_W, 0, 0, low),
                (JSET_K, 0, 1, rule.mask), refuse]
    assert rule.value is not None
    return [(LD_ABS_W, 0, 0, OFFSET_NR), (JEQ_K, 0, 5, number), (LD_ABS_W, 0, 0, low),
            (JEQ_K, 0, 3, rule.value & 0xFFFFFFFF), (LD_ABS_W, 0, 0, high), (JEQ_K, 0, 1, rule.value >> 32), refuse]


_libc = ctypes.CDLL(None, use_errno=True)


class _Program(ctypes.Structure):
    _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.c_void_p)]


def install(rules: list[Rule], all_threads: bool = False) -> None:
    """Filter the calling thread (and whatever it starts from now on), or with `all_threads` every thread of the
    process (those CUDA started before included). Raises `SeccompUnavailable`."""
    code = compile_rules(rules)
    buffer = ctypes.create_string_buffer(code, len(code))
    program = _Program(len(code) // 8, ctypes.cast(buffer, ctypes.c_void_p))
    if _libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0:
        raise SeccompUnavailable(ctypes.get_errno(), "prctl(PR_SET_NO_NEW_PRIVS) refused")
    if all_threads:
        result = _libc.syscall(SECCOMP_SYSCALL[platform.machine()], SECCOMP_SET_MODE_FILTER_OP,
                               SECCOMP_FILTER_FLAG_TSYNC, ctypes.byref(program))
        what = "seccomp(SECCOMP_SET_MODE_FILTER, TSYNC)"
    else:
        result = _libc.prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, ctypes.byref(program), 0, 0)
        what = "prctl(PR_SET_SECCOMP)"
    if result != 0:
        number = ctypes.get_errno()
        raise SeccompUnavailable(number, f"{what}: {os.strerror(number) if result < 0 else f'thread {result}'}")


def supported() -> str:
    """"" where filters can be installed on this machine, else why not."""
    if platform.machine() not in SYSCALLS:
        return f"unavailable: no system-call table for {platform.machine()}"
    if _libc.prctl(PR_GET_SECCOMP, 0, 0, 0, 0) < 0 and ctypes.get_errno() == errno.EINVAL:
        return "unavailable: this kernel has no seccomp (CONFIG_SECCOMP)"
    return ""
