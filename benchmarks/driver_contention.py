"""Which calls into the CUDA driver slow down when evaluations run on several GPUs of one host (issue 20).

On four H200s of one host (docs/performance.md, "Several GPUs of one host"), with one scheduler alone and three at
once on three GPUs, the GPU's own work kept its time and the judge's phases made of driver calls grew 4-19 times.
This isolates those calls, each in a loop, in one process per GPU and all at once:

    python benchmarks/driver_contention.py --gpus 0,1,2,3 --out DIR

Scenarios: `alone` (one process, on the first GPU), `spread` (one process for each GPU named: `--gpus 0,0,0,1,1,1`
runs three on each of two), `same` (as many processes, all on the first GPU: what one GPU's own evaluations do to
each other), `starting` (as `spread`, while processes beside them start a CUDA context and end, back to back, one
loop on each GPU `--starters` names: every evaluation starts and ends two such processes, a judge and a subject,
and a host of four busy GPUs starts several a second). Every measured process runs the same operation at
the same time (a barrier between operations), each the way the judge does it:

  kernel     a small kernel and a synchronisation: the GPU's own work, the control
  launch     a small Triton kernel's launch, the host's enqueueing alone (Triton's launcher asks the driver about
             every pointer argument, `cuPointerGetAttribute`; the judge's reference, launched by torch, does not)
  pointer    that question alone, about a tensor of the process's own, as the launcher asks it
  malloc     64 MiB allocated and given back to the driver (cudaMalloc, cudaFree)
  ipc        a 4 MiB tensor shared with a peer process the way the judge and the subject hand values over
             (`drkernel.sandbox.channel`: a memory handle and an inter-process event, mapped and let go by the peer),
             less a pipe round trip without a tensor
  profiler   one profiler around a small kernel (`torch.profiler`, CPU and CUDA activity), as the
             profile phase opens one per call
  context    a new process's CUDA start: its first tensor on the GPU, import excluded

DIR/driver_contention.json holds every process's median and 90th percentile per operation and scenario, each
scenario's medians over `alone`'s, and in `starting` how many CUDA starts a second ran beside (`starts_per_s`).
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import queue
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

OPERATIONS = ("kernel", "launch", "pointer", "malloc", "ipc", "profiler", "context")
SCENARIOS = ("alone", "spread", "same", "starting")
CONTEXT_PROBE = ("import time, torch; t = time.perf_counter(); torch.zeros(1, device='cuda'); "
                 "torch.cuda.synchronize(); print(time.perf_counter() - t)")


def placements(gpus: list[str]) -> dict[str, list[str]]:
    """The GPU of each process, per scenario."""
    return {"alone": gpus[:1], "spread": list(gpus), "same": [gpus[0]] * len(gpus), "starting": list(gpus)}


def _start_contexts(gpu: str, stop: Any, started: Any) -> None:
    """A CUDA start and end after another on `gpu` until `stop` is set; counts them in `started`."""
    while not stop.is_set():
        subprocess.run([sys.executable, "-c", CONTEXT_PROBE], capture_output=True, check=True,
                       env={**os.environ, "CUDA_VISIBLE_DEVICES": gpu})
        with started.get_lock():
            started.value += 1


def summarize(samples: dict[str, dict[str, list[list[float]]]]) -> dict[str, Any]:
    """Per scenario and operation: each process's median and 90th percentile (ms), and the median of the processes'
    medians over `alone`'s. `samples[scenario][operation]` holds one list of milliseconds per process."""
    out: dict[str, Any] = {}
    for scenario, operations in samples.items():
        rows = {}
        for operation, per_process in operations.items():
            medians = [statistics.median(ms) for ms in per_process if ms]
            rows[operation] = {
                "median_ms": [round(m, 4) for m in medians],
                "p90_ms": [round(sorted(ms)[int(0.9 * (len(ms) - 1))], 4) for ms in per_process if ms],
            }
        out[scenario] = rows
    base = out.get("alone", {})
    for scenario, rows in out.items():
        for operation, row in rows.items():
            alone = base.get(operation, {}).get("median_ms")
            if alone and row["median_ms"]:
                row["over_alone"] = round(statistics.median(row["median_ms"]) / alone[0], 2)
    return out


