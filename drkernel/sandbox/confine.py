"""What an evaluation process may read: layers, each applied where the kernel and the privileges allow, and each
reported (`Environment.confinement`) with the reason when it is not.

- pid_namespace: a private PID and mount namespace with its own /proc (the fork server creates it per evaluation;
  see drkernel.sandbox.forkserver): the candidate sees its own processes only, not their environments or command lines.
  As root the fork server makes it directly; as an ordinary user, inside a user namespace of the evaluation's own
  (`enter_user_namespaces`, as rootless containers do), which brings private network and IPC namespaces with it.
- uid: started as root, the evaluation drops to an unprivileged uid when the Python installation is readable by
  it, and otherwise stays uid 0 without any capability (root's own files stay readable, nothing else is). In a user
  namespace it keeps the user's own uid and gives up the capabilities the namespace granted it.
- landlock: the kernel refuses every path but the Python installation, the system's libraries and tools, the
  devices and the evaluation's own working directory and Triton cache; no TCP; no signals out of the sandbox.
- seccomp (the subject only): no tracing or reading of other processes, no new namespaces, no performance counters,
  no io_uring (drkernel.sandbox.seccomp); the candidate's thread is also kept off the channel to the judge.

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
from typing import Callable

from drkernel.sandbox import landlock, seccomp

SANDBOX_UID = SANDBOX_GID = 65534  # nobody / nogroup
CLONE_NEWNS, CLONE_NEWPID, CLONE_NEWUSER = 0x00020000, 0x20000000, 0x10000000
CLONE_NEWNET, CLONE_NEWIPC = 0x40000000, 0x08000000
MS_NOSUID, MS_NODEV, MS_NOEXEC, MS_REC, MS_PRIVATE = 2, 4, 8, 1 << 14, 1 << 18
PR_CAPBSET_DROP, PR_CAP_AMBIENT, PR_CAP_AMBIENT_CLEAR_ALL = 24, 47, 4
CAPABILITY_VERSION_3 = 0x20080522
ROOT_NAMESPACE, USER_NAMESPACE = "root", "user"  # how evaluations get their PID namespace (`namespace_way`)

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


def namespace_way(own_pid_namespace: int) -> tuple[str, str]:
    """How evaluations get a PID namespace here (`ROOT_NAMESPACE` or `USER_NAMESPACE`), or "" and why they cannot;
    tried as an evaluation would, in throwaway children (`own_pid_namespace`: an fd of /proc/self/ns/pid)."""
    if new_pid_namespace():
        if _tried_as_pid_1(mount_private_proc, own_pid_namespace):
            return ROOT_NAMESPACE, ""
        root_refusal = "unavailable: cannot mount a private /proc (no mount namespace)"
    else:
        root_refusal = f"unavailable: unshare(CLONE_NEWPID): {os.strerror(ctypes.get_errno() or 1)} (needs root)"
    reason = user_namespaces_refused()
    if not reason:
        return USER_NAMESPACE, ""
    return "", f"{root_refusal}; {reason}"


def _tried_as_pid_1(step: Callable[[], None], own_pid_namespace: int) -> bool:
    """Whether `step` works in the PID 1 of the namespace `new_pid_namespace` just made (a throwaway child)."""
    pid = os.fork()
    if pid == 0:
        try:
            step()
            os._exit(0)
        except BaseException:
            os._exit(1)
    restore_pid_namespace(own_pid_namespace)
    _, status = os.waitpid(pid, 0)
    return status == 0


def enter_user_namespaces() -> None:
    """Make the caller (single-threaded: a fresh fork) the only member of a new user namespace in which it keeps its
    own uid and gid, with new PID (for its next child), mount, network and IPC namespaces that the new user namespace
    owns: there it may mount a /proc of its own, which root's path does with privileges it has outside."""
    uid, gid = os.geteuid(), os.getegid()
    _check(_libc.unshare(CLONE_NEWUSER | CLONE_NEWPID | CLONE_NEWNS | CLONE_NEWNET | CLONE_NEWIPC),
           "unshare(CLONE_NEWUSER|CLONE_NEWPID|CLONE_NEWNS|CLONE_NEWNET|CLONE_NEWIPC)")
    for path, text in (("/proc/self/setgroups", "deny"), ("/proc/self/uid_map", f"{uid} {uid} 1"),
                       ("/proc/self/gid_map", f"{gid} {gid} 1")):
        with open(path, "w") as f:
            f.write(text)


def user_namespaces_refused() -> str:
    """Why `enter_user_namespaces` and a private /proc in it fail here ("" when they work), with the fix: tried in a
    throwaway child, as an evaluation would."""
    failure = answer_of_child(_user_namespace_probe)
    return f"unavailable: {failure}; {_user_namespace_fix(failure)}" if failure else ""


def _user_namespace_probe() -> str:
    try:
        enter_user_namespaces()
    except OSError as exc:
        return f"unshare: {exc}"
    return answer_of_child(_mount_probe)  # as PID 1 of the new PID namespace


def _mount_probe() -> str:
    try:
        mount_private_proc()
    except OSError as exc:
        return f"mount: {exc}"
    return ""


