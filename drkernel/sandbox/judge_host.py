"""A judge that outlives its evaluations: one process judges request after request, each against a fresh subject.

A host starts about 3.5 CUDA processes a second whatever its GPUs (docs/performance.md), and an evaluation whose
judge is a process of its own starts two. The judge never runs candidate code, so it can be trusted from one
evaluation to the next; only the subject, which runs the candidate, must be new for each. A process that has made a
CUDA context cannot fork one that makes its own, so before the judge makes its context it forks a forker: a process
that never touches CUDA, forks a subject when the judge asks, and kills and reaps it when asked, saying how it ended.
The next subject is forked as soon as an evaluation ends, and makes its CUDA context while the judge waits.

The supervisor (drkernel.runner.judge_hosts) hands over an evaluation by renaming `JOB_FILE` into the host's folder:
{"id", "workdir", "memory_limit_mb", "at"} ("at": when, by the clock), the working directory made inside that
folder with its `request.json`. The host reports on its pipe as a one-evaluation judge does, each report tagged {"job": id}; {"uid": n} once, the uid it
runs as, which must own the working directories. The forker and each subject stay in the host's PID namespace and
process group: the supervisor kills and measures them with the judge (the forker holds about 0.15-0.25 GB of its
own, torch's imported state).
"""

from __future__ import annotations

import ctypes
import gc
import json
import os
import shutil
import socket
import time
from pathlib import Path
from typing import Any

import torch

from drkernel.sandbox import channel, isolate, processes
from drkernel.sandbox.gate import DeviceGate
from drkernel.sandbox.subject_link import SubjectLink, kill_and_reap
from drkernel.schema import ErrorKind, EvalResult, HackReason, Status

JOB_FILE = "job.json"
MESSAGE_BYTES = 1 << 16


class ForkerGone(Exception):
    """The forker ended (a subject may have killed it): the host can start no more subjects."""


class Forker:
    """The judge's side of its forker: one datagram a command on a SOCK_SEQPACKET pair, the subject's end of the
    channel passed beside a spawn."""

    def __init__(self, sock: socket.socket, pid: int) -> None:
        self.sock, self.pid = sock, pid

    def spawn(self, spec: dict[str, Any], subject_end: socket.socket) -> int:
        """Fork a subject with `spec` (its scratch folder, its memory limit) on `subject_end`; its pid."""
        try:
            socket.send_fds(self.sock, [json.dumps({"op": "spawn", **spec}).encode()], [subject_end.fileno()])
        except OSError as exc:
            raise ForkerGone(f"the forker is gone: {exc}") from exc
        return int(self._reply()["pid"])

    def end(self, pid: int, wait: bool) -> int | None:
        """Kill subject `pid`; with `wait`, reap it and return its wait status (None if not known within
        STOP_WAIT_S)."""
        try:
            self.sock.send(json.dumps({"op": "end", "pid": pid, "wait": wait}).encode())
        except OSError as exc:
            raise ForkerGone(f"the forker is gone: {exc}") from exc
        status = self._reply()["status"]
        return status if isinstance(status, int) else None

    def alive(self) -> bool:
        try:
            return os.waitpid(self.pid, os.WNOHANG)[0] == 0
        except ChildProcessError:
            return False

    def _reply(self) -> dict[str, Any]:
        try:
            data = self.sock.recv(MESSAGE_BYTES)
        except OSError as exc:
            raise ForkerGone(f"the forker is gone: {exc}") from exc
        if not data:
            raise ForkerGone("the forker is gone")
        return json.loads(data)


class ForkedSubject:
    """A subject the forker forked (drkernel.sandbox.subject_link.SubjectProcess): ended and reaped through it."""

    def __init__(self, forker: Forker, pid: int) -> None:
        self.forker, self.pid = forker, pid
        self.reaped: int | None = None
        self.known = False  # reaped (its status, possibly None, is final)

    def end(self, wait: bool = True) -> int | None:
        if self.known:
            return self.reaped
        try:
            status = self.forker.end(self.pid, wait)
        except ForkerGone:
            return None
        if wait:
            self.reaped, self.known = status, True
        return status


def start_forker(job: dict[str, Any], device: torch.device, private_proc: bool) -> Forker:
    """Fork the forker (before this process touches CUDA)."""
    ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    judge_pid = os.getpid()
    pid = os.fork()
    if pid == 0:
        ours.close()
        _keep_only(theirs.fileno())
        _forker_main(theirs, job, device, judge_pid, private_proc)
    theirs.close()
    return Forker(ours, pid)


