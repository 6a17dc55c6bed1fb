# Issue 20 (twenty-fourth session), third call: 1, 2, 3 and 6 processes on one GPU, each a loop of a tiny kernel and a
# synchronisation (contexts.py); then the RL-shaped half batch with ordinary evaluations' shared phases held one at a
# time (excl: TREE with DeviceGate.shared taking the lock exclusively, an experiment) against TREE, in turn.
export PYTHONUNBUFFERED=1
W=/tmp/w3; mkdir -p $W
nvidia-smi --query-gpu=index,name,driver_version,memory.total --format=csv,noheader; date -u; cat .carry/S24/TREE
KB=$PWD/.carry/S24/kb.jsonl
CUDA_VISIBLE_DEVICES=0 timeout 120 python3 .carry/S24/contexts.py $OUT/c3_contexts.json 2>&1 | tail -n 5
rl() {  # $1: label, $2: folder of the tree
  T=$(date +%s)
  (cd $2 && CUDA_VISIBLE_DEVICES=0 timeout 140 python3 benchmarks/gpu_bench.py rl_batch --synthetic-n 8 --rl-samples 8 --rl-level1 0 --kernelbench $KB --out $W/rl_$1 > $W/rl_$1.log 2>&1)
  echo "rl $1: rc $? in $(( $(date +%s) - T )) s"
  python3 - $W/rl_$1/rl_batch.json <<'PY' 2>&1 | cut -c1-600
import json, sys, collections
d = json.load(open(sys.argv[1]))
b = d["runs"]["batch"]
m = b["phase_median_s"]
print("  batch/min %.1f alone/min %.1f cold %.1f start %.1f dup %.2f | corr %.3f first %.3f wait %.3f timing %.3f | serial %.1f share %.2f | %s" % (
    d["distinct_per_minute_running"], d["distinct_alone_per_minute_running"], d["distinct_per_minute_cold"], d["start_up_s"],
    d["duplicates_cost_s"], m.get("correctness", 0), m.get("correctness_first_trial", 0), m.get("gate_wait", 0), m.get("timing", 0),
    b.get("gate_serial_s") or 0, b.get("gate_serial_share") or 0,
    dict(collections.Counter(v["status"] for v in b["problems"].values()))))
PY
  gzip -c $W/rl_$1/rl_batch.json > $OUT/c3_rl_$1.json.gz
}
rl excl1 .carry/S24/excl
rl new1 .
rl excl2 .carry/S24/excl
date -u
