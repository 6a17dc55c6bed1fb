# Issue 20 (twenty-seventh session), third call: a scheduler's start-up on another machine, 0ec10e7's fork server
# ("new", the working tree) against cba80d0 ("head"), in turn; where the fork server's imports go now (-X importtime,
# the collector off, bytecode from the folder): the modules that take longest.
export PYTHONUNBUFFERED=1
W=/tmp/w3; mkdir -p $W
nvidia-smi --query-gpu=index,name,driver_version,memory.total --format=csv,noheader; date -u; python3 -V
lscpu | grep -E '^Model name|^CPU\(s\)|MHz' | head -4
BC=$HOME/.cache/drkernel/bytecode
cat > $W/startup.py <<'PY'
import sys, time
t = time.monotonic()
from drkernel.scheduling.scheduler import Scheduler
imported = time.monotonic()
s = Scheduler(device="cuda")
ok = s.wait_ready(timeout=120)
end = time.monotonic()
print(f"{sys.argv[1]} {end - t:.2f} {ok} import {imported - t:.2f} construct-to-ready {end - imported:.2f}")
s.close()
PY
startup() { (cd $2 && CUDA_VISIBLE_DEVICES=0 PYTHONPATH=$PWD timeout 60 python3 $W/startup.py $1 2>&1 | tail -1); }
rm -rf $BC
startup new-first . | tee -a $W/first.txt; startup head-first .carry/S27/head | tee -a $W/first.txt
for i in 1 2 3 4 5 6 7 8 9 10; do
  startup new . | tee -a $W/startup.txt; startup head .carry/S27/head | tee -a $W/startup.txt
done
python3 - $W/startup.txt <<'PY'
import collections, statistics, sys
runs = collections.defaultdict(list)
for line in open(sys.argv[1]):
    f = line.split(); runs[f[0]].append(float(f[1]))
for label, v in runs.items():
    print(f"{label}: median {statistics.median(v):.2f} min {min(v):.2f} max {max(v):.2f} under 3 s: {sum(x < 3 for x in v)} of {len(v)}")
PY
for i in 1 2; do
  PYTHONPATH=$PWD PYTHONPYCACHEPREFIX=$BC python3 -X importtime -c "import gc; gc.disable(); import runpy, sys; sys.argv = ['z']; import triton, torch, torch.profiler, triton.runtime.interpreter, triton.testing, drkernel.sandbox.judge, drkernel.sandbox.subject, drkernel.sandbox.gate" 2> $W/imp$i.txt
done
python3 - $W/imp1.txt $W/imp2.txt <<'PY'
import re, sys, collections
for path in sys.argv[1:]:
    rows = [(int(m.group(1)), int(m.group(2)), m.group(4)) for m in
            (re.match(r"import time:\s+(\d+) \|\s+(\d+) \|(\s*)(\S+)", l) for l in open(path)) if m]
    top = collections.Counter()
    for own, _, name in rows: top[name.split(".")[0] if not name.startswith("torch") else ".".join(name.split(".")[:2])] += own
    total = sum(own for own, _, _ in rows)
    print(path, f"total {total/1e6:.2f} s;", ", ".join(f"{k} {v/1e6:.2f}" for k, v in top.most_common(12)))
    print("  slowest modules:", ", ".join(f"{n} {o/1e6:.3f}" for o, _, n in sorted(rows, reverse=True)[:10]))
PY
cp $W/startup.txt $OUT/c3_startup.txt; tar czf $OUT/c3_importtime.tar.gz -C $W imp1.txt imp2.txt; date -u
