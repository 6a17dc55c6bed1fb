"""Fork server: imports torch and triton once, never touches CUDA, and forks one evaluation per request.

Protocol on stdin/stdout, one JSON object per line:
  supervisor -> fork server  {"id", "workdir", "device": "cuda"|"cpu", "gpu", "memory_limit_mb", "triton_cache"}
  fork server -> supervisor  {"ready": pid} once; {"id", "pid"} after each fork; {"id", "event": {...}} for what the
                        judge reports ({"started"}, {"waiting": bool}, {"result": {...}}); {"id", "status"} when it
                        exits (a raw wait status)
An evaluation is two processes. The judge (drkernel.sandbox.judge) forks the subject (drkernel.sandbox.subject)
before either touches CUDA; both prepare (hardening, CUDA initialisation, confinement: the subject writes only in
its scratch folder), then the judge waits for the file `go` in its working directory, evaluates `request.json`, and
reports on a pipe that only it holds: the subject never has it, and the judge is not dumpable, so the subject can
reach neither its descriptors nor its memory. Nothing the subject writes is read as a result or a signal.

Each evaluation gets a PID namespace of its own where the kernel allows: its PID 1 mounts a /proc of that namespace,
forks the judge (PID 2) and becomes a small reaper (`REAPER`, exec'd so that it holds none of torch's memory) that
hands the judge's wait status back through a pipe; when it ends, the kernel ends every process left in the
namespace. As root the fork server makes the namespace itself (the forked process is PID 1). As an ordinary user, the
forked process first enters a user namespace of its own with new PID, mount, network and IPC namespaces
(`confine.enter_user_namespaces`), forks PID 1, and becomes a waiter (`WAITER`, exec'd too) that ends with it. Where
neither is allowed (user namespaces disabled by a sysctl, an AppArmor rule or a container's seccomp profile), the
evaluation runs without one, and its result's `environment.confinement` says why (`drkernel doctor` says so before).
"""

from __future__ import annotations

import contextlib
import gc
import json
import os
import select
import signal
import sys
import threading
from typing import Any, Callable

if __name__ == "__main__":
    # No cyclic collection while the fork server imports: the collector's passes over the objects torch's import
    # makes took 0.6 s of 3.65 on an H100's host (a fifth on the CPU). Python's own advice for a process that forks
    # without exec: collector off early, frozen before the fork (`serve`). The imports' garbage is frozen with the
    # rest: about 8,800 objects, 7 MB, none holding a file or socket (on the CPU, where collecting them takes 0.2 s).
    gc.disable()

import triton  # noqa: E402, F401  (without torch: Triton's cache key is hashed while torch imports, below)
from triton.runtime.cache import triton_key  # noqa: E402

# Hashing Triton's installation (0.42 s on an H100's host, most of it a 500 MB library, with the GIL released)
# overlaps the fork server's import of torch; `_preload` waits for it before any fork.
_TRITON_KEY = threading.Thread(target=triton_key, name="drkernel-triton-key", daemon=True)
if __name__ == "__main__":
    _TRITON_KEY.start()

import torch  # noqa: E402
# With sympy: the first `torch._check` of a process imports it (0.2-0.35 s on an H100's host), and the judge's estimate
# of a task's memory on the meta device makes one in every evaluation. torch._dynamo is not imported: see guards.
import torch.fx.experimental.symbolic_shapes  # noqa: E402, F401
import triton.runtime.interpreter  # noqa: E402, F401  (the launch recorder wraps its launcher)
import triton.testing  # noqa: E402, F401

from drkernel.sandbox import audit, confine, isolate, judge_host, processes, procfs, startup, timing
from drkernel.schema import ErrorKind, EvalResult, Status



REAPER = """
import os, sys
evaluation, report = int(sys.argv[1]), int(sys.argv[2])
while True:
    pid, status = os.waitpid(-1, 0)  # PID 1 reaps every orphan of the namespace
    if pid == evaluation:
        os.write(report, str(status).encode())
        break
"""


WAITER = """
import os, sys
os.waitpid(int(sys.argv[1]), 0)
"""

def user_namespace_init(job: dict[str, Any], parent_pid: int, inherited_fds: list[int], report_fd: int,
                        status_fd: int) -> None:
    """The fork server's child where only an unprivileged user namespace can give the evaluation a PID namespace: it
    leads the evaluation's process group (the supervisor kills and measures the group by its pid), enters the
    namespaces, forks their PID 1 (`namespace_init`) and waits for it, exec'd into `WAITER`."""
    try:
        isolate.detach(parent_pid)
        confine.enter_user_namespaces()
    except BaseException as exc:
        _set_up_failed(report_fd, exc)
    init = os.fork()
    if init == 0:
        namespace_init(job, inherited_fds, report_fd, status_fd, leads_group=False)
    os.close(report_fd)
    os.close(status_fd)
    _exec_small(WAITER, str(init))


