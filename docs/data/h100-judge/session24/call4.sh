# Issue 20 (twenty-fourth session), fourth call: the RL-shaped half batch at 1, 2 and 3 evaluations at once (TREE),
# with the host's CPU use sampled every second from /proc/stat beside each run (the share of the 16 CPUs busy).
export PYTHONUNBUFFERED=1
W=/tmp/w4; mkdir -p $W
nvidia-smi --query-gpu=index,name,driver_version,memory.total --format=csv,noheader; date -u; cat .carry/S24/TREE; nproc
KB=$PWD/.carry/S24/kb.jsonl
cpu_sampler() {  # one line a second: epoch seconds, busy jiffies, total jiffies (all CPUs)
  while true; do read -r _ u n s i w q sq st _ < /proc/stat; echo "$(date +%s.%N) $((u+n+s+q+sq+st)) $((u+n+s+i+w+q+sq+st))"; sleep 1; done
}
rl() {  # $1: label, $2...: more options
  cpu_sampler > $W/cpu_$1.txt & S=$!
  T=$(date +%s)
  CUDA_VISIBLE_DEVICES=0 timeout 170 python3 benchmarks/gpu_bench.py rl_batch --synthetic-n 8 --rl-samples 8 --rl-level1 0 --kernelbench $KB --out $W/rl_$1 "${@:2}" > $W/rl_$1.log 2>&1
  echo "rl $1: rc $? in $(( $(date +%s) - T )) s"; kill $S
  python3 - $W/rl_$1/rl_batch.json $W/cpu_$1.txt <<'PY' 2>&1 | cut -c1-700
import json, sys, collections, statistics
d = json.load(open(sys.argv[1]))
b = d["runs"]["batch"]
m = b["phase_median_s"]
rows = [tuple(map(float, line.split())) for line in open(sys.argv[2]) if line.strip()]
busy = [(b2 - b1) / max(t2 - t1, 1) for (_, b1, t1), (_, b2, t2) in zip(rows, rows[1:])]
p = [v for v in b["problems"].values() if not v.get("cached")]
dur = [v["duration_s"] for v in p]
print("  batch/min %.1f alone/min %.1f | at once %.2f, median evaluation %.2f s | corr %.3f first %.3f wait %.3f timing %.3f exit %.3f | CPU busy median %.2f max %.2f | %s" % (
    d["distinct_per_minute_running"], d["distinct_alone_per_minute_running"], sum(dur) / b["running_s"], statistics.median(dur),
    m.get("correctness", 0), m.get("correctness_first_trial", 0), m.get("gate_wait", 0), m.get("timing", 0), m.get("exit", 0),
    statistics.median(busy) if busy else -1, max(busy) if busy else -1,
    dict(collections.Counter(v["status"] for v in b["problems"].values()))))
PY
  gzip -c $W/rl_$1/rl_batch.json > $OUT/c4_rl_$1.json.gz; cp $W/cpu_$1.txt $OUT/c4_cpu_$1.txt
}
rl o1 --overlap 1
rl o2 --overlap 2
rl o3 --overlap 3
date -u
