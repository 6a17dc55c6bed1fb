"""The supervisor of evaluations: each request judged in a fresh, isolated process (drkernel.sandbox, the code that
runs inside), always answered with a classified result.

`Supervisor` owns one device slot (one GPU, or the CPU) and a warm fork server. `prepare` forks the evaluation
process and lets it initialise CUDA while another evaluation may still be running; `finish` starts it and waits
with a wall-clock deadline and a host-memory watchdog. `DeviceQueue` puts the two together for a stream of
evaluations: each prepared on arrival, started in order, `overlap` of them running at once on a GPU, where the
device gate (drkernel.sandbox.gate) lets their loading, compilation and correctness checks overlap while each one's
timing and profiling has the GPU alone. Whatever the candidate does - raise, exit, segfault, loop, eat memory, kill
its parent - the supervisor survives and answers within the timeout plus a few seconds.
"""

from __future__ import annotations

import importlib.util
import json
import os
import queue
import shutil
import signal
import sys
import tempfile
import threading
import time
import uuid
from concurrent.futures import Future
from dataclasses import dataclass
from pathlib import Path

from drkernel.errors import EngineError
from drkernel.sandbox import procfs
from drkernel.sandbox.gate import GATE_FILE
from drkernel.runner.forkserver import ForkServer, ForkServerDied, JobHandle
from drkernel.runner.judge_hosts import JudgeHosts
from drkernel.schema import ErrorInfo, ErrorKind, EvalRequest, EvalResult, HackReason, Status

WATCH_INTERVAL_S = 0.05
MEMORY_CHECK_S = 0.25  # at most one /proc scan this often for all of a supervisor's evaluations (GroupMemory)
KILL_GRACE_S = 5.0
OUTPUT_TAIL_CHARS = 3000
GPU_OVERLAP = 3  # evaluations running at once on one GPU: checking correctness together, timing one at a time
# The least host memory an evaluation may be given on a GPU: its judge and subject hold about 1.4 GB resident before
# the candidate allocates anything (two CUDA contexts; 1.36-1.43 GB measured on an H100 host, docs/performance.md).
GPU_MEMORY_FLOOR_MB = 2048


class _NeverStarted(EngineError):
    """The evaluation process did not start."""


@dataclass
class Prepared:
    request: EvalRequest
    handle: JobHandle | None
    workdir: Path | None  # None until a judge host takes it
    refused: EvalResult | None = None  # the result, when the process could not even be started
    started_at: float | None = None