def _keep_only(fd: int) -> None:
    """Close every descriptor but the standard three and `fd`: what the forker holds, each subject inherits, and the
    judge's own (the pipe its verdicts travel on, above all) must never be in a candidate's process, where
    /proc/self/fd would open it to read the judge's reports or write forged ones."""
    os.closerange(3, fd)
    os.closerange(fd + 1, os.sysconf("SC_OPEN_MAX"))


def _forker_main(sock: socket.socket, job: dict[str, Any], device: torch.device, judge_pid: int,
                 private_proc: bool) -> None:
    """Serve the judge's spawn and end commands until it goes."""
    try:
        isolate.detach(judge_pid, new_session=False)  # dies with the judge
        ctypes.CDLL(None).prctl(processes.PR_SET_DUMPABLE, 0, 0, 0, 0)  # subjects cannot trace it
        me = os.getpid()
        while True:
            data, fds, _, _ = socket.recv_fds(sock, MESSAGE_BYTES, 1)
            if not data:
                break
            command = json.loads(data)
            if command["op"] == "spawn":
                pid = os.fork()
                if pid == 0:
                    sock.close()
                    _subject(command, fds[0], job, device, me, private_proc)
                for fd in fds:
                    os.close(fd)
                sock.send(json.dumps({"pid": pid}).encode())
            else:
                sock.send(json.dumps({"status": kill_and_reap(int(command["pid"]), bool(command["wait"]))}).encode())
    except BaseException:  # the judge is gone, or spoke nonsense: nothing left to serve
        pass
    os._exit(0)


def _subject(command: dict[str, Any], fd: int, job: dict[str, Any], device: torch.device, forker_pid: int,
             private_proc: bool) -> None:
    """A subject forked by the forker: its memory limit, then the one-evaluation subject's own start."""
    try:
        isolate.limit_resources(command["memory_limit_mb"])
    except BaseException:  # an inherited hard limit below what an evaluation needs: the judge's own set-up says so
        os._exit(3)
    processes.subject_main(job, Path(command["scratch"]), socket.socket(fileno=fd), device, forker_pid,
                           private_proc, bool(command["gate_named"]))


class NextSubject:
    """The subject forked ahead for the next evaluation: its folder, its process, the judge's end of its channel."""

    def __init__(self, forker: Forker, home: Path, limit_mb: int | None, gate_named: bool) -> None:
        self.folder = home / f"subject-{os.urandom(6).hex()}"
        self.folder.mkdir(mode=0o700)
        self.scratch = processes.make_scratch(self.folder)
        self.limit_mb = limit_mb
        judge_end, subject_end = channel.pair()
        spec = {"scratch": str(self.scratch), "memory_limit_mb": limit_mb, "gate_named": gate_named}
        try:
            self.process = ForkedSubject(forker, forker.spawn(spec, subject_end))
        finally:
            subject_end.close()
        self.judge_end = judge_end

    def discard(self) -> None:
        """Kill and reap it, and remove its folder."""
        self.judge_end.close()
        self.process.end(wait=True)
        shutil.rmtree(self.folder, ignore_errors=True)