def answer_of_child(probe: Callable[[], str]) -> str:
    """`probe()`'s answer, computed in a forked child (whose namespaces and privileges it may change) and sent back
    on a pipe; one that raised answers what it raised, one that died says so."""
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(read)
        try:
            answer = probe()
        except BaseException as exc:
            answer = f"the probe failed: {exc!r}"
        os.write(write, answer.encode())
        os._exit(0)
    os.close(write)
    with os.fdopen(read, "rb") as f:
        answer = f.read().decode(errors="replace")
    _, status = os.waitpid(pid, 0)
    return answer if status == 0 or answer else "the probe failed (its process ended abnormally)"


def _user_namespace_fix(failure: str) -> str:
    """What a user (or an administrator) can change so that evaluations get their namespaces."""
    def sysctl(name: str) -> str:
        try:
            with open("/proc/sys/" + name.replace(".", "/")) as f:
                return f.read().strip()
        except OSError:
            return ""

    if failure.startswith("mount"):
        return ("fix: /proc cannot be mounted in a user namespace here (a container masks parts of the host's /proc); "
                "run the container with an unmasked /proc (e.g. podman/docker --security-opt systempaths=unconfined)")
    if sysctl("user.max_user_namespaces") == "0":
        return "fix: sysctl -w user.max_user_namespaces=15000 (it is 0)"
    if sysctl("kernel.unprivileged_userns_clone") == "0":
        return "fix: sysctl -w kernel.unprivileged_userns_clone=1"
    if sysctl("kernel.apparmor_restrict_unprivileged_userns") == "1":
        return ("fix: AppArmor restricts unprivileged user namespaces (Ubuntu 23.10+): add an AppArmor profile with "
                "'userns,' for this Python, or sysctl -w kernel.apparmor_restrict_unprivileged_userns=0")
    return ("fix: a seccomp profile or security module refuses user namespaces (a container's default profile does): "
            "run the container with a profile that allows unshare(CLONE_NEWUSER), or run drkernel as root")


def mount_private_proc() -> None:
    """In a new mount namespace, a /proc of the caller's PID namespace: the processes of the sandbox only."""
    _check(_libc.unshare(CLONE_NEWNS), "unshare(CLONE_NEWNS)")
    _check(_libc.mount(b"none", b"/", None, MS_REC | MS_PRIVATE, None), "mount --make-rprivate /")
    _check(_libc.mount(b"proc", b"/proc", b"proc", MS_NOSUID | MS_NODEV | MS_NOEXEC, None), "mount proc")


# -- the evaluation process itself, after its set-up and before the candidate ----------------------------------

def confine(workdir: str, triton_cache: str, private_proc: bool, filter_syscalls: bool = False) -> dict[str, str]:
    """Drop privileges, then restrict reads, then (the subject's) system calls; returns what each layer did, for the
    result's environment."""
    report = {"uid": _drop_privileges(workdir, triton_cache)}
    report["landlock"] = _restrict_paths(workdir, triton_cache, private_proc)
    if filter_syscalls:
        report["seccomp"] = _filter_syscalls()
    return report


def _filter_syscalls() -> str:
    reason = seccomp.supported()
    if reason:
        return reason
    try:
        seccomp.install(seccomp.process_filter(), all_threads=True)
    except OSError as exc:
        return f"unavailable: {exc}"
    return "no tracing, namespaces, perf counters, io_uring, mounts or BPF (every thread)"


def _drop_privileges(workdir: str, triton_cache: str) -> str:
    if os.geteuid() != 0:
        if not _has_capabilities():
            return f"{os.geteuid()} (not started as root)"
        _drop_capabilities()  # those a user namespace of the evaluation's own granted
        return f"{os.geteuid()} in a user namespace of its own, without capabilities"
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


def _has_capabilities() -> bool:
    with open("/proc/self/status") as f:
        return any(line.startswith("CapEff:") and int(line.split()[1], 16) for line in f)


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
    paths |= _import_roots() | set(os.environ.get("LD_LIBRARY_PATH", "").split(":"))
    paths |= {os.environ.get(name, "") for name in ("CUDA_HOME", "CUDA_PATH", "TRITON_PTXAS_PATH")}
    # Triton's C compiler (CC, else gcc or clang on PATH) and binutils, wherever installed (/usr, /opt/gcc, ...).
    tools = [os.environ.get("CC", "")] + [shutil.which(name) or "" for name in ("gcc", "clang", "cc", "as", "ld")]
    for tool in filter(None, tools):
        paths |= {os.path.dirname(os.path.dirname(t)) for t in (tool, os.path.realpath(tool))}
    paths = {p for p in paths if p and os.path.exists(p)}
    return sorted(os.path.realpath(p) for p in paths if os.path.realpath(p) not in homes)


def _import_roots() -> set[str]:
    """What imports may read: each entry of sys.path inside the installation (the standard library, site-packages),
    and of any other entry (a project on PYTHONPATH, an editable install's source tree) only the packages loaded from
    it, never the folder itself: a project's .env or keys beside its code stay out of reach."""
    prefixes = {os.path.realpath(p) + os.sep for p in (sys.prefix, sys.base_prefix, sys.exec_prefix,
                                                        sys.base_exec_prefix)}
    roots = {p for p in sys.path if p and (os.path.realpath(p) + os.sep).startswith(tuple(prefixes))}
    for module in list(sys.modules.values()):
        origin = getattr(module, "__file__", None)
        name = getattr(module, "__name__", "")
        if not origin or "." in name:
            continue
        real = os.path.realpath(origin)
        if any(real.startswith(prefix) for prefix in prefixes):
            continue
        roots.add(os.path.dirname(real) if os.path.basename(real) == "__init__.py" else real)
    return roots


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