def _peer(conn: Any) -> None:
    """The other side of `ipc`: maps what it is sent, reads one value, lets it go, answers."""
    import torch

    from drkernel.sandbox import channel

    device = torch.device("cuda", 0)
    torch.zeros(1, device=device)
    while True:
        message = conn.recv()
        if message is None:
            return
        if message != "ping":
            tensor = channel.decode(message, [], device)
            float(tensor[0])
            del tensor
            torch.cuda.ipc_collect()
        conn.send("ok")


def _worker(gpu: str, iterations: int, contexts: int, barrier: Any, results: Any, index: int) -> None:
    os.environ["CUDA_VISIBLE_DEVICES"] = gpu
    import ctypes

    import torch
    import triton
    import triton.language as tl
    from torch.profiler import ProfilerActivity, profile

    from drkernel.sandbox import channel

    spawn = multiprocessing.get_context("spawn")
    here, there = spawn.Pipe()
    peer = spawn.Process(target=_peer, args=(there,), daemon=True)
    peer.start()
    device = torch.device("cuda", 0)
    x = torch.zeros(1024, device=device)
    torch.cuda.synchronize()

    def kernel() -> None:
        x.add_(1)
        torch.cuda.synchronize()

    @triton.jit
    def add_one(x_ptr, n, BLOCK: tl.constexpr):
        offs = tl.arange(0, BLOCK)
        tl.store(x_ptr + offs, tl.load(x_ptr + offs, mask=offs < n) + 1, mask=offs < n)

    def launch() -> None:
        add_one[(1,)](x, x.numel(), BLOCK=1024)

    libcuda, answer = ctypes.CDLL("libcuda.so.1"), ctypes.c_uint64(0)

    def pointer() -> None:
        libcuda.cuPointerGetAttribute(ctypes.byref(answer), 3, ctypes.c_uint64(x.data_ptr()))  # DEVICE_POINTER

    def malloc() -> None:
        block = torch.empty(64 << 20, dtype=torch.uint8, device=device)
        del block
        torch.cuda.empty_cache()

    def pipe() -> None:
        here.send("ping")
        here.recv()

    def ipc() -> None:
        encoder = channel.Encoder()
        value = torch.ones(1 << 20, device=device)
        here.send(encoder.encode(value))
        here.recv()
        del encoder, value
        torch.cuda.ipc_collect()

    def profiled() -> None:
        with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]):
            x.add_(1)
            torch.cuda.synchronize()

    def timed(step: Any, n: int) -> list[float]:
        step()  # once untimed: first-use costs are not what is compared
        ms = []
        for _ in range(n):
            start = time.perf_counter()
            step()
            ms.append((time.perf_counter() - start) * 1e3)
        return ms

    samples: dict[str, list[float]] = {}
    for operation in OPERATIONS:
        barrier.wait()
        if operation == "ipc":
            round_trip = statistics.median(timed(pipe, iterations))
            samples[operation] = [max(0.0, ms - round_trip) for ms in timed(ipc, iterations)]
        elif operation == "context":
            samples[operation] = []
            for _ in range(contexts):
                done = subprocess.run([sys.executable, "-c", CONTEXT_PROBE], capture_output=True, text=True,
                                      check=True, env={**os.environ, "CUDA_VISIBLE_DEVICES": gpu})
                samples[operation].append(float(done.stdout.strip().splitlines()[-1]) * 1e3)
        else:
            steps = {"kernel": kernel, "launch": launch, "pointer": pointer, "malloc": malloc, "profiler": profiled}
            samples[operation] = timed(steps[operation], iterations)
            torch.cuda.synchronize()  # the launches' kernels, before the next operation
    here.send(None)
    peer.join(timeout=30)
    results.put((index, samples))