class Supervisor:
    def __init__(
        self,
        device: str = "cpu",
        gpu: str | None = None,
        root: str | Path | None = None,
        triton_cache: str | Path | None = None,
        bytecode_cache: str | Path | None = None,
        memory_cap_mb: int | None = None,
        overlap: int | None = None,
        judge_hosts: bool = True,
    ) -> None:
        """`judge_hosts`: each evaluation slot's judge outlives its evaluations (drkernel.sandbox.judge_host), so an
        evaluation starts one process (its subject) instead of two; False: a judge process per evaluation."""
        if device not in ("cpu", "cuda"):
            raise ValueError(f"a supervisor runs evaluations on cpu or cuda, not {device!r}")
        if device == "cuda" and gpu is None:
            raise ValueError("a cuda supervisor needs the GPU it owns (an index or UUID)")
        self.device, self.gpu = device, gpu
        self.root = evaluations_root(root)
        self.root.mkdir(mode=0o700, parents=True, exist_ok=True)
        # Root's evaluations run as an unprivileged uid (drkernel.sandbox.confine): it must pass through the root to
        # its own working directory (0700, random name) and write the cache; nobody may list the root.
        as_root = os.geteuid() == 0
        self.root.chmod(0o711 if as_root else 0o700)
        default_cache = self.root / "triton" if as_root else Path.home() / ".cache" / "drkernel" / "triton"
        self.triton_cache = Path(triton_cache or os.environ.get("DRKERNEL_TRITON_CACHE", default_cache))
        self.triton_cache.mkdir(mode=0o700, parents=True, exist_ok=True)
        self.bytecode_cache = fork_server_bytecode(bytecode_cache)
        self.memory_cap_mb = memory_cap_mb or memory_share_mb(1)
        self.memory = GroupMemory()
        # CPU timings are wall clock: evaluations there run alone unless asked otherwise.
        self.overlap = overlap or (GPU_OVERLAP if device == "cuda" else 1)
        if self.overlap < 1:
            raise ValueError(f"overlap must be at least 1, not {self.overlap}")
        self.gate = gpu_gate_path(gpu, root) if device == "cuda" else self.root / f"gate-cpu-{os.getpid()}-{id(self)}"
        # Triton decides at import whether @triton.jit interprets: the fork server must import it in the right mode.
        interpret = {"TRITON_INTERPRET": "1", "CUDA_VISIBLE_DEVICES": ""} if device == "cpu" else {}
        self.server = ForkServer(env=interpret, bytecode_cache=self.bytecode_cache)
        self.hosts = JudgeHosts(self.server, self.root, {
            "device": device, "gpu": gpu, "memory_limit_mb": self.memory_cap_mb, "triton_cache": str(self.triton_cache),
            "gate": str(self.gate) if self.overlap > 1 else None}, self.overlap) if judge_hosts else None

    # One evaluation -------------------------------------------------------------------------------------------

    def run(self, request: EvalRequest) -> EvalResult:
        """One evaluation from start to end (`DeviceQueue` overlaps many)."""
        return self.finish(self.prepare(request))

    def prepare(self, request: EvalRequest) -> Prepared:
        refused = memory_floor_refusal(self.device, request.options.memory_limit_mb, self.memory_cap_mb)
        if self.hosts is not None:  # its working directory is made in the host's folder, once a host takes it
            return Prepared(request, None, None, refused)
        workdir = Path(tempfile.mkdtemp(prefix="job-", dir=self.root))
        if refused is not None:
            return Prepared(request, None, workdir, refused)
        (workdir / "request.json").write_text(json.dumps(request.to_dict()))
        if self.overlap > 1:
            (workdir / GATE_FILE).write_text(str(self.gate))
        spec = {
            "workdir": str(workdir),
            "device": self.device,
            "gpu": self.gpu,
            "memory_limit_mb": self.memory_limit_mb(request),
            "triton_cache": str(self.triton_cache),
        }
        try:
            handle = self.server.spawn(uuid.uuid4().hex, spec)
        except ForkServerDied:
            try:  # one retry on a fresh fork server: this is the harness's failure, not the candidate's
                handle = self.server.spawn(uuid.uuid4().hex, spec)
            except ForkServerDied as exc:
                refused = EvalResult.failed(Status.CRASHED, ErrorKind.SANDBOX_ERROR,
                                            f"could not start the evaluation: {exc}")
                return Prepared(request, None, workdir, refused)
        return Prepared(request, handle, workdir)

    def memory_limit_mb(self, request: EvalRequest) -> int:
        return min(request.options.memory_limit_mb, self.memory_cap_mb)

    def finish(self, prepared: Prepared) -> EvalResult:
        if self.hosts is not None and prepared.refused is None:
            return self._finish_on_host(prepared)
        self.start(prepared)
        return self.collect(prepared)

    def _finish_on_host(self, prepared: Prepared) -> EvalResult:
        """Hand the evaluation to a free judge host and wait for it as for a process of its own; a host that a
        timeout or the memory watchdog ends is replaced at the next evaluation."""
        assert self.hosts is not None
        host = self.hosts.take()
        try:
            try:
                prepared.handle, prepared.workdir = host.hand_over(prepared.request,
                                                                   self.memory_limit_mb(prepared.request))
            except (ForkServerDied, OSError) as exc:
                return EvalResult.failed(Status.CRASHED, ErrorKind.SANDBOX_ERROR,
                                         f"could not start the evaluation: {exc}")
            prepared.started_at = time.monotonic()
            try:
                return self._wait(prepared)
            except _NeverStarted:
                pass
        finally:
            self.hosts.give_back(host)  # before any retry: it would wait for this slot
            if prepared.workdir is not None:
                shutil.rmtree(prepared.workdir, ignore_errors=True)
        return self.finish(self.prepare(prepared.request))  # none of its code ran (see `collect`): afresh

    def start(self, prepared: Prepared) -> None:
        """Let a prepared evaluation run; its deadline counts from here."""
        if prepared.refused is None and prepared.started_at is None:
            prepared.started_at = time.monotonic()
            signal_file = prepared.workdir / "go.tmp"  # renamed into place: the child never reads a half-written "go"
            signal_file.write_text(repr(time.time()))
            signal_file.rename(prepared.workdir / "go")

    def collect(self, prepared: Prepared) -> EvalResult:
        """Wait for a started evaluation and classify how it ended."""
        try:
            if prepared.refused is not None:
                return prepared.refused
            return self._wait(prepared)
        except _NeverStarted:
            # Its process died while waiting to start, with the fork server (killed by the evaluation before it):
            # none of this request's code has run, so it runs afresh.
            return self.finish(self.prepare(prepared.request))
        finally:
            if prepared.workdir is not None:  # a judge host's refused evaluation has none
                shutil.rmtree(prepared.workdir, ignore_errors=True)

    def _wait(self, prepared: Prepared) -> EvalResult:
        handle, workdir, options = prepared.handle, prepared.workdir, prepared.request.options
        assert handle is not None and handle.pid is not None and prepared.started_at is not None
        start = prepared.started_at
        deadline = start + options.timeout_s
        limit_bytes = self.memory_limit_mb(prepared.request) << 20
        outcome = "done"
        last = start
        while not handle.finished.wait(WATCH_INTERVAL_S):
            now = time.monotonic()
            if handle.waiting:  # waiting for the GPU while others use it is not the evaluation's time
                deadline += now - last
            last = now
            if now > deadline:
                outcome = "timeout"
            elif self.memory.rss(handle.pid) > limit_bytes:
                outcome = "memory"
            else:
                continue
            procfs.kill_group(handle.pid)
            handle.finished.wait(KILL_GRACE_S)
            break
        # A subject the judge could not signal (Landlock's scopes) ends with its group; a judge host's ends it itself.
        if outcome == "done" and self.hosts is None:
            try:
                os.killpg(handle.pid, signal.SIGKILL)
            except OSError:
                pass
        if handle.server_died:
            procfs.kill_group(handle.pid)
            if not handle.started:
                raise _NeverStarted
            outcome = "server_died"
        result = self._result(outcome, handle, workdir, options.timeout_s, self.memory_limit_mb(prepared.request))
        result.duration_s = round(time.monotonic() - start, 4)
        return result

    def _result(self, outcome: str, handle: JobHandle, workdir: Path, timeout_s: float, memory_mb: int) -> EvalResult:
        """Only the judge's report is a verdict; a judge that ended without one has been brought down."""
        if outcome == "done" and handle.result is not None:
            try:
                result = EvalResult.from_dict(handle.result)
            except (TypeError, ValueError) as exc:
                return _crashed(ErrorKind.CORRUPT_RESULT, f"the evaluation reported an unreadable result: {exc}",
                                workdir)
            if handle.result_at is not None:
                result.phases_s["exit"] = round(time.monotonic() - handle.result_at, 4)  # process teardown
            return result
        if outcome == "timeout":
            result = _crashed(ErrorKind.TIMEOUT, f"the evaluation exceeded its {timeout_s:g} s time limit", workdir)
            result.status = Status.TIMEOUT
            return result
        if outcome == "memory":
            return _crashed(ErrorKind.MEMORY_LIMIT, f"the evaluation exceeded its host memory limit of {memory_mb} MB",
                            workdir)
        if outcome == "server_died":
            result = _crashed(ErrorKind.KILLED_HARNESS,
                              "the evaluation's parent process was killed during the evaluation", workdir)
            result.hack_reasons = [HackReason.KILLED_HARNESS.value]
            result.hack_details = {
                HackReason.KILLED_HARNESS.value: "the candidate killed the process that supervises it."}
            return result
        return _crashed_by_status(handle.status, workdir)

    def close(self) -> None:
        self.server.close()
        if self.hosts is not None:
            self.hosts.close()


