"""How many evaluation processes a host starts and ends a second on one GPU, at one or more at once (issue 20).

Every evaluation is two processes forked from the fork server (`drkernel.sandbox.forkserver`), a judge and a subject,
each starting CUDA as `processes.prepare_process` does (the context and a first kernel; in the subject, which profiles, a
profiler around it: CUPTI's initialisation) and ending with its context. The RL-shaped batch (`gpu_bench.py rl_batch`) judged about 80 distinct
candidates a minute with 3 evaluations at once and with 4, and each evaluation grew longer by what the fourth would
have added: something the evaluations share sets the rate. This measures one such thing, the host's starts and ends
of CUDA processes: `lanes` processes, each forking one such process after another from a parent that imported torch
and never touched CUDA (as the fork server does), for `--seconds` at each count of lanes:

    python benchmarks/process_starts.py --lanes 1,2,3,4,6 --seconds 8 --out DIR
    python benchmarks/process_starts.py --warm kernel ...   # as a judge starts: no profiler

`--warm profiler` starts each process as a subject starts, `--warm kernel` as a judge does (no CUPTI).

DIR/process_starts.json has, per count of lanes, the processes started and ended a second in all, and the median
seconds from the fork to the process's CUDA being ready (`start_s`; `init_s` of it until `torch.cuda.init` returned)
and from then until it was reaped (`end_s`). `--gpus N` spreads the lanes over N GPUs: whether what limits the rate is
the GPU's or the host's.
With `--device cpu` the processes start no CUDA (the script's own test, on a machine without a GPU).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import struct
import sys
import time
import traceback
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

import torch  # noqa: E402  (as the fork server: torch imported, CUDA untouched)

from drkernel.sandbox import startup  # noqa: E402

# A started process's fork, CUDA initialised (torch.cuda.init), ready and reaped times (time.perf_counter, host-wide).
RECORD = struct.Struct("dddd")


# A subject's start (the profiler's CUPTI initialisation included) or a judge's (the context and a first kernel).
WARM = {"profiler": lambda device: startup.warm_up(device, profiles=True),
        "kernel": lambda device: startup.warm_up(device, profiles=False)}


def _lane(device: torch.device, warm: str, until: float, out: int, gpu: int | None) -> None:
    """One process after another until `until`, on GPU `gpu` (the first visible where None); each one's times
    written to `out`."""
    while time.perf_counter() < until:
        ready_r, ready_w = os.pipe()
        forked = time.perf_counter()
        pid = os.fork()
        if pid == 0:
            os.close(ready_r)
            code = 1
            try:
                if gpu is not None:
                    os.environ["CUDA_VISIBLE_DEVICES"] = str(gpu)
                if device.type == "cuda":
                    torch.cuda.init()
                initialised = time.perf_counter()
                WARM[warm](device)
                os.write(ready_w, struct.pack("dd", initialised, time.perf_counter()))
                code = 0
            except BaseException:
                traceback.print_exc()
            finally:
                os._exit(code)
        os.close(ready_w)
        got = os.read(ready_r, 16)
        os.close(ready_r)
        _, status = os.waitpid(pid, 0)
        reaped = time.perf_counter()
        if len(got) != 16 or status != 0:
            print(f"process_starts: a started process failed (wait status {status})", file=sys.stderr, flush=True)
            os._exit(1)
        os.write(out, RECORD.pack(forked, *struct.unpack("dd", got), reaped))
    os._exit(0)


def run(device: torch.device, warm: str, lanes: int, seconds: float, gpus: int = 0
        ) -> list[tuple[float, float, float, float]]:
    """`lanes` lanes for `seconds`, lane i on GPU i mod `gpus` (all on the first visible GPU where 0): every started
    process's (fork, initialised, ready, reaped) times."""
    read_end, write_end = os.pipe()
    until = time.perf_counter() + seconds
    pids = []
    for lane in range(lanes):
        pid = os.fork()
        if pid == 0:
            os.close(read_end)
            try:
                _lane(device, warm, until, write_end, lane % gpus if gpus else None)
            finally:
                os._exit(1)  # _lane ends the process itself; reached only if it raised
        pids.append(pid)
    os.close(write_end)
    data = bytearray()
    while chunk := os.read(read_end, 1 << 16):
        data += chunk
    os.close(read_end)
    failed = [pid for pid in pids if os.waitpid(pid, 0)[1] != 0]
    if failed:
        raise SystemExit(f"process_starts: {len(failed)} of {lanes} lanes failed")
    return [RECORD.unpack_from(data, i) for i in range(0, len(data) - len(data) % RECORD.size, RECORD.size)]


def summarize(records: list[tuple[float, float, float, float]], lanes: int) -> dict[str, Any]:
    """Processes started and ended a second (from the first fork to the last reaping), and the medians."""
    if not records:
        return {"lanes": lanes, "processes": 0}
    span = max(r[3] for r in records) - min(r[0] for r in records)
    return {
        "lanes": lanes,
        "processes": len(records),
        "per_s": round(len(records) / span, 3) if span > 0 else None,
        "start_s": round(statistics.median(r[2] - r[0] for r in records), 4),
        "init_s": round(statistics.median(r[1] - r[0] for r in records), 4),
        "end_s": round(statistics.median(r[3] - r[2] for r in records), 4),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--lanes", default="1,2,3,4,6", help="counts of processes starting at once, in turn")
    parser.add_argument("--seconds", type=float, default=8.0, help="how long each count runs")
    parser.add_argument("--device", default="cuda", choices=("cuda", "cpu"))
    parser.add_argument("--warm", default="profiler", choices=tuple(WARM),
                        help="each process's start: as an evaluation's (profiler) or a first kernel only")
    parser.add_argument("--gpus", type=int, default=0,
                        help="spread the lanes over this many GPUs (lane i on GPU i mod N); 0: all on the first")
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args(argv)
    try:
        counts = [int(n) for n in args.lanes.split(",") if n.strip()]
    except ValueError:
        parser.error(f"--lanes takes counts separated by commas, not {args.lanes!r}")
    if not counts or min(counts) < 1 or args.seconds <= 0:
        parser.error("--lanes needs counts of at least 1 and --seconds a positive time")
    if args.device == "cuda" and not _has_gpu():
        raise SystemExit("process_starts: no CUDA GPU here; run it with --device cpu to try the script alone")
    device = torch.device("cuda", 0) if args.device == "cuda" else torch.device("cpu")
    args.out.mkdir(parents=True, exist_ok=True)
    rows = []
    for lanes in counts:  # written after each, so that a run cut short keeps what it measured
        rows.append(summarize(run(device, args.warm, lanes, args.seconds, args.gpus), lanes))
        (args.out / "process_starts.json").write_text(json.dumps(
            {"device": args.device, "warm": args.warm, "seconds": args.seconds, "gpus": args.gpus, "rows": rows},
            indent=1))
        row = rows[-1]
        print(f"lanes {lanes}: {row['processes']} processes, {row.get('per_s')} a second; start "
              f"{row.get('start_s')} s (initialised at {row.get('init_s')} s), end {row.get('end_s')} s (medians)", flush=True)
    return 0


def _has_gpu() -> bool:
    """Asked in a child: this process must stay without CUDA to fork the lanes."""
    pid = os.fork()
    if pid == 0:
        os._exit(0 if torch.cuda.is_available() and torch.cuda.device_count() > 0 else 1)
    return os.waitpid(pid, 0)[1] == 0


if __name__ == "__main__":
    sys.exit(main())
