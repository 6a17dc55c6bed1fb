"""What an open dashboard costs `drkernel serve`: throughput of a fixed batch with and without pollers.

One `drkernel serve` subprocess (its own store, `--workers` workers) judges `--repetitions` batches per condition,
alternating (off, on, on, off, ...) so that drift in the machine's load falls on both alike. A batch is `--batch`
distinct evaluations of the examples (every batch its own seeds: no cache hits), submitted at once and waited for with
long-polls. "on": `--pollers` threads each do what an open dashboard does, GET /dashboard/data every `--interval`
seconds (with the page itself every tenth time). Per batch: the wall time and the server process's own CPU seconds
(its evaluations run in worker processes, so this is the service's bookkeeping, what a poller could add to).

    python benchmarks/dashboard_overhead.py --batch 60 --repetitions 5 --pollers 4 --interval 2 --out DIR

Prints and writes DIR/dashboard_overhead.json: per batch, and the ratio of the median throughputs (on / off).
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

import httpx  # noqa: E402

TOKEN = "dashboard-overhead-benchmark"
PAIRS = [("1_vector_add", "1_vector_add__triton"), ("2_relu", "2_relu__triton"), ("2_relu", "2_relu__wrong"),
         ("2_relu", "2_relu__pytorch_only"), ("5_layernorm", "5_layernorm__raises")]
OPTIONS = {"device": "cpu", "measure_performance": False, "profile": False, "correctness_trials": 1}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--batch", type=int, default=60)
    parser.add_argument("--repetitions", type=int, default=5, help="batches per condition")
    parser.add_argument("--pollers", type=int, default=4, help="open dashboards polling during 'on' batches")
    parser.add_argument("--interval", type=float, default=2.0, help="seconds between one poller's polls")
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    sources = {name: (REPO / "examples" / folder / f"{name}.py").read_text()
               for pair in PAIRS for folder, name in zip(("tasks", "candidates"), pair)}
    conditions = list(itertools.islice(itertools.cycle(["off", "on", "on", "off"]), 2 * args.repetitions))
    with served(args.workers) as (url, pid), httpx.Client(base_url=url, timeout=120,
                                                          headers={"Authorization": f"Bearer {TOKEN}"}) as client:
        run_batch(client, sources, args.workers * 4, seed=10**6, pid=pid)  # warm-up: workers and caches started
        batches = []
        for index, condition in enumerate(conditions):
            stop, polls = threading.Event(), [0] * args.pollers
            pollers = [threading.Thread(target=poll, args=(url, args.interval, stop, n, polls), daemon=True)
                       for n in range(args.pollers if condition == "on" else 0)]
            for thread in pollers:
                thread.start()
            wall_s, cpu_s = run_batch(client, sources, args.batch, seed=index * args.batch, pid=pid)
            stop.set()
            for thread in pollers:
                thread.join()
            batches.append({"condition": condition, "wall_s": wall_s, "server_cpu_s": cpu_s, "polls": sum(polls),
                            "evaluations_per_s": args.batch / wall_s, "load": os.getloadavg()[0]})
            print(json.dumps(batches[-1]), flush=True)
    rates = {c: [b["evaluations_per_s"] for b in batches if b["condition"] == c] for c in ("off", "on")}
    cpu = {c: [b["server_cpu_s"] for b in batches if b["condition"] == c] for c in ("off", "on")}
    summary = {
        "settings": vars(args) | {"out": str(args.out)},
        "batches": batches,
        "median_evaluations_per_s": {c: statistics.median(r) for c, r in rates.items()},
        "throughput_ratio_on_off": statistics.median(rates["on"]) / statistics.median(rates["off"]),
        "median_server_cpu_s": {c: statistics.median(v) for c, v in cpu.items()},
        "spread_off": (max(rates["off"]) - min(rates["off"])) / statistics.median(rates["off"]),
        # the server's CPU a poll costs: the difference of the conditions' CPU over the polls of an "on" batch
        "server_cpu_ms_per_poll": 1e3 * (statistics.median(cpu["on"]) - statistics.median(cpu["off"])) / max(
            1, statistics.median(b["polls"] for b in batches if b["condition"] == "on")),
    }
    (args.out / "dashboard_overhead.json").write_text(json.dumps(summary, indent=2))
    print(json.dumps({k: v for k, v in summary.items() if k not in ("batches", "settings")}, indent=2))


def run_batch(client: httpx.Client, sources: dict[str, str], size: int, seed: int, pid: int) -> tuple[float, float]:
    """Submit `size` distinct evaluations at once and wait for all: (wall seconds, server CPU seconds)."""
    items = [{"reference": sources[task], "candidate": sources[candidate], "task_name": task,
              "options": OPTIONS | {"seed": seed + n}}
             for n, (task, candidate) in zip(range(size), itertools.cycle(PAIRS))]
    cpu_before, start = cpu_seconds(pid), time.perf_counter()
    ids = client.post("/v1/evaluations", json={"items": items}).raise_for_status().json()["ids"]
    for id in ids:
        while client.get(f"/v1/evaluations/{id}", params={"wait": 60}).json()["state"] != "done":
            pass
    return time.perf_counter() - start, cpu_seconds(pid) - cpu_before


def poll(url: str, interval: float, stop: threading.Event, offset: int, polls: list[int]) -> None:
    """One open dashboard: its data every `interval` seconds, the page itself every tenth time; counts its polls
    in polls[offset]."""
    with httpx.Client(base_url=url, timeout=30, headers={"Authorization": f"Bearer {TOKEN}"}) as client:
        stop.wait(interval * offset / 4)  # the pollers spread over the interval, as browsers opened apart would be
        for n in itertools.count():
            if stop.is_set():
                return
            client.get("/dashboard/data").raise_for_status()
            polls[offset] += 1
            if n % 10 == 0:
                client.get("/dashboard").raise_for_status()
            stop.wait(interval)


def cpu_seconds(pid: int) -> float:
    """User and system CPU time of one process (not its children), from /proc."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


class served:
    """`drkernel serve` on a free loopback port with a fresh store, stopped on exit."""

    def __init__(self, workers: int) -> None:
        self.workers = workers

    def __enter__(self) -> tuple[str, int]:
        self.folder = tempfile.TemporaryDirectory()
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        self.process = subprocess.Popen(
            [sys.executable, "-m", "drkernel.cli.main", "serve", "--device", "cpu", "--workers", str(self.workers),
             "--port", str(port), "--store", f"{self.folder.name}/store.db"],
            env={**os.environ, "DRKERNEL_TOKEN": TOKEN, "PYTHONPATH": str(REPO)}, stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL)
        url, deadline = f"http://127.0.0.1:{port}", time.monotonic() + 120
        while True:
            try:
                if httpx.get(f"{url}/v1/health", timeout=2).status_code == 200:
                    return url, self.process.pid
            except httpx.TransportError:
                pass
            if self.process.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError("drkernel serve did not start")
            time.sleep(0.2)

    def __exit__(self, *exc: Any) -> None:
        self.process.terminate()
        self.process.wait(timeout=60)
        self.folder.cleanup()


if __name__ == "__main__":
    main()
