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
import ctypes
import gc
import json
import os
import select
import signal
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

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

from drkernel.sandbox import audit, channel, confine, isolate, judge, procfs, relay, startup, subject, timing
from drkernel.sandbox.gate import DeviceGate
from drkernel.sandbox.subject_link import ChildSubject, SubjectLink
from drkernel.schema import ErrorKind, EvalRequest, EvalResult, Status

GO_POLL_S = 0.002
PR_SET_DUMPABLE = 4
SCRATCH = "subject"  # the subject's folder inside the working directory: the only place it writes (and the cache)


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


def _set_up_failed(report_fd: int, exc: BaseException) -> None:
    """Report the harness's own failure to set an evaluation's processes up, and end this one."""
    _report_result(report_fd, EvalResult.failed(Status.INVALID, ErrorKind.SANDBOX_ERROR,
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
        child_main(job, 1, inherited_fds, report_fd, private_proc=True)
    os.close(report_fd)
    os.set_inheritable(status_fd, True)
    _exec_small(REAPER, str(evaluation), str(status_fd))


def child_main(job: dict[str, Any], parent_pid: int, inherited_fds: list[int], report_fd: int,
               private_proc: bool = False) -> None:
    """The judge's process: set up, fork the subject, prepare, wait for the start signal, evaluate, report."""
    workdir = job["workdir"]
    try:
        isolate.detach(parent_pid, new_session=not private_proc)  # in a namespace, PID 1 leads the group
        for fd in inherited_fds:
            os.close(fd)
        isolate.redirect_output(workdir)
        os.chdir(workdir)
        os.environ.update(HOME=workdir, TMPDIR=workdir, TRITON_CACHE_DIR=job["triton_cache"])
        tempfile.tempdir = workdir  # the fork server's imports already asked tempfile for its directory
        cpu = job["device"] == "cpu"
        if cpu:
            os.environ.update(TRITON_INTERPRET="1", CUDA_VISIBLE_DEVICES="")
        else:
            os.environ["CUDA_VISIBLE_DEVICES"] = str(job["gpu"])
        isolate.limit_resources(job["memory_limit_mb"] if cpu else None)
        networked = not isolate.isolate_network(allow_user_namespace=cpu)
        import faulthandler

        faulthandler.enable(file=sys.stderr, all_threads=False)
        device = torch.device("cpu") if cpu else torch.device("cuda", 0)
        scratch = Path(workdir) / SCRATCH
        scratch.mkdir(mode=0o700)
        os.chmod(workdir, 0o711)  # the subject, confined to its scratch folder, passes through, lists nothing
        gate_named = (Path(workdir) / "gate").exists()
        judge_end, subject_end = channel.pair()
        subject_pid = os.fork()
        if subject_pid == 0:
            judge_end.close()
            os.close(report_fd)
            subject_main(job, scratch, subject_end, device, os.getppid(), private_proc, gate_named)
        subject_end.close()
        ctypes.CDLL(None).prctl(PR_SET_DUMPABLE, 0, 0, 0, 0)  # the subject cannot trace it or open its descriptors
        _prepare(device, profiles=False)
        gate = DeviceGate.for_workdir(Path(workdir), lambda waiting: channel.report(report_fd, {"waiting": waiting}))
        started = time.perf_counter()
        confinement = confine.confine(workdir, job["triton_cache"], private_proc)
        confinement["pid_namespace"] = "private, own /proc" if private_proc else job["pid_namespace"]
        confinement["user_namespace"] = job["user_namespace"]
        confine_s = time.perf_counter() - started
        while not os.path.exists("go"):
            time.sleep(GO_POLL_S)
        channel.report(report_fd, {"started": True})  # a death of the fork server is now this evaluation's doing
        start_latency = time.time() - float(Path("go").read_text() or "nan")
        request = EvalRequest.from_dict(json.loads(Path("request.json").read_text()))
        link = SubjectLink(channel.Channel(judge_end), ChildSubject(subject_pid), scratch, device, gate)
        result = judge.judge_request(request, Path(workdir), device, gate, link)
        result.phases_s["start_latency"] = round(start_latency, 4)  # from the start signal to the judge
        result.phases_s["confine"] = round(confine_s, 4)  # before the start signal, overlapped with others' runs
        if result.environment is not None:
            result.environment.confinement = {**confinement, **result.environment.confinement}
        if networked:
            result.notes.append("sandbox: network namespace unavailable here; the candidate had network access")
    except isolate.LimitTooLow as exc:
        result = EvalResult.failed(Status.INVALID, ErrorKind.LIMIT_TOO_LOW, str(exc))
    except BaseException as exc:  # set-up failed before the candidate ran: the harness's problem, say so
        import traceback as _t
        result = EvalResult.failed(Status.INVALID, ErrorKind.SANDBOX_ERROR, f"sandbox set-up failed: {exc!r}",
                                   _t.format_exc())
    _report_result(report_fd, result)
    os._exit(0)


def subject_main(job: dict[str, Any], scratch: Path, conn: Any, device: torch.device, judge_pid: int,
                 private_proc: bool, gate_named: bool) -> None:
    """The subject's process: its own output files, folder and confinement; then it serves the judge's requests."""
    code = 0
    try:
        isolate.detach(judge_pid, new_session=False)  # dies with the judge, stays in its process group
        isolate.redirect_output(str(scratch))
        os.chdir(scratch)
        # inductor's cache inside the scratch space too: TORCHINDUCTOR_CACHE_DIR may come from the supervisor, and
        # what the candidate compiles, or torch._dynamo's first import (torch.library makes it), would write there
        os.environ.update(HOME=str(scratch), TMPDIR=str(scratch),
                          TORCHINDUCTOR_CACHE_DIR=str(scratch / "torchinductor"))
        tempfile.tempdir = str(scratch)
        _prepare(device, profiles=True)
        conn = relay.channel_out_of_the_way(conn)
        layers = confine.confine(str(scratch), job["triton_cache"], private_proc, filter_syscalls=True)
        subject.serve(channel.Channel(conn), scratch, device, gate_hooks=gate_named and device.type == "cuda",
                      confinement=layers)
    except channel.ChannelClosed:  # the judge is done with it
        pass
    except BaseException:
        import traceback

        traceback.print_exc()
        code = 1
    os._exit(code)


def _prepare(device: torch.device, profiles: bool) -> None:
    """A process's start-up before the evaluation; what it made is then frozen out of the garbage collector (below).
    Only the subject, which profiles the candidate, starts the profiler (CUPTI) here."""
    try:
        if device.type == "cuda":
            torch.cuda.init()
        startup.warm_up(device, profiles)
    except Exception as exc:
        raise isolate.blame_address_space("CUDA" if device.type == "cuda" else "the evaluation", exc) from exc
    _freeze_start_up()


def _freeze_start_up() -> None:
    """Leave every object made so far (torch's, Triton's, the CUDA set-up's: about 300,000) out of the cyclic garbage
    collector's passes: a full pass over them takes about 120 ms (measured on the CPU), a pause that lands inside
    an evaluation's phases, several of which hold the GPU for everyone. They live as long as the process anyway."""
    gc.freeze()


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


def _report_result(report_fd: int, result: EvalResult) -> None:
    try:
        text = result.to_dict()
    except (TypeError, ValueError) as exc:  # never blame the candidate for the harness's own failure
        text = EvalResult.failed(Status.INVALID, ErrorKind.SANDBOX_ERROR, f"unserialisable result: {exc}").to_dict()
    try:
        channel.report(report_fd, {"result": text})
    except (TypeError, ValueError) as exc:
        channel.report(report_fd, {"result": EvalResult.failed(
            Status.INVALID, ErrorKind.SANDBOX_ERROR, f"unserialisable result: {exc}").to_dict()})


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
    _freeze_start_up()  # before the forks: the children's collections skip the imports too
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
                        child_main(job, me, fds, report_w)
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
