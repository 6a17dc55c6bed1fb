"""How a GPU shares itself between processes that each wait on small kernels, as an evaluation's judge and subject do.

K processes on GPU 0 at once (K = 1, 2, 3, 6), each a loop of a tiny kernel and a synchronisation for 3 s; prints and
writes OUT (JSON) with, per K, each process's count of operations, median and 90th-percentile latency in ms:

    python benchmarks/gpu_contexts.py OUT.json

Two such processes make the GPU switch between their contexts at every kernel (docs/performance.md).
"""
import json
import multiprocessing as mp
import sys
import time


def worker(seconds, barrier, results):
    import torch
    x = torch.zeros(1024, device="cuda")
    for _ in range(100):
        x.add_(1)
        torch.cuda.synchronize()
    barrier.wait()
    latencies, end = [], time.perf_counter() + seconds
    while time.perf_counter() < end:
        start = time.perf_counter()
        x.add_(1)
        torch.cuda.synchronize()
        latencies.append(time.perf_counter() - start)
    latencies.sort()
    results.put((len(latencies), latencies[len(latencies) // 2] * 1e3, latencies[int(len(latencies) * 0.9)] * 1e3))


if __name__ == "__main__":
    spawn, out = mp.get_context("spawn"), {}
    for k in (1, 2, 3, 6):
        barrier, results = spawn.Barrier(k), spawn.Queue()
        processes = [spawn.Process(target=worker, args=(3.0, barrier, results)) for _ in range(k)]
        for p in processes:
            p.start()
        rows = [results.get(timeout=120) for _ in processes]
        for p in processes:
            p.join()
        out[k] = rows
        print(k, "processes: ops/s in all", round(sum(r[0] for r in rows) / 3.0), "median ms",
              [round(r[1], 4) for r in rows], "p90 ms", [round(r[2], 4) for r in rows], flush=True)
    json.dump(out, open(sys.argv[1], "w"))