class DeviceQueue:
    """Evaluations on one supervisor: each forked on submission, so its start-up overlaps the evaluations in front of
    it, and started in the order submitted, `supervisor.overlap` at a time; with more than one, the device gate keeps
    each one's timing and profiling alone on the GPU (timings stay clean)."""

    def __init__(self, supervisor: Supervisor) -> None:
        self.supervisor = supervisor
        self._prepared: queue.Queue[tuple[Prepared, Future[EvalResult]]] = queue.Queue()
        self._running = threading.Semaphore(supervisor.overlap)
        threading.Thread(target=self._start_in_turn, daemon=True, name="drkernel-device").start()

    def submit(self, request: EvalRequest) -> Future[EvalResult]:
        done: Future[EvalResult] = Future()
        self._prepared.put((self.supervisor.prepare(request), done))
        return done

    def _start_in_turn(self) -> None:
        while True:
            prepared, done = self._prepared.get()
            self._running.acquire()
            threading.Thread(target=self._finish, args=(prepared, done), daemon=True, name="drkernel-eval").start()

    def _finish(self, prepared: Prepared, done: Future[EvalResult]) -> None:
        try:
            done.set_result(self.supervisor.finish(prepared))
        except BaseException as exc:  # a harness fault, not the candidate's: raised to whoever waits for it
            done.set_exception(exc)
        finally:
            self._running.release()


