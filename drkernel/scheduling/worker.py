"""A worker process: owns one device slot, evaluates the jobs its scheduler sends, one at a time.

Protocol on stdin/stdout, one JSON object per line: in `{"job": id, "request": {...}}`, out
`{"job": id, "result": {...}}`. The scheduler sends at most two jobs at once; while the first runs, the second's
process is forked and initialises CUDA, so the device does not wait for start-up between evaluations.
Stdin closing ends the worker and every evaluation it started.
"""

from __future__ import annotations

import argparse
import json
import os
import select
import sys
from typing import IO, Any

from drkernel.runner.sandbox import Prepared, Sandbox
from drkernel.schema import EvalRequest, EvalResult, Status


class JobReader:
    def __init__(self, stream: IO[bytes]) -> None:
        self.fd = stream.fileno()
        self.buffer = b""
        self.closed = False

    def next(self, block: bool) -> dict[str, Any] | None:
        while b"\n" not in self.buffer:
            if self.closed:
                return None
            if not block and not select.select([self.fd], [], [], 0)[0]:
                return None
            chunk = os.read(self.fd, 1 << 20)
            if not chunk:
                self.closed = True
                return None
            self.buffer += chunk
        line, self.buffer = self.buffer.split(b"\n", 1)
        return json.loads(line) if line.strip() else self.next(block)


def prepare(sandbox: Sandbox, job: dict[str, Any]) -> tuple[str, Prepared | EvalResult]:
    try:
        request = EvalRequest.from_dict(job["request"])
    except (KeyError, TypeError, ValueError) as exc:
        return job.get("job", ""), EvalResult.failure(Status.INVALID, "BadRequest", f"unusable request: {exc}")
    return job["job"], sandbox.prepare(request)


def run(sandbox: Sandbox, jobs: JobReader, out: IO[str]) -> None:
    upcoming: tuple[str, Prepared | EvalResult] | None = None
    while True:
        if upcoming is None:
            job = jobs.next(block=True)
            if job is None:
                return
            upcoming = prepare(sandbox, job)
        job_id, current = upcoming
        upcoming = None
        if isinstance(current, Prepared):
            sandbox.start(current)
        following = jobs.next(block=False)
        if following is not None:
            upcoming = prepare(sandbox, following)  # forks and initialises while `current` runs
        result = sandbox.collect(current) if isinstance(current, Prepared) else current
        out.write(json.dumps({"job": job_id, "result": result.to_dict()}) + "\n")
        out.flush()


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    parser.add_argument("--gpu", default=None)
    parser.add_argument("--memory-cap-mb", type=int, default=None)
    args = parser.parse_args(argv)
    out = os.fdopen(os.dup(1), "w")
    os.dup2(2, 1)  # anything printed by libraries goes to stderr, never into the protocol
    sandbox = Sandbox(device=args.device, gpu=args.gpu, memory_cap_mb=args.memory_cap_mb)
    try:
        run(sandbox, JobReader(sys.stdin.buffer), out)
    finally:
        sandbox.close()


if __name__ == "__main__":
    main()
