"""What an evaluation process may read: layers, each applied where the kernel and the privileges allow, and each
reported (`Environment.confinement`) with the reason when it is not.

- pid_namespace: a private PID and mount namespace with its own /proc (the fork server creates it per evaluation;
  see drkernel.sandbox.zygote): the candidate sees its own processes only, not their environments or command lines.
- uid: started as root, the evaluation drops to an unprivileged uid when the Python installation is readable by
  it, and otherwise stays uid 0 without any capability (root's own files stay readable, nothing else is).
- landlock: the kernel refuses every path but the Python installation, the system's libraries and tools, the
  devices and the evaluation's own working directory and Triton cache; no TCP; no signals out of the sandbox.

Why all of this: the candidate's code is untrusted, and whatever it reads can come back in its error text, to the
submitter, into RL trajectories and logs.
"""

from __future__ import annotations

import ctypes
import glob
import os
import shutil
import stat
import sys

from drkernel.sandbox import landlock

SANDBOX_UID = SANDBOX_GID = 65534  # nobody / nogroup
CLONE_NEWNS, CLONE_NEWPID = 0x00020000, 0x20000000
MS_NOSUID, MS_NODEV, MS_NOEXEC, MS_REC, MS_PRIVATE = 2, 4, 8, 1 << 14, 1 << 18
PR_CAPBSET_DROP, PR_CAP_AMBIENT, PR_CAP_AMBIENT_CLEAR_ALL = 24, 47, 4
CAPABILITY_VERSION_3 = 0x20080522

# Read-only: what Python, torch, Triton's compiler (ptxas, a C compiler for launcher stubs) and CUDA read.
SYSTEM_READ_ONLY = [
    "/usr", "/lib", "/lib64", "/lib32", "/bin", "/sbin", "/opt/nvidia", "/sys",
    "/etc/ld.so.cache", "/etc/ld.so.conf", "/etc/ld.so.conf.d", "/etc/alternatives", "/etc/localtime",
    "/etc/nsswitch.conf", "/etc/passwd", "/etc/group", "/etc/os-release", "/etc/nvidia",
    "/dev/urandom", "/dev/random", "/dev/zero", "/dev/full",
    "/proc/cpuinfo", "/proc/meminfo", "/proc/stat", "/proc/driver/nvidia", "/proc/sys", "/proc/filesystems",
]
DEVICE_READ_WRITE = ["/dev/null", "/dev/shm", "/dev/nvidia-caps", "/dev/nvidia-uvm", "/dev/nvidia-uvm-tools",
                     "/dev/nvidiactl", "/dev/nvidia-modeset"]

_libc = ctypes.CDLL(None, use_errno=True)


# -- PID and mount namespace (called by the fork server) --------------------------------------------------------

def new_pid_namespace() -> bool:
    """The caller's next child is PID 1 of a fresh PID namespace (root only). Undo with `restore_pid_namespace`."""
    return _libc.unshare(CLONE_NEWPID) == 0


def restore_pid_namespace(own: int) -> None:
    """Later children are born in the caller's own PID namespace again (`own`: an fd of /proc/self/ns/pid)."""
    _check(_libc.setns(own, CLONE_NEWPID), "setns(CLONE_NEWPID)")


def mount_private_proc() -> None:
    """In a new mount namespace, a /proc of the caller's PID namespace: the processes of the sandbox only."""
    _check(_libc.unshare(CLONE_NEWNS), "unshare(CLONE_NEWNS)")
    _check(_libc.mount(b"none", b"/", None, MS_REC | MS_PRIVATE, None), "mount --make-rprivate /")
    _check(_libc.mount(b"proc", b"/proc", b"proc", MS_NOSUID | MS_NODEV | MS_NOEXEC, None), "mount proc")


# -- the evaluation process itself, after its set-up and before the candidate ----------------------------------

def confine(workdir: str, triton_cache: str, private_proc: bool) -> dict[str, str]:
    """Drop privileges, then restrict reads; returns what each layer did, for the result's environment."""
    report = {"uid": _drop_privileges(workdir, triton_cache)}
    report["landlock"] = _restrict_paths(workdir, triton_cache, private_proc)
    return report