def evaluations_root(root: str | Path | None = None) -> Path:
    """Where supervisors of this user keep their evaluations' working directories and their GPUs' gates."""
    return Path(root or tempfile.gettempdir()) / f"drkernel-{os.getuid()}"


def fork_server_bytecode(chosen: str | Path | None = None) -> Path | None:
    """Where the fork server compiles its imports (drkernel.runner.forkserver.sandbox_environment): `chosen`, or
    DRKERNEL_BYTECODE_CACHE; else `~/.cache/drkernel/bytecode` when torch's installation holds no bytecode (an image
    built without it, with PYTHONDONTWRITEBYTECODE set: each start compiled torch from source, 8-15 s on an H100's
    host). None, the installation's own bytecode as before, otherwise or where the folder cannot be made."""
    chosen = chosen or os.environ.get("DRKERNEL_BYTECODE_CACHE")
    if not chosen:
        if installation_has_bytecode("torch"):
            return None
        chosen = Path.home() / ".cache" / "drkernel" / "bytecode"
    folder = Path(chosen)
    try:
        folder.mkdir(mode=0o700, parents=True, exist_ok=True)
    except OSError:
        return None
    return folder


def installation_has_bytecode(package: str) -> bool:
    """Whether the installed `package` holds the bytecode of its `__init__` (found without importing it)."""
    spec = importlib.util.find_spec(package)
    if spec is None or spec.origin is None:
        return True  # nothing of it to compile
    source = Path(spec.origin)
    return (source.parent / "__pycache__" / f"{source.stem}.{sys.implementation.cache_tag}.pyc").exists()


def gpu_gate_path(gpu: str, root: str | Path | None = None) -> Path:
    """The lock file of a GPU's device gate, shared by every supervisor (and local model) of this user on it."""
    return evaluations_root(root) / f"gate-gpu-{gpu}"


