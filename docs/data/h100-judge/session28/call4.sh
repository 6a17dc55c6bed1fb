# Issue 20 (twenty-eighth session), fourth call: the working tree ("new": the fork server without torch._dynamo, and
# the judge calling past torch's `_disable_dynamo` wrappers, which call 2 found importing it in every evaluation's
# judge) against 456cfe2 ("head"), on one machine: the RL-shaped half batch with the 20 level-1 problems, each tree
# in fresh schedulers, head first this time (call 3 ran new first); start-ups in turn.
export PYTHONUNBUFFERED=1
W=/tmp/w4; mkdir -p $W
nvidia-smi --query-gpu=index,name,driver_version,memory.total --format=csv,noheader; date -u
KB=$PWD/.carry/S28/kb.jsonl
rl() {
  T=$(date +%s)
  (cd $2 && CUDA_VISIBLE_DEVICES=0 PYTHONPATH=$PWD timeout 170 python3 benchmarks/gpu_bench.py rl_batch --synthetic-n 8 --rl-samples 8 \
     --kernelbench $KB --out $W/$1 > $W/$1.log 2>&1)
  echo "$1: rc $? in $(( $(date +%s) - T )) s"
  python3 docs/data/h100-judge/session28/compare_rl.py $W/$1/rl_batch.json docs/data/h100-judge/session27/c2_rl.json.gz 2>&1 | cut -c1-2000
  gzip -c $W/$1/rl_batch.json > $OUT/c4_rl_$1.json.gz
}
rl head .carry/S28/head
rl new .
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
for i in 1 2 3 4 5; do
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
cp $W/startup.txt $OUT/c4_startup.txt
date -u
