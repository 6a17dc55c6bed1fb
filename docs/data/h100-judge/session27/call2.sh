# Issue 20 (twenty-seventh session), second call: a scheduler's start-up on the working tree ("new": the fork server
# imports with the cyclic garbage collector off) against cba80d0 ("head", the fork server of 8cd4330), in turn; the
# fork server's imports with the collector on and off; the isolation suite and the red team on the GPU; the RL-shaped
# half batch (verdicts against the twenty-sixth session's) and the 20 level-1 problems.
export PYTHONUNBUFFERED=1
W=/tmp/w2; mkdir -p $W
nvidia-smi --query-gpu=index,name,driver_version,memory.total --format=csv,noheader; date -u; python3 -V
D=docs/data/h100-judge/session27
KB=$PWD/.carry/S27/kb.jsonl
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
startup new-first . | tee -a $W/first.txt; startup head-first .carry/S27/head | tee -a $W/first.txt
for i in 1 2 3 4 5 6 7 8 9 10; do
  startup new . | tee -a $W/startup.txt; startup head .carry/S27/head | tee -a $W/startup.txt
done
python3 - $W/startup.txt <<'PY'
import collections, statistics, sys
runs = collections.defaultdict(lambda: collections.defaultdict(list))
for line in open(sys.argv[1]):
    f = line.split()
    runs[f[0]]["total"].append(float(f[1])); runs[f[0]]["ready"].append(float(f[6]))
for label, parts in runs.items():
    print(label, " ".join(f"{k}: median {statistics.median(v):.2f} min {min(v):.2f} max {max(v):.2f}" for k, v in parts.items()),
          f"under 3 s: {sum(x < 3 for x in parts['total'])} of {len(parts['total'])}")
PY
for i in 1 2 3; do for m in on off; do PYTHONPATH=$PWD PYTHONPYCACHEPREFIX=$BC python3 $D/imports_gc.py $m 2>&1 | tail -1; done; done
T=$(date +%s)
CUDA_VISIBLE_DEVICES=0 DRKERNEL_TEST_DEVICE=cuda timeout 280 python3 -m pytest -q -p no:cacheprovider -o addopts="" -rfEx tests/test_isolation.py tests/test_hacking.py > $W/tests.txt 2>&1
echo "isolation and red team: rc $? in $(( $(date +%s) - T )) s"; tail -n 6 $W/tests.txt | cut -c1-300
cp $W/startup.txt $OUT/c2_startup.txt; cp $W/tests.txt $OUT/c2_tests.txt
T=$(date +%s)
CUDA_VISIBLE_DEVICES=0 timeout 200 python3 benchmarks/gpu_bench.py rl_batch --synthetic-n 8 --rl-samples 8 --kernelbench $KB --out $W/rl > $W/rl.log 2>&1
echo "rl: rc $? in $(( $(date +%s) - T )) s"
python3 - $W/rl/rl_batch.json docs/data/h100-judge/session26/c3_rl.json.gz <<'PY' 2>&1 | cut -c1-1500
import gzip, json, sys
d = json.load(open(sys.argv[1])); old = json.load(gzip.open(sys.argv[2]))
print({k: d.get(k) for k in ("distinct_per_minute_running", "distinct_alone_per_minute_running", "distinct_per_minute_cold",
      "start_up_s", "duplicates_cost_s", "median_overhead_s", "statuses", "level1_per_minute_running",
      "level1_per_minute_cold")})
verdict = lambda p: (p["status"], tuple(p["hack_reasons"]))
for run in ("batch", "level1"):
    new, before = d["runs"][run]["problems"], old["runs"][run]["problems"]
    print(run, "verdicts as the twenty-sixth session's (call 3):", sum(k in new and verdict(new[k]) == verdict(before[k]) for k in before),
          "of", len(before), "; differing:", [k for k in before if k not in new or verdict(new[k]) != verdict(before[k])][:5])
PY
gzip -c $W/rl/rl_batch.json > $OUT/c2_rl.json.gz; date -u
