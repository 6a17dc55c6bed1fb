"""The miniature's process pool (benchmarks/miniature.py): its command lines (Step), the runs waiting for a GPU
(Job), and ProcessPool, which runs jobs as processes, each alone on a GPU slot, stops them at a deadline and says
which are left for a later call. Standard library only, loaded by the miniature beside it."""

from __future__ import annotations

import os
import shlex
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import IO

CLI = "drkernel.cli.main"
REPO = Path(__file__).resolve().parent.parent  # the runs start here, with drkernel from it on PYTHONPATH
POLL_S = 0.2  # how often the pool looks at its processes
LOAD_EVERY_S = 60.0  # how often the pool prints the host's load (four runs at once made evaluations 2.4x as long)


@dataclass(frozen=True)
class Job:
    """A stage's run for one policy in the pool: made into its command line only when a GPU takes it, since a
    bench's line depends on what is on disk then (`--resume`, or nothing to do)."""

    stage: str
    policy: str  # "" for a stage run once
    make: Callable[[], list[Step]]
    needs: Path | None = None  # the RL policy it runs: the job waits while `rl POLICY` is pending or running

    @property
    def name(self) -> str:
        return f"{self.stage} {self.policy}".strip()


@dataclass
class Step:
    """One command line: `python -m MODULE ARGS`, where MODULE is drkernel's CLI or a drkernel script module."""

    name: str
    module: str
    args: list[str]

    def argv(self) -> list[str]:
        return [sys.executable, "-m", self.module, *self.args]

    def shown(self) -> str:
        head = "drkernel" if self.module == CLI else f"python -m {self.module}"
        return f"{head} {shlex.join(self.args)}"


class ProcessPool:
    """The pool's side of the pipeline: runs Jobs on the GPUs it was given (`gpus`, `per_gpu` slots each), logs in
    ROOT/logs/, stops them at `deadline` (time.monotonic) and lists what it stopped in `incomplete`."""

    root: Path
    gpus: int
    per_gpu: int
    deadline: float | None
    incomplete: list[str]

    def _devices(self) -> list[str]:
        """The GPUs the runs go to: the first `gpus` of CUDA_VISIBLE_DEVICES where it is set, else 0..gpus-1."""
        visible = [device.strip() for device in os.environ.get("CUDA_VISIBLE_DEVICES", "").split(",") if device.strip()]
        if not visible:
            return [str(index) for index in range(self.gpus)]
        if len(visible) < self.gpus:
            raise SystemExit(f"--gpus {self.gpus}, but CUDA_VISIBLE_DEVICES={os.environ['CUDA_VISIBLE_DEVICES']} "
                             f"names {len(visible)}")
        return visible[:self.gpus]

    def _run_pool(self, jobs: list[Job]) -> None:
        """Each job as a process on a free slot (`per_gpu` slots a GPU; logs in ROOT/logs/), in the order given,
        a job that needs a policy only once it exists; one whose policy no pending or running job makes is left
        for a later call. At the deadline the running processes are stopped (their checkpoints stay) and every
        job not finished counts as incomplete: the same command continues them."""
        devices, logs = self._devices(), self.root / "logs"
        logs.mkdir(parents=True, exist_ok=True)
        pending, running, failed = list(jobs), {}, []
        load_due = time.monotonic() + LOAD_EVERY_S

        def ready() -> Job | None:
            return next((job for job in pending if not missing(job.needs)), None)

        while pending or running:
            if running and time.monotonic() >= load_due:
                load_due += LOAD_EVERY_S
                print(f"[pool] {len(running)} running; {_host_load()}", flush=True)
            for slot in (slot for slot in range(len(devices) * self.per_gpu) if slot not in running):
                while (job := ready()) is not None:
                    pending.remove(job)
                    steps = job.make()
                    if steps:
                        running[slot] = self._start(job, steps, devices[slot // self.per_gpu], logs)
                        break
                    print(f"[{job.name}] done already", flush=True)
            makers = {job.policy for job in [*pending, *(run[0] for run in running.values())] if job.stage == "rl"}
            for job in [job for job in pending if missing(job.needs) and job.policy not in makers]:
                pending.remove(job)
                print(f"[{job.stage}] {job.policy}: not trained yet, left for a later call", flush=True)
            for slot, (job, step, process, log, started) in list(running.items()):
                code = process.poll()
                if code is None:
                    continue
                del running[slot]
                log.close()
                print(f"[{step.name}] exit {code} after {time.perf_counter() - started:.1f} s (log: "
                      f"{logs / _log_name(step)})", flush=True)
                if code != 0:
                    failed.append(step.name)
            if self.deadline is not None and time.monotonic() >= self.deadline:
                for job, step, process, log, started in running.values():
                    _stop(process)
                    log.close()
                    print(f"[{step.name}] stopped at the time limit after {time.perf_counter() - started:.1f} s",
                          flush=True)
                self.incomplete += [run[1].name for run in running.values()] + [job.name for job in pending]
                break
            time.sleep(POLL_S if running else 0)
        if failed:
            raise SystemExit(f"failed: {', '.join(failed)}; see {logs}")

    def _start(self, job: Job, steps: list[Step], device: str,
               logs: Path) -> tuple[Job, Step, subprocess.Popen, IO[str], float]:
        (step,) = steps
        print(f"[{job.stage}] {step.shown()} (GPU {device})", flush=True)
        env = {**os.environ, "CUDA_VISIBLE_DEVICES": device,
               "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]).rstrip(os.pathsep)}
        log = open(logs / _log_name(step), "a")
        process = subprocess.Popen(step.argv(), env=env, stdout=log, stderr=subprocess.STDOUT, cwd=REPO,
                                   start_new_session=True)
        return job, step, process, log, time.perf_counter()


def missing(policy: Path | None) -> bool:
    """Whether a run needs a policy (`Pipeline.needs`) that is not on disk yet."""
    return policy is not None and not policy.exists()


def _host_load() -> str:
    """The host's load averages and, where Linux says it (/proc/loadavg), its threads: runnable now and in all. Many
    more threads than CPUs, runnable at once, is the oversubscription four runs on four GPUs could not tell apart."""
    one, five, _ = os.getloadavg()
    said = f"host load {one:.1f} (1 min), {five:.1f} (5 min)"
    try:
        runnable, threads = Path("/proc/loadavg").read_text().split()[3].split("/")
        said += f", {runnable} of {threads} threads runnable"
    except (OSError, IndexError, ValueError):
        pass
    return f"{said} on {os.cpu_count()} CPUs"


def _log_name(step: Step) -> str:
    return step.name.replace(" ", "_") + ".log"


def _stop(process: subprocess.Popen) -> None:
    """SIGTERM to the run's process group (a trainer saves nothing more, its checkpoints stay), SIGKILL after 30 s."""
    try:
        os.killpg(process.pid, signal.SIGTERM)
        process.wait(timeout=30)
    except ProcessLookupError:  # it ended on its own meanwhile
        pass
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
    process.wait()