def _drop_privileges(workdir: str, triton_cache: str) -> str:
    if os.geteuid() != 0:
        return f"{os.geteuid()} (not started as root)"
    blocked = [p for p in _installation() if not _reachable_by_others(p)]
    blocked += [p for p in (workdir, triton_cache) if not _reachable_by_others(os.path.dirname(p), read=False)]
    if blocked:
        _drop_capabilities()
        return (f"0 without capabilities ({blocked[0]} is not readable by uid {SANDBOX_UID}, so the evaluation "
                "keeps root's uid)")
    for path in [workdir, triton_cache] + [os.path.join(workdir, name) for name in os.listdir(workdir)]:
        os.chown(path, SANDBOX_UID, SANDBOX_GID)
    os.setgroups([])
    os.setgid(SANDBOX_GID)
    os.setuid(SANDBOX_UID)
    return str(SANDBOX_UID)


def _drop_capabilities() -> None:
    """uid 0 without capabilities: file permissions apply as to any owner; no mount, ptrace, raw devices."""
    for cap in range(64):
        if _libc.prctl(PR_CAPBSET_DROP, cap, 0, 0, 0) != 0:
            break  # past the last capability this kernel knows
    _libc.prctl(PR_CAP_AMBIENT, PR_CAP_AMBIENT_CLEAR_ALL, 0, 0, 0)
    header = (ctypes.c_uint32 * 2)(CAPABILITY_VERSION_3, 0)
    data = (ctypes.c_uint32 * 6)()  # effective, permitted, inheritable; two 32-bit words each: all empty
    _check(_libc.capset(header, data), "capset")


def _restrict_paths(workdir: str, triton_cache: str, private_proc: bool) -> str:
    abi = landlock.abi_version()
    if abi < 1:
        return "unavailable: this kernel has no Landlock (Linux 5.13+ with landlock in its LSM list)"
    # Without a PID namespace of its own, /proc holds every process: the evaluation gets its own entry only.
    proc = ["/proc"] if private_proc else [f"/proc/{os.getpid()}"]
    read_only = _installation() + SYSTEM_READ_ONLY + proc
    read_write = [workdir, triton_cache] + DEVICE_READ_WRITE + sorted(glob.glob("/dev/nvidia[0-9]*"))
    earlier_threads = len(os.listdir("/proc/self/task")) - 1
    try:
        landlock.restrict(read_only, read_write)
    except OSError as exc:
        return f"unavailable: {exc}"
    if earlier_threads:  # Landlock confines the calling thread and those it starts, not threads already running
        return f"abi {abi}; {earlier_threads} thread(s) started before it (CUDA's, the profiler's) stay outside it"
    return f"abi {abi}"


def _installation() -> list[str]:
    """The Python installation, every directory imports and shared libraries come from, CUDA's toolkit, the C
    compiler (never `/` or a bare home directory)."""
    homes = {"/", "/root", "/home", os.path.expanduser("~")} | set(glob.glob("/home/*"))
    paths = {sys.prefix, sys.base_prefix, sys.exec_prefix, sys.base_exec_prefix, os.path.dirname(sys.executable)}
    paths |= set(sys.path) | set(os.environ.get("LD_LIBRARY_PATH", "").split(":"))
    paths |= {os.environ.get(name, "") for name in ("CUDA_HOME", "CUDA_PATH", "TRITON_PTXAS_PATH")}
    # Triton's C compiler (CC, else gcc or clang on PATH) and binutils, wherever installed (/usr, /opt/gcc, ...).
    tools = [os.environ.get("CC", "")] + [shutil.which(name) or "" for name in ("gcc", "clang", "cc", "as", "ld")]
    for tool in filter(None, tools):
        paths |= {os.path.dirname(os.path.dirname(t)) for t in (tool, os.path.realpath(tool))}
    paths = {p for p in paths if p and os.path.exists(p)}
    return sorted(os.path.realpath(p) for p in paths if os.path.realpath(p) not in homes)


def _reachable_by_others(path: str, read: bool = True) -> bool:
    """Whether a user with no relation to the owners can reach (every parent searchable) and read `path`."""
    path = os.path.realpath(path)
    try:
        if not os.stat(path).st_mode & (stat.S_IROTH if read else stat.S_IXOTH):
            return False
        while path != "/":
            path = os.path.dirname(path)
            if not os.stat(path).st_mode & stat.S_IXOTH:
                return False
    except OSError:
        return False
    return True


def _check(value: int, what: str) -> None:
    if value != 0:
        errno = ctypes.get_errno()
        raise OSError(errno, f"{what}: {os.strerror(errno)}")