def run_scenario(gpus: list[str], iterations: int, contexts: int,
                 starters: list[str] | None = None) -> tuple[dict[str, list[list[float]]], float | None]:
    """Each operation's samples per process, and with `starters` the CUDA starts a second beside them."""
    spawn = multiprocessing.get_context("spawn")
    barrier, results = spawn.Barrier(len(gpus)), spawn.Queue()
    stop, started = spawn.Event(), spawn.Value("i", 0)
    loops = [spawn.Process(target=_start_contexts, args=(gpu, stop, started), daemon=True) for gpu in starters or []]
    for loop in loops:
        loop.start()
    workers = [spawn.Process(target=_worker, args=(gpu, iterations, contexts, barrier, results, i))
               for i, gpu in enumerate(gpus)]
    began = time.perf_counter()
    for worker in workers:
        worker.start()
    try:
        collected = dict(results.get(timeout=600) for _ in workers)
    except queue.Empty:
        for worker in workers:
            worker.kill()
        codes = [worker.exitcode for worker in workers]
        raise SystemExit(f"driver_contention: a process on GPUs {gpus} did not finish (exit codes {codes})") from None
    finally:
        stop.set()
    rate = started.value / (time.perf_counter() - began) if loops else None
    for process in workers + loops:
        process.join(timeout=60)
    return {operation: [collected[i][operation] for i in range(len(gpus))] for operation in OPERATIONS}, rate


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--gpus", required=True, help="GPU indices as nvidia-smi numbers them, e.g. 0,1,2,3")
    parser.add_argument("--iterations", type=int, default=100, help="timed repetitions of each operation")
    parser.add_argument("--contexts", type=int, default=4, help="new processes timed for `context`")
    parser.add_argument("--scenarios", default=",".join(SCENARIOS))
    parser.add_argument("--starters", help="GPUs of the loops that start CUDA contexts in `starting` (default: "
                                           "those of --gpus, once each)")
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args(argv)
    gpus = [g.strip() for g in args.gpus.split(",") if g.strip()]
    scenarios = [s.strip() for s in args.scenarios.split(",") if s.strip()]
    unknown = sorted(set(scenarios) - set(SCENARIOS))
    if not gpus or unknown or args.iterations < 1 or args.contexts < 1:
        parser.error(f"--gpus needs at least one index; scenarios are {', '.join(SCENARIOS)}"
                     + (f" (not {', '.join(unknown)})" if unknown else "") + "; counts are at least 1")
    if subprocess.run([sys.executable, "-c", "import torch, sys; sys.exit(not torch.cuda.is_available())"],
                      env={**os.environ, "CUDA_VISIBLE_DEVICES": gpus[0]}).returncode != 0:
        raise SystemExit(f"driver_contention: no CUDA GPU {gpus[0]} here; it measures the CUDA driver only")
    where = placements(gpus)
    args.out.mkdir(parents=True, exist_ok=True)
    starters = ([g.strip() for g in args.starters.split(",") if g.strip()] if args.starters
                else list(dict.fromkeys(gpus)))
    samples: dict[str, dict[str, list[list[float]]]] = {}
    starts_per_s: float | None = None
    for scenario in scenarios:  # written after each, so that a run cut short keeps what it measured
        samples[scenario], rate = run_scenario(where[scenario], args.iterations, args.contexts,
                                               starters if scenario == "starting" else None)
        starts_per_s = rate if rate is not None else starts_per_s
        summary = summarize(samples)
        (args.out / "driver_contention.json").write_text(json.dumps(
            {"gpus": gpus, "placements": {s: where[s] for s in samples}, "iterations": args.iterations,
             "contexts": args.contexts, "starters": starters if "starting" in samples else None,
             "starts_per_s": None if starts_per_s is None else round(starts_per_s, 2), "summary": summary}, indent=1))
        print(f"[{scenario}] done", flush=True)
    print(f"{'operation':<10}" + "".join(f"{s:>26}" for s in scenarios))
    for operation in OPERATIONS:
        cells = []
        for scenario in scenarios:
            row = summary[scenario][operation]
            cells.append(f"{statistics.median(row['median_ms']):10.3f} ms x{row.get('over_alone', 1.0):<5}")
        print(f"{operation:<10}" + "".join(f"{c:>26}" for c in cells))
    return 0


if __name__ == "__main__":
    sys.exit(main())