def main_of(job: dict[str, Any]) -> Callable[..., None]:
    """The judge's main function a job asks for: one evaluation's, or a judge host's (drkernel.sandbox.judge_host)."""
    return judge_host.host_main if job.get("host") else processes.judge_main


def _set_up_failed(report_fd: int, exc: BaseException) -> None:
    """Report the harness's own failure to set an evaluation's processes up, and end this one."""
    processes.report_result(report_fd, EvalResult.failed(Status.INVALID, ErrorKind.SANDBOX_ERROR,
                                                 f"sandbox set-up failed: {exc!r}"))
    os._exit(0)


def _exec_small(program: str, *args: str) -> None:
    """Become a small Python program that holds none of torch's memory and none of the fork server's pipes."""
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)
    os.execv(sys.executable, [sys.executable, "-S", "-I", "-c", program, *args])


def namespace_init(job: dict[str, Any], inherited_fds: list[int], report_fd: int, status_fd: int,
                   leads_group: bool = True) -> None:
    """PID 1 of the evaluation's PID namespace: mount its /proc, fork the judge, become the reaper."""
    try:
        os.chdir(job["workdir"])
        isolate.detach(0, new_session=leads_group)  # the parent is outside the namespace: its pid reads as 0 here
        confine.mount_private_proc()
    except BaseException as exc:
        _set_up_failed(report_fd, exc)
    evaluation = os.fork()
    if evaluation == 0:
        os.close(status_fd)
        main_of(job)(job, 1, inherited_fds, report_fd, private_proc=True)
    os.close(report_fd)
    os.set_inheritable(status_fd, True)
    _exec_small(REAPER, str(evaluation), str(status_fd))


def _preload() -> None:
    """One-time costs every subject would pay at its first kernel, paid once here (measured on an H100's host, per
    subject: 0.45 s hashing Triton's installation for its cache key, 0.15 s importing Gluon's modules, which Triton's
    specialisation imports at a kernel's first launch; 11-25 ms on the CPU for numpy's first bootstrap, which the
    judge computes while it holds the GPU alone); and the list of torch's functions the judge calls past their
    `torch._disable_dynamo` wrappers (`startup.find_dynamo_disabled`: 0.03 s on the CPU). Nothing here touches CUDA: the
    evaluations fork from here."""
    if _TRITON_KEY.ident is not None:
        _TRITON_KEY.join()
    triton_key()  # cached by now when the fork server started the hashing
    timing.speedup_interval([1.0, 1.0], [1.0, 1.0], seed=0)
    with contextlib.suppress(ImportError):  # the modules Triton versions with Gluon import at a first launch
        import triton.experimental.gluon.language  # noqa: F401
        import triton.experimental.gluon.nvidia.hopper  # noqa: F401
    startup.find_dynamo_disabled()  # once everything is imported


def _stop_writing_bytecode() -> None:
    """The fork server's bytecode folder (drkernel.runner.forkserver.sandbox_environment) served its own imports
    only: evaluations, and any Python they start, read and write none of it (a candidate's bytecode there would run in
    the next fork server), and import what they import later as before, from the installation's own bytecode."""
    sys.dont_write_bytecode = True
    sys.pycache_prefix = None
    os.environ.pop("PYTHONPYCACHEPREFIX", None)
    os.environ["PYTHONDONTWRITEBYTECODE"] = "1"


