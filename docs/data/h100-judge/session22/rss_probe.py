"""How much host memory an evaluation's own processes hold on a GPU: the group's resident bytes sampled every 20 ms
through a good evaluation (limit 16 GiB), then the verdicts under lower limits."""
import json, os, sys, threading, time
from pathlib import Path
from drkernel.runner.sandbox import Sandbox
from drkernel.sandbox import procfs
from drkernel.schema import EvalOptions, EvalRequest

device = sys.argv[1]
ref = Path("examples/tasks/1_vector_add.py").read_text()
good = Path("examples/candidates/1_vector_add__triton.py").read_text()
box = Sandbox(device=device, gpu="0" if device == "cuda" else None)
mine = os.getpgrp()
peaks: dict[int, int] = {}
stop = threading.Event()
def sample():
    while not stop.is_set():
        by: dict[int, int] = {}
        for p in procfs.processes():
            by[p.pgrp] = by.get(p.pgrp, 0) + p.rss_bytes
        for g, b in by.items():
            peaks[g] = max(peaks.get(g, 0), b)
        time.sleep(0.02)
t = threading.Thread(target=sample, daemon=True); t.start()
out = {}
for i in range(2):
    before = set(peaks)
    r = box.evaluate(EvalRequest(ref, good, EvalOptions(perf_trials=3, warmup_trials=1)))
    new = {g: b for g, b in peaks.items() if g not in before and g != mine}
    out[f"run{i}"] = [r.status, round(max(new.values(), default=0) / 2**20)]
stop.set()
for limit in (1024, 1536, 2048, 3072, 4096):
    r = box.evaluate(EvalRequest(ref, good, EvalOptions(perf_trials=3, warmup_trials=1, memory_limit_mb=limit)))
    out[str(limit)] = [r.status, r.error and r.error.kind]
box.close()
print(json.dumps(out))
