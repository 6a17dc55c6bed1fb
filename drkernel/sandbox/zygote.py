"""Fork server: imports torch and triton once, never touches CUDA, and forks one process per evaluation.

Protocol on stdin/stdout, one JSON object per line:
  supervisor -> zygote  {"id", "workdir", "device": "cuda"|"cpu", "gpu", "memory_limit_mb", "triton_cache"}
  zygote -> supervisor  {"ready": pid} once; {"id", "pid"} after each fork; {"id", "status"} when it exits
The child prepares (hardening, CUDA initialisation, confinement), waits for the file `go` in its working directory,
evaluates `request.json` and writes `result.json`. Exit statuses are raw wait statuses.

Where the kernel allows (root), each evaluation gets a PID namespace of its own: the forked process is its PID 1,
mounts a /proc of that namespace, forks the evaluation (PID 2) and becomes a small reaper (`REAPER`, exec'd so that
it holds none of torch's memory) that hands the evaluation's wait status back through a pipe. PID 1 of a namespace
ignores the signals its namespace sends it, so the evaluation itself must not be PID 1: a candidate killing itself
still dies, one killing its parent cannot.
"""

from __future__ import annotations

import ctypes
import json
import os
import select
import signal
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import torch
import torch.profiler  # noqa: F401  (imported once here, not in every evaluation)
import triton.testing  # noqa: F401

from drkernel.sandbox import confine, isolate, pipeline, procfs
from drkernel.sandbox.gate import DeviceGate
from drkernel.schema import EvalRequest, EvalResult, Status

GO_POLL_S = 0.002


REAPER = """
import os, sys
evaluation, report = int(sys.argv[1]), int(sys.argv[2])
while True:
    pid, status = os.waitpid(-1, 0)  # PID 1 reaps every orphan of the namespace
    if pid == evaluation:
        os.write(report, str(status).encode())
        break
"""


def namespace_init(job: dict[str, Any], inherited_fds: list[int], report_fd: int) -> None:
    """PID 1 of the evaluation's PID namespace: mount its /proc, fork the evaluation, become the reaper."""
    try:
        os.chdir(job["workdir"])
        isolate.detach(0)  # the fork server is outside the namespace: its pid reads as 0 from here
        confine.mount_private_proc()
    except BaseException as exc:
        _write_result(EvalResult.failure(Status.INVALID, "SandboxError", f"sandbox set-up failed: {exc!r}"))
        os._exit(0)
    evaluation = os.fork()
    if evaluation == 0:
        os.close(report_fd)
        child_main(job, 1, inherited_fds, private_proc=True)
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)  # the reaper holds none of the fork server's pipes
    os.set_inheritable(report_fd, True)
    os.execv(sys.executable, [sys.executable, "-S", "-I", "-c", REAPER, str(evaluation), str(report_fd)])


def child_main(job: dict[str, Any], parent_pid: int, inherited_fds: list[int], private_proc: bool = False) -> None:
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
        try:
            if not cpu:
                torch.cuda.init()
            pipeline.warm_up(device)
        except Exception as exc:
            raise isolate.blame_address_space("CUDA" if not cpu else "the evaluation", exc) from exc
        gate = DeviceGate.for_workdir(Path(workdir))  # its lock files lie outside what confinement leaves readable
        started = time.perf_counter()
        confinement = confine.confine(workdir, job["triton_cache"], private_proc)
        confinement["pid_namespace"] = "private, own /proc" if private_proc else job["pid_namespace"]
        confine_s = time.perf_counter() - started
        while not os.path.exists("go"):
            time.sleep(GO_POLL_S)
        Path("started").touch()  # from here on, a death of the fork server is this evaluation's doing
        start_latency = time.time() - float(Path("go").read_text() or "nan")
        request = EvalRequest.from_dict(json.loads(Path("request.json").read_text()))
        result = pipeline.evaluate(request, Path(workdir), device, gate)
        result.phases_s["start_latency"] = round(start_latency, 4)  # from the start signal to the pipeline
        result.phases_s["confine"] = round(confine_s, 4)  # before the start signal, overlapped with others' runs
        if result.environment is not None:
            result.environment.confinement = confinement
        if networked:
            result.notes.append("sandbox: network namespace unavailable here; the candidate had network access")
    except isolate.LimitTooLow as exc:
        result = EvalResult.failure(Status.INVALID, "LimitTooLow", str(exc))
    except BaseException as exc:  # set-up failed before the candidate ran: the harness's problem, say so
        result = EvalResult.failure(Status.INVALID, "SandboxError", f"sandbox set-up failed: {exc!r}")
    _write_result(result)
    os._exit(0)


def _write_result(result: EvalResult) -> None:
    try:
        text = result.to_json()
    except (TypeError, ValueError) as exc:  # never blame the candidate for the harness's own failure
        text = EvalResult.failure(Status.INVALID, "SandboxError", f"unserialisable result: {exc}").to_json()
    tmp = Path("result.json.tmp")
    tmp.write_text(text)
    tmp.rename("result.json")


def serve() -> None:
    me = os.getpid()
    wake_r, wake_w = os.pipe()
    os.set_blocking(wake_w, False)
    signal.set_wakeup_fd(wake_w)
    signal.signal(signal.SIGCHLD, lambda *_: None)
    own_pid_namespace = os.open("/proc/self/ns/pid", os.O_RDONLY | os.O_CLOEXEC)
    no_namespace = _pid_namespace_unavailable(own_pid_namespace)
    jobs: dict[int, tuple[str, int | None]] = {}  # pid -> (job id, read end of the reaper's report)
    send, proto_fd = _sender()
    send({"ready": me})
    pending = b""
    while True:
        readable, _, _ = select.select([0, wake_r], [], [])
        if wake_r in readable:
            os.read(wake_r, 4096)
            _reap(jobs, send)
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
                    private = not no_namespace and confine.new_pid_namespace()
                    job["pid_namespace"] = no_namespace or "unavailable: unshare(CLONE_NEWPID) failed"
                    report_r, report_w = os.pipe() if private else (None, None)
                    pid = os.fork()
                    if pid == 0:
                        fds = [wake_r, wake_w, proto_fd, own_pid_namespace]
                        if private:
                            os.close(report_r)
                            namespace_init(job, fds, report_w)
                        child_main(job, me, fds)
                    if private:
                        confine.restore_pid_namespace(own_pid_namespace)
                        os.close(report_w)
                    jobs[pid] = (job["id"], report_r)
                    send({"id": job["id"], "pid": pid})


def _pid_namespace_unavailable(own_pid_namespace: int) -> str:
    """Why evaluations cannot have a PID namespace here ("" when they can): tried once, in a throwaway child."""
    if not confine.new_pid_namespace():
        return f"unavailable: unshare(CLONE_NEWPID): {os.strerror(ctypes.get_errno() or 1)} (needs root)"
    pid = os.fork()
    if pid == 0:
        try:
            confine.mount_private_proc()
            os._exit(0)
        except BaseException:
            os._exit(1)
    confine.restore_pid_namespace(own_pid_namespace)
    _, status = os.waitpid(pid, 0)
    return "" if status == 0 else "unavailable: cannot mount a private /proc (no mount namespace)"


def _reap(jobs: dict[int, tuple[str, int | None]], send: Any) -> None:
    while jobs:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return
        if pid in jobs:
            job_id, report = jobs.pop(pid)
            if report is not None:  # the status of the evaluation, not of its namespace's reaper
                text = os.read(report, 64)
                os.close(report)
                status = int(text) if text else status
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
