# Issue 20: the RL-shaped batch at overlap 3 (the default), 5 and 8 with this tree, one H100, one scheduler each:
# does letting more evaluations run at once raise the distinct-candidate rate now, and do judge failures return?
export PYTHONUNBUFFERED=1
W=/tmp/w3; mkdir -p $W; date -u; cat .carry/S22/TREE; nproc
for o in 5 8 3; do
  T=$(date +%s)
  CUDA_VISIBLE_DEVICES=0 timeout 180 python3 benchmarks/gpu_bench.py rl_batch --rl-level1 0 --overlap $o --kernelbench .carry/S22/kb.jsonl --out $W/rl_o$o > $W/rl_o$o.log 2>&1
  echo "rl_batch overlap $o: rc $? in $(( $(date +%s) - T )) s"
  python3 -c "import json; d=json.load(open('$W/rl_o$o/rl_batch.json')); print({k: (round(d[k],2) if isinstance(d[k], float) else d[k]) for k in ('distinct_per_minute_running','distinct_alone_per_minute_running','distinct_per_minute_cold','duplicates_cost_s','ran','cached','statuses')}); print(' medians', {k: round(v,3) for k, v in d['phase_median_s'].items() if k in ('correctness','correctness_first_trial','timing','gate_alone','gate_wait','exit','start_latency')})" 2>&1 | cut -c1-600
done
tar czf $OUT/rl_overlap.tgz -C $W .; date -u