def serve() -> None:
    _preload()
    _stop_writing_bytecode()
    audit.AUDIT.install()  # inherited by every evaluation; it acts in the subject, once it knows the candidate's file
    processes.freeze_start_up()  # before the forks: the children's collections skip the imports too
    gc.enable()  # off while the fork server imported (above); every evaluation collects as before
    me = os.getpid()
    wake_r, wake_w = os.pipe()
    os.set_blocking(wake_w, False)
    signal.set_wakeup_fd(wake_w)
    signal.signal(signal.SIGCHLD, lambda *_: None)
    own_pid_namespace = os.open("/proc/self/ns/pid", os.O_RDONLY | os.O_CLOEXEC)
    namespaces, no_namespace = confine.namespace_way(own_pid_namespace)
    jobs: dict[int, tuple[str, int | None, int]] = {}  # pid -> (job id, the reaper's status pipe, the judge's reports)
    reports: dict[int, tuple[str, bytearray]] = {}  # the judge's report pipe -> (job id, an unfinished line)
    send, proto_fd = _sender()
    send({"ready": me})
    pending = b""
    while True:
        readable, _, _ = select.select([0, wake_r, *reports], [], [])
        for fd in [fd for fd in readable if fd in reports]:
            _forward(fd, reports, send)
        if wake_r in readable:
            os.read(wake_r, 4096)
            _reap(jobs, reports, send)
        if 0 in readable:
            chunk = os.read(0, 1 << 16)
            if not chunk:  # the supervisor is gone: take every running evaluation with us
                for pid in jobs:
                    procfs.kill_group(pid)
                return
            pending += chunk
            *lines, pending = pending.split(b"\n")
            for line in lines:
                if line.strip():
                    job = json.loads(line)
                    private = namespaces == confine.USER_NAMESPACE or (
                        namespaces == confine.ROOT_NAMESPACE and confine.new_pid_namespace())
                    job["pid_namespace"] = no_namespace or "unavailable: unshare(CLONE_NEWPID) failed"
                    job["user_namespace"] = USER_NAMESPACE_NOTES.get(namespaces, "unavailable (see pid_namespace)")
                    status_r, status_w = os.pipe() if private else (None, None)
                    report_r, report_w = os.pipe()
                    pid = os.fork()
                    if pid == 0:
                        fds = [wake_r, wake_w, proto_fd, own_pid_namespace, report_r, *reports]
                        if private:
                            os.close(status_r)
                            if namespaces == confine.USER_NAMESPACE:
                                user_namespace_init(job, me, fds, report_w, status_w)
                            namespace_init(job, fds, report_w, status_w)
                        main_of(job)(job, me, fds, report_w)
                    os.close(report_w)
                    if private:
                        if namespaces == confine.ROOT_NAMESPACE:
                            confine.restore_pid_namespace(own_pid_namespace)
                        os.close(status_w)
                    jobs[pid] = (job["id"], status_r, report_r)
                    reports[report_r] = (job["id"], bytearray())
                    send({"id": job["id"], "pid": pid})


def _forward(fd: int, reports: dict[int, tuple[str, bytearray]], send: Any, drain: bool = False) -> None:
    """Pass the judge's complete report lines on, tagged with its job; forget the pipe at its end. With `drain` (the
    judge has exited), read everything left without waiting."""
    job_id, buffer = reports[fd]
    while True:
        try:
            chunk = os.read(fd, 1 << 16) if not drain or _ready(fd) else b""
        except OSError:
            chunk = b""
        buffer += chunk
        *lines, rest = bytes(buffer).split(b"\n")
        buffer[:] = rest
        for line in lines:
            try:
                event = json.loads(line)
            except ValueError:
                continue
            if isinstance(event, dict):
                send({"id": job_id, "event": event})
        if not chunk:
            os.close(fd)
            del reports[fd]
            return
        if not drain:
            return


def _ready(fd: int) -> bool:
    return bool(select.select([fd], [], [], 0)[0])


USER_NAMESPACE_NOTES = {confine.ROOT_NAMESPACE: "not needed (started as root)",
                        confine.USER_NAMESPACE: "private (the user's own uid and gid mapped), with network and IPC "
                                                "namespaces"}


def _reap(jobs: dict[int, tuple[str, int | None, int]], reports: dict[int, tuple[str, bytearray]],
          send: Any) -> None:
    while jobs:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return
        if pid in jobs:
            job_id, status_pipe, report = jobs.pop(pid)
            if status_pipe is not None:  # the status of the judge, not of its namespace's reaper
                text = os.read(status_pipe, 64)
                os.close(status_pipe)
                status = int(text) if text else status
            if reports.get(report, ("",))[0] == job_id:  # what the judge reported before it ended goes first
                _forward(report, reports, send, drain=True)
            send({"id": job_id, "status": status})


def _sender() -> tuple[Any, int]:
    proto_fd = os.dup(1)
    out = os.fdopen(proto_fd, "w", buffering=1)
    os.dup2(os.open(os.devnull, os.O_WRONLY), 1)  # stray prints of imported libraries cannot break the protocol

    def send(message: dict[str, Any]) -> None:
        out.write(json.dumps(message) + "\n")
        out.flush()

    return send, proto_fd


if __name__ == "__main__":
    serve()
    gc.unfreeze()  # Python's shutdown frees start-up's objects again (left frozen, nanobind reports them leaked)
