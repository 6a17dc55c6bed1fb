# Issue 20 (twenty-sixth session), second call: the fork server's own bytecode folder (the working tree, "new")
# against HEAD 87d7547 ("head", which imports with PYTHONDONTWRITEBYTECODE, as the image does everywhere); then what
# evaluations gain when the installation itself holds bytecode (`compileall` of site-packages): the RL-shaped half
# batch and the 20 level-1 problems before and after.
export PYTHONUNBUFFERED=1
W=/tmp/w2; mkdir -p $W
nvidia-smi --query-gpu=index,name,driver_version,memory.total --format=csv,noheader; date -u
KB=$PWD/.carry/S26/kb.jsonl
SP=$(python3 -c "import torch, os; print(os.path.dirname(os.path.dirname(torch.__file__)))")
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
rl() {  # $1: label
  T=$(date +%s)
  CUDA_VISIBLE_DEVICES=0 timeout 200 python3 benchmarks/gpu_bench.py rl_batch --synthetic-n 8 --rl-samples 8 --kernelbench $KB --out $W/rl_$1 > $W/rl_$1.log 2>&1
  echo "rl $1: rc $? in $(( $(date +%s) - T )) s"
  python3 - $W/rl_$1/rl_batch.json <<'PY' 2>&1 | cut -c1-700
import json, sys
d = json.load(open(sys.argv[1]))
print({k: d.get(k) for k in ("distinct_per_minute_running", "distinct_alone_per_minute_running", "distinct_per_minute_cold",
      "start_up_s", "duplicates_cost_s", "median_overhead_s", "phase_median_s", "statuses", "level1_per_minute_running",
      "level1_per_minute_cold", "level1_phase_median_s")})
PY
  gzip -c $W/rl_$1/rl_batch.json > $OUT/c2_rl_$1.json.gz
}
echo "== no bytecode in the installation ($(find $SP/torch -name '*.pyc' | wc -l) .pyc under torch)"
rm -rf ~/.cache/drkernel/bytecode
startup new-first .; startup new-second .; startup new-third .
startup head-first .carry/S26/head; startup head-second .carry/S26/head
rl nobytecode
T=$(date +%s)
python3 -m compileall -q -j 16 $SP > /dev/null 2>&1
echo "compileall of $SP: rc $? in $(( $(date +%s) - T )) s, $(find $SP/torch -name '*.pyc' | wc -l) .pyc under torch"
echo "== the installation's bytecode compiled"
startup head-compiled .carry/S26/head; startup head-compiled2 .carry/S26/head; startup new-compiled .
rl compiled
du -sh ~/.cache/drkernel/bytecode; date -u
