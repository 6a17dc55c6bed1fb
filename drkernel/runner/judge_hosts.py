"""Judges that outlive their evaluations, seen from the supervisor: one judge host per evaluation slot of a device.

Each host (drkernel.sandbox.judge_host) is forked by the fork server once, in the namespaces an evaluation gets, and
judges the evaluations handed to it one after another, each against a fresh subject: one CUDA process started per
evaluation instead of two. A host that ends (killed at a timeout or a memory limit, or by a candidate) is replaced at
the next evaluation.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
import threading
import time
import uuid
from pathlib import Path
from typing import Any

from drkernel.runner.forkserver import READY_TIMEOUT_S, ForkServer, ForkServerDied, JobHandle
from drkernel.sandbox.judge_host import JOB_FILE
from drkernel.schema import EvalRequest


class JudgeHost:
    """One judge host: its folder (its output, the working directories of its evaluations) and its fork server
    job."""

    def __init__(self, server: ForkServer, root: Path, spec: dict[str, Any]) -> None:
        self.home = Path(tempfile.mkdtemp(prefix="judge-", dir=root))
        self.handle = server.spawn(uuid.uuid4().hex, {**spec, "workdir": str(self.home), "host": True})

    @property
    def alive(self) -> bool:
        return not self.handle.finished.is_set()

    def hand_over(self, request: EvalRequest, memory_limit_mb: int) -> tuple[JobHandle, Path]:
        """Give the host `request` to judge; the evaluation's handle (its pid: the host's) and working directory."""
        if not self.handle.host_ready.wait(READY_TIMEOUT_S) or not self.alive:
            raise ForkServerDied("the judge host did not start")
        workdir = Path(tempfile.mkdtemp(prefix="job-", dir=self.home))
        (workdir / "request.json").write_text(json.dumps(request.to_dict()))
        owner = self.handle.uid if os.geteuid() == 0 and self.handle.uid not in (None, 0) else None
        if owner is not None:  # the host judges as an unprivileged uid
            for path in (workdir, *workdir.iterdir()):
                os.chown(path, owner, owner)
        evaluation = JobHandle(id=uuid.uuid4().hex, pid=self.handle.pid, server=self.handle.server)
        evaluation.spawned.set()
        self.handle.evaluations[evaluation.id] = evaluation
        if not self.alive:  # ended meanwhile: the evaluation ends with it
            self.handle.end_evaluations()
            return evaluation, workdir
        order = self.home / f"{JOB_FILE}.tmp"
        order.write_text(json.dumps({"id": evaluation.id, "workdir": str(workdir),
                                     "memory_limit_mb": memory_limit_mb, "at": time.time()}))
        if owner is not None:
            os.chown(order, owner, owner)
        order.rename(self.home / JOB_FILE)
        return evaluation, workdir


class JudgeHosts:
    """The hosts of one device: a free one for each evaluation (at most `slots` at once), started when needed."""

    def __init__(self, server: ForkServer, root: Path, spec: dict[str, Any], slots: int) -> None:
        self.server, self.root, self.spec = server, root, spec
        self._free: list[JudgeHost] = []
        self._lock = threading.Lock()
        self._slots = threading.Semaphore(slots)

    def take(self) -> JudgeHost:
        """A free, live host (a new one if none is); give it back with `give_back`."""
        self._slots.acquire()
        try:
            with self._lock:
                while self._free:
                    host = self._free.pop()
                    if host.alive:
                        return host
            return JudgeHost(self.server, self.root, self.spec)
        except BaseException:
            self._slots.release()
            raise

    def give_back(self, host: JudgeHost) -> None:
        with self._lock:
            if host.alive:
                self._free.append(host)
            else:  # ended: its folder holds nothing more (the output of a judge that ended is in no verdict)
                shutil.rmtree(host.home, ignore_errors=True)
        self._slots.release()

    def close(self) -> None:
        """Remove the folders of the hosts (their processes end with the fork server)."""
        with self._lock:
            hosts, self._free = self._free, []
        for host in hosts:
            shutil.rmtree(host.home, ignore_errors=True)

    def start(self, count: int) -> None:
        """Start `count` hosts ahead, so that the first evaluations do not wait for them."""
        hosts = [self.take() for _ in range(count)]
        for host in hosts:
            self.give_back(host)