def host_memory_mb() -> int:
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") >> 20


def memory_share_mb(processes: float) -> int:
    """Host memory for each of `processes` evaluation processes alive at once: 80% of the machine, shared."""
    return int(host_memory_mb() * 0.8 / processes)


def _crashed_by_status(status: int | None, workdir: Path) -> EvalResult:
    """The judge ended without a verdict. It never runs candidate code: a signal that killed it came from the
    candidate's process (or the machine), and nothing else it left counts."""
    if status is not None and os.WIFSIGNALED(status):
        sig = os.WTERMSIG(status)
        name = signal.Signals(sig).name if sig in signal.Signals._value2member_map_ else str(sig)
        result = _crashed(ErrorKind.KILLED_HARNESS,
                          f"the evaluation's judge was killed by {name} ({signal.strsignal(sig)})",
                          workdir)
        result.hack_reasons = [HackReason.KILLED_HARNESS.value]
        result.hack_details = {
            HackReason.KILLED_HARNESS.value: "the process that judges the candidate was killed: a failure."}
        return result
    code = os.WEXITSTATUS(status) if status is not None else None
    return _crashed(ErrorKind.EXIT, f"the evaluation's judge exited with code {code} before reporting a result",
                    workdir)


def _crashed(kind: str, message: str, workdir: Path) -> EvalResult:
    return EvalResult(
        status=Status.CRASHED,
        error=ErrorInfo(kind=kind, message=message, traceback=_output_tail(workdir)),
    )


def _output_tail(workdir: Path) -> str:
    parts = []
    for name in ("stderr.txt", "stdout.txt", "subject/stderr.txt", "subject/stdout.txt"):
        try:
            text = (workdir / name).read_text(errors="replace")
        except OSError:
            continue
        if text.strip():
            parts.append(f"[{name}]\n{text[-OUTPUT_TAIL_CHARS:]}")
    return "\n".join(parts)


def memory_floor_refusal(device: str, limit_mb: int, cap_mb: int) -> EvalResult | None:
    """`invalid` for a host-memory limit below what the evaluation's own processes hold on a GPU: the watchdog
    would end every evaluation as `crashed` before its candidate ran. On the CPU the address-space limit names its
    own floor (`isolate.LimitTooLow`, from inside the evaluation)."""
    if device != "cuda" or min(limit_mb, cap_mb) >= GPU_MEMORY_FLOOR_MB:
        return None
    named = f"memory_limit_mb={limit_mb}" if limit_mb <= cap_mb else f"the sandbox's memory cap of {cap_mb} MB"
    return EvalResult.failed(
        Status.INVALID, ErrorKind.LIMIT_TOO_LOW,
        f"{named} is below the {GPU_MEMORY_FLOOR_MB} MB an evaluation needs on a GPU: its own two processes hold "
        "about 1.4 GB of host memory there (their CUDA contexts) before the candidate runs; raise it")


class GroupMemory:
    """Resident memory of each process group, from one scan of /proc at most every MEMORY_CHECK_S, shared by all of a
    supervisor's running evaluations. A scan reads every process's stat file: one for each evaluation every 50 ms kept
    half a core of each worker busy on a host running four RL runs (docs/miniature.md)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._by_group: dict[int, int] = {}
        self._scanned_at = float("-inf")

    def rss(self, pgid: int) -> int:
        """The group's resident bytes, as of a scan at most MEMORY_CHECK_S old."""
        with self._lock:
            if time.monotonic() - self._scanned_at >= MEMORY_CHECK_S:
                by_group: dict[int, int] = {}
                for process in procfs.processes():
                    by_group[process.pgrp] = by_group.get(process.pgrp, 0) + process.rss_bytes
                self._by_group, self._scanned_at = by_group, time.monotonic()
            return self._by_group.get(pgid, 0)
