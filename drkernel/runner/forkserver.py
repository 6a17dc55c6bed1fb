"""Supervisor side of the fork server (drkernel.sandbox.forkserver): start it, hand it jobs, hear their ends."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

from drkernel.errors import EngineError

READY_TIMEOUT_S = 120.0

# Passed to the sandbox; everything else in the supervisor's environment (tokens, keys, cloud credentials) is not.
ENV_ALLOWED = re.compile(
    r"^(PATH|LANG|LC_\w+|TZ|LD_LIBRARY_PATH|PYTHONPATH|VIRTUAL_ENV|CUDA_\w+|NVIDIA_\w+|TRITON_\w+|TORCH_\w+|"
    r"TORCHINDUCTOR_\w+|OMP_NUM_THREADS|MKL_\w+|NCCL_\w+|NVSHMEM_\w+|CC|CXX)$"
)
ENV_SECRET = re.compile(r"TOKEN|SECRET|PASSWORD|PASSWD|CREDENTIAL|API_?KEY|PRIVATE", re.IGNORECASE)


def sandbox_environment(extra: dict[str, str] | None = None, bytecode_cache: str | Path | None = None
                        ) -> dict[str, str]:
    """The fork server's environment. With `bytecode_cache`, it compiles its imports into that folder of its own once
    (PYTHONPYCACHEPREFIX) and reads them from there at every later start, whatever the installation holds: images
    built without bytecode, or with PYTHONDONTWRITEBYTECODE set, otherwise compile torch, sympy and Triton from source
    at every start (9-11 s on an H100's host, docs/performance.md). It writes no bytecode once it serves evaluations
    (`drkernel.sandbox.forkserver.serve`)."""
    env = {k: v for k, v in os.environ.items() if ENV_ALLOWED.match(k) and not ENV_SECRET.search(k)}
    env.setdefault("PATH", "/usr/bin:/bin")
    env["PYTHONUNBUFFERED"] = "1"
    if bytecode_cache is None:
        env["PYTHONDONTWRITEBYTECODE"] = "1"
    else:
        env["PYTHONPYCACHEPREFIX"] = str(bytecode_cache)
    env.update(extra or {})
    return env


@dataclass
class JobHandle:
    id: str
    spawned: threading.Event = field(default_factory=threading.Event)
    finished: threading.Event = field(default_factory=threading.Event)
    pid: int | None = None
    status: int | None = None  # raw wait status; None when the fork server died first
    # What the judge reported, on a pipe only it holds (never a file the candidate could write):
    started: bool = False  # the evaluation has begun (a fork server's death from here on is its doing)
    waiting: bool = False  # it waits for its GPU while others use it: not its time
    result: dict[str, Any] | None = None  # its verdict
    result_at: float | None = None  # monotonic time the verdict arrived
    server_died: bool = False
    server: Any = None  # the fork server process that owns the job
    # A judge host's (drkernel.sandbox.judge_host): the evaluations handed to it, by id, each with a handle of its
    # own, finished by its verdict; and the uid it runs as, once it has said so.
    evaluations: dict[str, JobHandle] = field(default_factory=dict)
    uid: int | None = None
    host_ready: threading.Event = field(default_factory=threading.Event)

    def end_evaluations(self) -> None:
        """The host ended: every evaluation it had not answered ends with it, with its status."""
        for evaluation in list(self.evaluations.values()):
            if not evaluation.finished.is_set():
                evaluation.status, evaluation.server_died = self.status, self.server_died
                evaluation.finished.set()
        self.evaluations.clear()
        self.host_ready.set()


def _take_event(job: JobHandle, event: dict[str, Any]) -> None:
    if "job" in event:  # a judge host's report on one of its evaluations
        evaluation = job.evaluations.get(str(event["job"]))
        if evaluation is not None:
            _take_event(evaluation, {k: v for k, v in event.items() if k != "job"})
            if evaluation.result is not None:
                job.evaluations.pop(evaluation.id, None)
                evaluation.finished.set()
    elif "uid" in event:
        job.uid = int(event["uid"])
        job.host_ready.set()
    elif "waiting" in event:
        job.waiting = bool(event["waiting"])
    elif "started" in event:
        job.started = True
    elif isinstance(event.get("result"), dict):
        job.result, job.result_at = event["result"], time.monotonic()


class ForkServerDied(EngineError):
    """The fork server every evaluation starts from is gone."""


class ForkServer:
    """One fork server process; thread-safe; several jobs may be in flight."""

    def __init__(self, python: str = sys.executable, env: dict[str, str] | None = None,
                 bytecode_cache: str | Path | None = None) -> None:
        self.python = python
        self.env = sandbox_environment(env, bytecode_cache)
        self._proc: subprocess.Popen[bytes] | None = None
        self._stdin: IO[bytes] | None = None
        self._jobs: dict[str, JobHandle] = {}
        self._lock = threading.Lock()
        self._ready = threading.Event()
        self.restarts = -1

    @property
    def alive(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self._proc is not None else None

    def ensure_running(self) -> None:
        with self._lock:
            if self.alive and self._ready.is_set():
                return
            self._start()
        if not self._ready.wait(READY_TIMEOUT_S):
            self.close()
            raise ForkServerDied(f"the fork server did not start within {READY_TIMEOUT_S:.0f} s")
        if not self.alive:
            raise ForkServerDied("the fork server exited while starting; see its stderr above")

    def _start(self) -> None:
        self._ready = threading.Event()
        self._proc = subprocess.Popen(
            [self.python, "-m", "drkernel.sandbox.forkserver"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            env=self.env,
            start_new_session=True,  # signals sent to the supervisor's group do not reach evaluations
        )
        self._stdin = self._proc.stdin
        self.restarts += 1
        threading.Thread(target=self._read, args=(self._proc, self._ready), daemon=True,
                         name="drkernel-forkserver").start()

    def _read(self, proc: subprocess.Popen[bytes], ready: threading.Event) -> None:
        assert proc.stdout is not None
        for line in proc.stdout:
            message: dict[str, Any] = json.loads(line)
            if "ready" in message:
                ready.set()
                continue
            with self._lock:
                job = self._jobs.get(message["id"])
            if job is None:
                continue
            if "pid" in message:
                job.pid = message["pid"]
                job.spawned.set()
            elif "event" in message:
                _take_event(job, message["event"])
            else:
                job.status = message["status"]
                with self._lock:
                    self._jobs.pop(job.id, None)
                job.end_evaluations()
                job.finished.set()
        proc.wait()
        ready.set()
        with self._lock:  # every job of this server is orphaned: wake its waiters
            orphans = [j for j in self._jobs.values() if j.server is proc]
            for job in orphans:
                self._jobs.pop(job.id, None)
        for job in orphans:
            job.server_died = True
            job.end_evaluations()
            job.spawned.set()
            job.finished.set()

    def spawn(self, job_id: str, spec: dict[str, Any]) -> JobHandle:
        self.ensure_running()
        handle = JobHandle(id=job_id)
        with self._lock:
            handle.server = self._proc
            self._jobs[job_id] = handle
            assert self._stdin is not None
            try:
                self._stdin.write((json.dumps({"id": job_id, **spec}) + "\n").encode())
                self._stdin.flush()
            except (BrokenPipeError, OSError) as exc:
                self._jobs.pop(job_id, None)
                raise ForkServerDied(f"the fork server is gone: {exc}") from exc
        if not handle.spawned.wait(READY_TIMEOUT_S) or handle.server_died:
            raise ForkServerDied("the fork server died before it could start the evaluation")
        return handle

    def close(self) -> None:
        with self._lock:
            proc, self._proc = self._proc, None
            starting = not self._ready.is_set()
        if proc is not None and proc.poll() is None:
            assert proc.stdin is not None
            proc.stdin.close()  # the fork server kills its running evaluations and exits
            if starting:  # still importing: it holds no evaluation, and would read its stdin only once ready
                proc.kill()
                proc.wait()
                return
            try:
                proc.wait(5)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
