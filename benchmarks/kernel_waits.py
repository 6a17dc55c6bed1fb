"""Where the host's threads wait in the kernel while evaluations run (issue 20): a sampler of /proc.

On hosts of several GPUs the judge's phases made of CUDA driver calls grew 4-19 times, and the candidates' timed
calls stalled while their host enqueued them (docs/performance.md). A thread blocked in the kernel shows in /proc as
state D (uninterruptible: most often a driver holding a lock) or S, with the kernel function it sleeps in (`wchan`)
and, where the kernel lets this user read it, its kernel stack. This samples every thread of the processes whose
command line contains `--match`, every `--interval` seconds for `--seconds`, and counts what it saw:

    python benchmarks/kernel_waits.py --seconds 600 --out DIR &     # beside the run to look into; kill -TERM
                                                                     # ends it early, as --seconds would

DIR/kernel_waits.json: samples taken, thread-samples per state, and for threads in D the functions they slept in
and the innermost kernel frames below the scheduler's own (when readable), most frequent first; the same for S,
which is mostly idle waiting (epoll, futex) and is there for comparison.
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import signal
import sys
import time
from pathlib import Path
from typing import Iterator

SCHEDULER_FRAMES = ("__schedule", "schedule", "io_schedule", "schedule_timeout", "schedule_preempt_disabled",
                    "rwsem_down", "__mutex_lock", "mutex_lock", "down_", "__down", "__wait", "wait_for_completion")
FRAMES_KEPT = 3


def threads(match: str) -> Iterator[tuple[int, int]]:
    """(pid, tid) of every thread of the processes whose command line contains `match`."""
    for pid in (int(p) for p in os.listdir("/proc") if p.isdigit()):
        try:
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            if match not in cmdline or pid == os.getpid():
                continue
            for tid in os.listdir(f"/proc/{pid}/task"):
                yield pid, int(tid)
        except OSError:  # gone meanwhile
            continue


def state_of(stat: str) -> str:
    """The state letter of a /proc/.../stat line (after the command name, which may hold spaces and parentheses)."""
    return stat[stat.rindex(")") + 2]


def inner_frames(stack: str, kept: int = FRAMES_KEPT) -> str:
    """The innermost frames of a /proc/.../stack below the scheduler's own, as 'f1 < f2 < f3'."""
    names = [line.split("] ", 1)[-1].split("+", 1)[0].strip() for line in stack.splitlines() if line.strip()]
    names = [n for n in names if not n.startswith(SCHEDULER_FRAMES)]
    return " < ".join(names[:kept])


def sample(match: str, counts: dict[str, collections.Counter[str]]) -> None:
    for pid, tid in threads(match):
        base = f"/proc/{pid}/task/{tid}"
        try:
            state = state_of(Path(f"{base}/stat").read_text())
            wchan = Path(f"{base}/wchan").read_text().strip() or "0"
        except (OSError, ValueError, IndexError):
            continue
        counts["state"][state] += 1
        if state not in ("D", "S"):
            continue
        counts[f"{state}_wchan"][wchan] += 1
        try:
            frames = inner_frames(Path(f"{base}/stack").read_text())
        except OSError:  # the kernel shows stacks to privileged readers only
            continue
        if frames:
            counts[f"{state}_stack"][frames] += 1


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=float, required=True)
    parser.add_argument("--interval", type=float, default=0.05)
    parser.add_argument("--match", default="python", help="a substring of the command lines to sample")
    parser.add_argument("--top", type=int, default=25, help="entries kept per table")
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args(argv)
    if args.seconds <= 0 or args.interval <= 0 or args.top < 1:
        parser.error("--seconds, --interval and --top must be positive")
    if not Path("/proc/self/task").is_dir():
        raise SystemExit("kernel_waits: no /proc with threads here (Linux only)")
    counts: dict[str, collections.Counter[str]] = collections.defaultdict(collections.Counter)
    taken, end = 0, [time.monotonic() + args.seconds]
    signal.signal(signal.SIGTERM, lambda *_: end.__setitem__(0, 0.0))  # stopped early, it still writes what it saw
    while time.monotonic() < end[0]:
        sample(args.match, counts)
        taken += 1
        time.sleep(args.interval)
    args.out.mkdir(parents=True, exist_ok=True)
    report = {"seconds": args.seconds, "interval": args.interval, "match": args.match, "samples": taken,
              **{name: dict(counter.most_common(args.top)) for name, counter in sorted(counts.items())}}
    (args.out / "kernel_waits.json").write_text(json.dumps(report, indent=1))
    print(json.dumps({"samples": taken, "state": report.get("state", {}),
                      "D_wchan": report.get("D_wchan", {})}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
