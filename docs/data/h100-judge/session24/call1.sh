# Issue 20 (twenty-fourth session), first call: an evaluation gives up its place at the device at its verdict, not at
# its processes' end (TREE), against 131ea1b (prev, the session's start): the RL-shaped half batch (8 synthetic tasks x
# 8 samples: 40 distinct candidates, 24 duplicates), new prev new prev in turn, then new at overlap 4; the gate's and
# the scheduler's tests on the GPU.
export PYTHONUNBUFFERED=1
W=/tmp/w1; mkdir -p $W
nvidia-smi --query-gpu=index,name,driver_version,memory.total --format=csv,noheader; date -u; cat .carry/S24/TREE
KB=$PWD/.carry/S24/kb.jsonl
rl() {  # $1: label, $2: folder of the tree, $3...: more options
  T=$(date +%s)
  (cd $2 && CUDA_VISIBLE_DEVICES=0 timeout 140 python3 benchmarks/gpu_bench.py rl_batch --synthetic-n 8 --rl-samples 8 --rl-level1 0 --kernelbench $KB --out $W/rl_$1 "${@:3}" > $W/rl_$1.log 2>&1)
  echo "rl $1: rc $? in $(( $(date +%s) - T )) s"
  python3 - $W/rl_$1/rl_batch.json <<'PY' 2>&1 | cut -c1-600
import json, sys, collections
d = json.load(open(sys.argv[1]))
b = d["runs"]["batch"]
m = b["phase_median_s"]
print("  batch/min %.1f alone/min %.1f cold %.1f start %.1f dup %.2f | exit %.3f corr %.3f wait %.3f timing %.3f | serial %.1f share %.2f | %s" % (
    d["distinct_per_minute_running"], d["distinct_alone_per_minute_running"], d["distinct_per_minute_cold"], d["start_up_s"],
    d["duplicates_cost_s"], m.get("exit", 0), m.get("correctness", 0), m.get("gate_wait", 0), m.get("timing", 0),
    b.get("gate_serial_s") or 0, b.get("gate_serial_share") or 0,
    dict(collections.Counter(v["status"] for v in b["problems"].values()))))
PY
}
rl new1 .
rl prev1 .carry/S24/prev
rl new2 .
rl prev2 .carry/S24/prev
rl new_o4 . --overlap 4
for f in $W/rl_*/rl_batch.json; do n=$(basename $(dirname $f)); gzip -c $f > $OUT/c1_$n.json.gz; done
T=$(date +%s)
CUDA_VISIBLE_DEVICES=0 DRKERNEL_TEST_DEVICE=cuda timeout 100 python3 -m pytest -q -p no:cacheprovider -o addopts="" -rfEx tests/test_gate.py tests/test_scheduler.py > $W/tests.txt 2>&1
echo "gate+scheduler tests: rc $? in $(( $(date +%s) - T )) s"; tail -n 4 $W/tests.txt | cut -c1-300
cp $W/tests.txt $OUT/c1_tests.txt; date -u
