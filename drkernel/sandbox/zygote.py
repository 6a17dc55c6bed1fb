"""Fork server: imports torch and triton once, never touches CUDA, and forks one process per evaluation.

Protocol on stdin/stdout, one JSON object per line:
  supervisor -> zygote  {"id", "workdir", "device": "cuda"|"cpu", "gpu", "memory_limit_mb", "triton_cache"}
  zygote -> supervisor  {"ready": pid} once; {"id", "pid"} after each fork; {"id", "status"} when it exits
The child prepares (hardening, CUDA initialisation), waits for the file `go` in its working directory, evaluates
`request.json` and writes `result.json`. Exit statuses are raw wait statuses.
"""

from __future__ import annotations

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

from drkernel.sandbox import isolate, pipeline, procfs
from drkernel.schema import EvalRequest, EvalResult, Status

GO_POLL_S = 0.002


def child_main(job: dict[str, Any], zygote_pid: int, inherited_fds: list[int]) -> None:
    workdir = job["workdir"]
    try:
        isolate.detach(zygote_pid)
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
        device = torch.device("cpu")
        if not cpu:
            torch.cuda.init()
            device = torch.device("cuda", 0)
        pipeline.warm_up(device)
        while not os.path.exists("go"):
            time.sleep(GO_POLL_S)
        Path("started").touch()  # from here on, a death of the fork server is this evaluation's doing
        start_latency = time.time() - float(Path("go").read_text() or "nan")
        request = EvalRequest.from_dict(json.loads(Path("request.json").read_text()))
        result = pipeline.evaluate(request, Path(workdir), device)
        result.phases_s["start_latency"] = round(start_latency, 4)  # from the start signal to the pipeline
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
    jobs: dict[int, str] = {}
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
                    pid = os.fork()
                    if pid == 0:
                        child_main(job, me, [wake_r, wake_w, proto_fd])
                    jobs[pid] = job["id"]
                    send({"id": job["id"], "pid": pid})


def _reap(jobs: dict[int, str], send: Any) -> None:
    while jobs:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return
        if pid in jobs:
            send({"id": jobs.pop(pid), "status": status})


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
