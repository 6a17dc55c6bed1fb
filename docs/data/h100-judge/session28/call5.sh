# Issue 20 (twenty-eighth session), fifth call: a scheduler's start-up on a third machine, the working tree ("new":
# the fork server without torch._dynamo) against 456cfe2 ("head"), in turn.
export PYTHONUNBUFFERED=1
W=/tmp/w5; mkdir -p $W
nvidia-smi --query-gpu=index,name,driver_version,memory.total --format=csv,noheader; date -u; python3 -V
lscpu | grep -E '^Model name|^CPU\(s\)' | head -2
KB=$PWD/.carry/S28/kb.jsonl
BC=$HOME/.cache/drkernel/bytecode   # the fork server's bytecode folder
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
startup new-first . | tee -a $W/first.txt; startup head-first .carry/S28/head | tee -a $W/first.txt
for i in 1 2 3 4 5 6 7 8; do
  startup new . | tee -a $W/startup.txt; startup head .carry/S28/head | tee -a $W/startup.txt
done
python3 - $W/startup.txt <<'PY'
import collections, statistics, sys
runs = collections.defaultdict(list)
for line in open(sys.argv[1]):
    f = line.split(); runs[f[0]].append(float(f[1]))
for label, v in runs.items():
    print(label, f"median {statistics.median(v):.2f} min {min(v):.2f} max {max(v):.2f} under 3 s: {sum(x < 3 for x in v)} of {len(v)}")
PY
cp $W/startup.txt $OUT/c5_startup.txt; cp $W/first.txt $OUT/c5_first.txt; date -u
