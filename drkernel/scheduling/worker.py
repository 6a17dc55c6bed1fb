"""A worker process: owns one device slot, evaluates the jobs its scheduler sends, one at a time.

Protocol on stdin/stdout, one JSON object per line: out `{"ready": pid}` once the supervisor's fork server is up,
then in `{"job": id, "request": {...}}`, out `{"job": id, "result": {...}}`. The scheduler sends a few jobs at
once; while the first ones run, the next ones' processes are forked and initialise CUDA, so the device does not
wait for start-up between evaluations.
Stdin closing ends the worker and every evaluation it started; so does SIGTERM (sent by a scheduler that closes
while the worker is still starting, with no job for it), at once, its fork server with it.
"""

from __future__ import annotations

import argparse
import json
import os
import queue
import signal
import sys
import threading
from concurrent.futures import Future
from typing import IO, Any

from drkernel.runner.forkserver import ForkServerDied
from drkernel.runner.supervisor import GPU_OVERLAP, DeviceQueue, Supervisor
from drkernel.schema import ErrorKind, EvalRequest, EvalResult, Status


def submit(device: DeviceQueue, job: dict[str, Any]) -> tuple[str, Future[EvalResult]]:
    try:
        request = EvalRequest.from_dict(job["request"])
    except (KeyError, TypeError, ValueError) as exc:
        unusable: Future[EvalResult] = Future()
        unusable.set_result(EvalResult.failed(Status.INVALID, ErrorKind.BAD_REQUEST, f"unusable request: {exc}"))
        return job.get("job", ""), unusable
    return job["job"], device.submit(request)


def run(supervisor: Supervisor, jobs: IO[bytes], out: IO[str]) -> None:
    """Evaluate jobs in order; each job's process is forked as soon as the job arrives, so its start-up overlaps
    the evaluation in front of it."""
    device = DeviceQueue(supervisor)
    pending: queue.Queue[tuple[str, Future[EvalResult]] | None] = queue.Queue()

    def receive() -> None:
        for line in jobs:
            if line.strip():
                pending.put(submit(device, json.loads(line)))
        pending.put(None)

    threading.Thread(target=receive, daemon=True, name="drkernel-receive").start()
    while (item := pending.get()) is not None:
        job_id, result = item
        out.write(json.dumps({"job": job_id, "result": result.result().to_dict()}) + "\n")
        out.flush()


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    parser.add_argument("--gpu", default=None)
    parser.add_argument("--memory-cap-mb", type=int, default=None)
    parser.add_argument("--overlap", type=int, default=None,
                        help=f"evaluations running at once (default: {GPU_OVERLAP} on a GPU)")
    parser.add_argument("--judge-hosts", action=argparse.BooleanOptionalAction, default=True,
                        help="judges that outlive their evaluations: one process started per evaluation, not two "
                             "(--no-judge-hosts: a judge process per evaluation)")
    args = parser.parse_args(argv)
    signal.signal(signal.SIGTERM, _terminated)  # before the fork server starts: it is closed on the way out
    out = os.fdopen(os.dup(1), "w")
    os.dup2(2, 1)  # anything printed by libraries goes to stderr, never into the protocol
    supervisor = Supervisor(device=args.device, gpu=args.gpu, memory_cap_mb=args.memory_cap_mb, overlap=args.overlap,
                            judge_hosts=args.judge_hosts)
    try:
        try:
            supervisor.server.ensure_running()  # before the first job, not in its time
            if supervisor.hosts is not None:
                supervisor.hosts.start(supervisor.overlap)
        except ForkServerDied as exc:  # each job tries again, and fails with the reason if it must
            print(f"drkernel worker: the fork server did not start: {exc}", file=sys.stderr, flush=True)
        out.write(json.dumps({"ready": os.getpid()}) + "\n")
        out.flush()
        run(supervisor, sys.stdin.buffer, out)
    finally:
        supervisor.close()


def _terminated(signum: int, frame: Any) -> None:
    raise SystemExit(128 + signum)  # through main's `finally`: the fork server (still starting, maybe) goes too


if __name__ == "__main__":
    main()
