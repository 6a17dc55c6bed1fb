# Issue 20 (twenty-sixth session), third call: the working tree ("new": the fork server's own bytecode folder, and
# Triton's cache key hashed while torch imports) against HEAD 87d7547 ("head"): a scheduler's start-up, where the
# fork server's start-up goes; the isolation suite and the red team on the GPU; the RL-shaped half batch and the
# 20 level-1 problems.
export PYTHONUNBUFFERED=1
W=/tmp/w3; mkdir -p $W
nvidia-smi --query-gpu=index,name,driver_version,memory.total --format=csv,noheader; date -u
KB=$PWD/.carry/S26/kb.jsonl
BC=$HOME/.cache/drkernel/bytecode   # the fork server's bytecode folder
cat > $W/startup.py <<'PY'
import sys, time
t = time.monotonic()
from drkernel.scheduling.scheduler import Scheduler
s = Scheduler(device="cuda")
ok = s.wait_ready(timeout=120)
print(f"{sys.argv[1]}: scheduler start-up {time.monotonic() - t:.2f} s, ready {ok}")
s.close()
PY
startup() { (cd $2 && CUDA_VISIBLE_DEVICES=0 PYTHONPATH=$PWD timeout 60 python3 $W/startup.py $1 2>&1 | tail -1); }
rm -rf $BC
startup new-first .; startup new-second .; startup new-third .; startup new-fourth .
startup head-first .carry/S26/head; startup head-second .carry/S26/head
for i in 1 2; do PYTHONPATH=$PWD PYTHONPYCACHEPREFIX=$BC python3 docs/data/h100-judge/session26/startup_parts.py 2>&1 | grep torch; done
echo "bytecode folder: $(find $BC -name '*.pyc' | wc -l) files, $(du -sh $BC | cut -f1)"
T=$(date +%s)
CUDA_VISIBLE_DEVICES=0 DRKERNEL_TEST_DEVICE=cuda timeout 240 python3 -m pytest -q -p no:cacheprovider -o addopts="" -rfEx tests/test_isolation.py tests/test_hacking.py tests/test_precision.py > $W/tests.txt 2>&1
echo "isolation and red team: rc $? in $(( $(date +%s) - T )) s"; tail -n 6 $W/tests.txt | cut -c1-300
cp $W/tests.txt $OUT/c3_tests.txt
T=$(date +%s)
CUDA_VISIBLE_DEVICES=0 timeout 200 python3 benchmarks/gpu_bench.py rl_batch --synthetic-n 8 --rl-samples 8 --kernelbench $KB --out $W/rl > $W/rl.log 2>&1
echo "rl: rc $? in $(( $(date +%s) - T )) s"
python3 - $W/rl/rl_batch.json <<'PY' 2>&1 | cut -c1-900
import json, sys
d = json.load(open(sys.argv[1]))
print({k: d.get(k) for k in ("distinct_per_minute_running", "distinct_alone_per_minute_running", "distinct_per_minute_cold",
      "start_up_s", "duplicates_cost_s", "median_overhead_s", "statuses", "level1_per_minute_running",
      "level1_per_minute_cold")})
PY
gzip -c $W/rl/rl_batch.json > $OUT/c3_rl.json.gz; date -u
