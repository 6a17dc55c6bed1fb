# Does where a small input lies in GPU memory set a 7 us kernel's time? 40 placements of a 1024 x 1024 float32 input
# (a random-size block allocated before each), torch.relu timed 100 times per placement in two rounds (L2 flushed
# before every call, as drkernel and do_bench do); the CV of the placements' medians, and round 1 against round 2.
import json, statistics, sys, torch
torch.manual_seed(0)
dev = torch.device("cuda")
flush = torch.empty(256 * 2**20, dtype=torch.int8, device=dev)
keep, xs = [], []
g = torch.Generator().manual_seed(1)
for i in range(40):
    keep.append(torch.empty(int(torch.randint(1, 64, (1,), generator=g)) * 2**20 + 512 * int(torch.randint(0, 2048, (1,), generator=g)), dtype=torch.int8, device=dev))
    xs.append(torch.rand(1024, 1024, device=dev))
outs = [torch.empty_like(x) for x in xs]
def med(x, out, n=100):
    ts = []
    for _ in range(n):
        flush.zero_()
        s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        s.record(); torch.relu(x, out=out) if False else torch.clamp_min(x, 0, out=out); e.record()
        e.synchronize(); ts.append(s.elapsed_time(e))
    return statistics.median(ts)
for x, o in zip(xs, outs):
    med(x, o, 10)
r1 = [med(x, o) for x, o in zip(xs, outs)]
r2 = [med(x, o) for x, o in zip(xs, outs)]
cv = lambda v: statistics.stdev(v) / statistics.mean(v)
import numpy as np
out = {"round1_ms": r1, "round2_ms": r2, "cv_round1": cv(r1), "cv_round2": cv(r2),
       "corr_rounds": float(np.corrcoef(r1, r2)[0, 1]),
       "cv_of_round_ratio": cv([a / b for a, b in zip(r1, r2)]),
       "ptrs": [x.data_ptr() % (1 << 30) for x in xs]}
print(json.dumps({k: v for k, v in out.items() if not isinstance(v, list)}))
print("r1", [round(v * 1000, 2) for v in r1]); print("r2", [round(v * 1000, 2) for v in r2])
json.dump(out, open(sys.argv[1], "w"))