def host_main(job: dict[str, Any], parent_pid: int, inherited_fds: list[int], report_fd: int,
              private_proc: bool = False) -> None:
    """The judge host's process: set up once, then judge each job handed over, each against a fresh subject."""
    home = Path(job["workdir"])
    set_up: EvalResult | None = None
    forker: Forker | None = None
    device, networked, confinement, gate = torch.device("cpu"), False, {}, None
    current = {"job": ""}  # the evaluation the GPU's gate reports a wait for
    try:
        device, networked = processes.set_up_judge(job, parent_pid, inherited_fds, private_proc)
        cpu = device.type == "cpu"
        # the forker first: a subject sets its own limits, and under the judge's its address space (the forker's,
        # a little more than the judge's) could leave it less than an evaluation needs below a small memory cap
        forker = start_forker(job, device, private_proc)
        isolate.limit_resources(job["memory_limit_mb"] if cpu else None)
        ctypes.CDLL(None).prctl(processes.PR_SET_DUMPABLE, 0, 0, 0, 0)
        processes.prepare_process(device, profiles=False)
        if job.get("gate"):  # opened before the judge gives up its uid: the lock files are the supervisor's
            gate = DeviceGate(job["gate"], lambda waiting: channel.report(
                report_fd, {"job": current["job"], "waiting": waiting}))
        confinement = processes.judge_confinement(job, str(home), private_proc)
        # searchable by others, as an evaluation's own folder is: a subject started as root takes the judge's
        # unprivileged uid only if every folder above its own is, and would otherwise keep root's without the
        # capabilities to write to the folder the judge made for it
        os.chmod(home, 0o711)
    except BaseException as exc:
        set_up = processes.set_up_failure(exc)
    channel.report(report_fd, {"uid": os.geteuid()})
    gate_named = gate is not None
    ahead: NextSubject | None = None
    while True:
        order = _next_job(home)
        start_latency = time.time() - order["at"]
        job_id, workdir = order["id"], Path(order["workdir"])
        channel.report(report_fd, {"job": job_id, "started": True})
        if set_up is not None:
            processes.report_result(report_fd, set_up, job_id)
            continue
        assert forker is not None
        if not forker.alive():  # ended between evaluations, by no candidate: the harness's failure, run again
            processes.report_result(report_fd, EvalResult.failed(
                Status.CRASHED, ErrorKind.SANDBOX_ERROR, "the process that starts the judge's subjects ended"), job_id)
            os._exit(0)
        limit = order["memory_limit_mb"] if device.type == "cpu" else None
        if ahead is None or ahead.limit_mb != limit:
            if ahead is not None:
                ahead.discard()
            ahead = None
        current["job"] = job_id
        result = _judge_one(workdir, ahead, forker, home, limit, gate, device, confinement, networked)
        result.phases_s["start_latency"] = round(start_latency, 4)  # from the hand-over to the judge
        ahead = None
        forker_ended = not forker.alive()
        if forker_ended:  # only a subject could have ended it: this candidate's doing
            result = EvalResult.failed(Status.CRASHED, ErrorKind.KILLED_HARNESS,
                                       "the process that starts the judge's subjects was killed during the evaluation")
            result.hack_reasons = [HackReason.KILLED_HARNESS.value]
            result.hack_details = {HackReason.KILLED_HARNESS.value: "the candidate killed a process of the harness."}
        processes.report_result(report_fd, result, job_id)
        del result
        if forker_ended:
            os._exit(0)  # the supervisor starts another host for the next evaluation
        try:
            ahead = NextSubject(forker, home, limit, gate_named)
        except ForkerGone:
            os._exit(0)
        _forget_evaluation(device)


def _judge_one(workdir: Path, ahead: NextSubject | None, forker: Forker, home: Path, limit: int | None,
               gate: DeviceGate | None, device: torch.device, confinement: dict[str, str], networked: bool
               ) -> EvalResult:
    """One evaluation against the subject forked ahead (or a new one); its subject discarded. A function of its own
    so that what the evaluation made (its link, tensors, mapped outputs) is gone when the judge empties its cache:
    the next evaluation's phases would otherwise start with the last one's memory still held."""
    subject: NextSubject | None = None
    try:
        subject = ahead if ahead is not None else NextSubject(forker, home, limit, gate is not None)
        if gate is not None:  # what the gate cost is each evaluation's own
            gate.spent = dict.fromkeys(gate.spent, 0.0)
        link = SubjectLink(channel.Channel(subject.judge_end), subject.process, subject.scratch, device, gate)
        return processes.judged(workdir, device, gate, link, confinement, networked)
    except BaseException as exc:
        return processes.set_up_failure(exc)
    finally:
        if subject is not None:
            subject.discard()  # never beside the next evaluation


def _next_job(home: Path) -> dict[str, Any]:
    path = home / JOB_FILE
    while True:
        try:
            order = json.loads(path.read_text())
        except FileNotFoundError:
            time.sleep(processes.GO_POLL_S)
            continue
        path.unlink()
        return order


def _forget_evaluation(device: torch.device) -> None:
    """What one evaluation left in the judge's process that the next must not meet: cached GPU memory (other
    evaluations' and its own next subject's to use), default dtype and grad mode the reference may have changed."""
    torch.set_default_dtype(torch.float32)
    torch.set_grad_enabled(True)
    # between evaluations, not inside one: this process lives on, and an automatic full pass could land in the
    # next evaluation's phases (drkernel.sandbox.processes.freeze_start_up); it also frees tensors in cycles
    gc.collect()
    if device.type == "cuda":
        torch.cuda.synchronize()
        torch.cuda.empty_cache()
