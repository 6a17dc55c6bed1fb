"""The processes of an evaluation, forked by the fork server (drkernel.sandbox.forkserver): the judge's and the
subject's set-up and main functions.

The judge's process sets itself up, forks the subject before either touches CUDA, prepares, waits for the start
signal, judges the request (drkernel.sandbox.judge) and reports on a pipe only it holds. The subject's process
confines itself to its scratch folder and serves the judge's requests (drkernel.sandbox.subject). A judge that
outlives its evaluations (drkernel.sandbox.judge_host) uses the same pieces.
"""

from __future__ import annotations

import ctypes
import gc
import json
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import torch

from drkernel.sandbox import channel, confine, isolate, judge, relay, startup, subject
from drkernel.sandbox.gate import DeviceGate
from drkernel.sandbox.subject_link import ChildSubject, SubjectLink
from drkernel.schema import ErrorKind, EvalRequest, EvalResult, Status

GO_POLL_S = 0.002
PR_SET_DUMPABLE = 4
SCRATCH = "subject"  # the subject's folder inside the working directory: the only place it writes (and the cache)


def judge_main(job: dict[str, Any], parent_pid: int, inherited_fds: list[int], report_fd: int,
               private_proc: bool = False) -> None:
    """The judge's process: set up, fork the subject, prepare, wait for the start signal, evaluate, report."""
    workdir = job["workdir"]
    try:
        device, networked = set_up_judge(job, parent_pid, inherited_fds, private_proc)
        isolate.limit_resources(job["memory_limit_mb"] if device.type == "cpu" else None)
        scratch = make_scratch(Path(workdir))
        gate_named = (Path(workdir) / "gate").exists()
        judge_end, subject_end = channel.pair()
        subject_pid = os.fork()
        if subject_pid == 0:
            judge_end.close()
            os.close(report_fd)
            subject_main(job, scratch, subject_end, device, os.getppid(), private_proc, gate_named)
        subject_end.close()
        ctypes.CDLL(None).prctl(PR_SET_DUMPABLE, 0, 0, 0, 0)  # the subject cannot trace it or open its descriptors
        prepare_process(device, profiles=False)
        gate = DeviceGate.for_workdir(Path(workdir), lambda waiting: channel.report(report_fd, {"waiting": waiting}))
        started = time.perf_counter()
        confinement = judge_confinement(job, workdir, private_proc)
        confine_s = time.perf_counter() - started
        while not os.path.exists("go"):
            time.sleep(GO_POLL_S)
        channel.report(report_fd, {"started": True})  # a death of the fork server is now this evaluation's doing
        start_latency = time.time() - float(Path("go").read_text() or "nan")
        link = SubjectLink(channel.Channel(judge_end), ChildSubject(subject_pid), scratch, device, gate)
        result = judged(Path(workdir), device, gate, link, confinement, networked)
        result.phases_s["start_latency"] = round(start_latency, 4)  # from the start signal to the judge
        result.phases_s["confine"] = round(confine_s, 4)  # before the start signal, overlapped with others' runs
    except BaseException as exc:
        result = set_up_failure(exc)
    report_result(report_fd, result)
    os._exit(0)


def set_up_judge(job: dict[str, Any], parent_pid: int, inherited_fds: list[int], private_proc: bool
                 ) -> tuple[torch.device, bool]:
    """The judge's process before anything of an evaluation: its own group (or PID 1's), its output files, folder and
    environment in `job["workdir"]`, its device, a network namespace; (the device, whether the network stayed)."""
    workdir = job["workdir"]
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
    networked = not isolate.isolate_network(allow_user_namespace=cpu)
    import faulthandler

    faulthandler.enable(file=sys.stderr, all_threads=False)
    return (torch.device("cpu") if cpu else torch.device("cuda", 0)), networked


def make_scratch(workdir: Path) -> Path:
    """The subject's folder in an evaluation's working directory, which it passes through and cannot list."""
    scratch = workdir / SCRATCH
    scratch.mkdir(mode=0o700)
    os.chmod(workdir, 0o711)
    return scratch


def judge_confinement(job: dict[str, Any], workdir: str, private_proc: bool) -> dict[str, str]:
    """Confine the judge's process to `workdir` (and the Triton cache); what confines it, for the result."""
    confinement = confine.confine(workdir, job["triton_cache"], private_proc)
    confinement["pid_namespace"] = "private, own /proc" if private_proc else job["pid_namespace"]
    confinement["user_namespace"] = job["user_namespace"]
    return confinement


def judged(workdir: Path, device: torch.device, gate: DeviceGate | None, link: SubjectLink,
           confinement: dict[str, str], networked: bool) -> EvalResult:
    """The request in `workdir` judged against the subject behind `link`; the judge's confinement in the result."""
    request = EvalRequest.from_dict(json.loads((workdir / "request.json").read_text()))
    result = judge.judge_request(request, workdir, device, gate, link)
    if result.environment is not None:
        result.environment.confinement = {**confinement, **result.environment.confinement}
    if networked:
        result.notes.append("sandbox: network namespace unavailable here; the candidate had network access")
    return result


def set_up_failure(exc: BaseException) -> EvalResult:
    """The result when the harness failed before the candidate ran: the harness's problem, said so."""
    if isinstance(exc, isolate.LimitTooLow):
        return EvalResult.failed(Status.INVALID, ErrorKind.LIMIT_TOO_LOW, str(exc))
    import traceback

    return EvalResult.failed(Status.INVALID, ErrorKind.SANDBOX_ERROR, f"sandbox set-up failed: {exc!r}",
                             traceback.format_exc())


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
        prepare_process(device, profiles=True)
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


def prepare_process(device: torch.device, profiles: bool) -> None:
    """A process's start-up before the evaluation; what it made is then frozen out of the garbage collector (below).
    Only the subject, which profiles the candidate, starts the profiler (CUPTI) here."""
    try:
        if device.type == "cuda":
            torch.cuda.init()
        startup.warm_up(device, profiles)
    except Exception as exc:
        raise isolate.blame_address_space("CUDA" if device.type == "cuda" else "the evaluation", exc) from exc
    freeze_start_up()


def freeze_start_up() -> None:
    """Leave every object made so far (torch's, Triton's, the CUDA set-up's: about 300,000) out of the cyclic garbage
    collector's passes: a full pass over them takes about 120 ms (measured on the CPU), a pause that lands inside
    an evaluation's phases, several of which hold the GPU for everyone. They live as long as the process anyway."""
    gc.freeze()


def report_result(report_fd: int, result: EvalResult, job_id: str | None = None) -> None:
    """The verdict on the judge's pipe (tagged with its job where a judge host judges many)."""
    tag = {} if job_id is None else {"job": job_id}
    try:
        text = result.to_dict()
    except (TypeError, ValueError) as exc:  # never blame the candidate for the harness's own failure
        text = EvalResult.failed(Status.INVALID, ErrorKind.SANDBOX_ERROR, f"unserialisable result: {exc}").to_dict()
    try:
        channel.report(report_fd, {**tag, "result": text})
    except (TypeError, ValueError) as exc:
        channel.report(report_fd, {**tag, "result": EvalResult.failed(
            Status.INVALID, ErrorKind.SANDBOX_ERROR, f"unserialisable result: {exc}").to_dict()})
