# Issue 20: the RL-shaped batch alone at 3 (the default), 6 and 8 evaluations at once on one GPU, then 3 again
. .carry/S19/pre.sh
export PYTHONPATH=$PWD:/tmp/site
nvidia-smi --query-gpu=index,name,driver_version,memory.total --format=csv,noheader; date -u
mkdir -p /tmp/ov
for run in 3a 6 8 3b; do
  ov=${run%[ab]}
  echo "=== $(date -u +%H:%M:%S) overlap $ov ($run)"
  CUDA_VISIBLE_DEVICES=0 timeout 125 python3 benchmarks/gpu_bench.py rl_batch --synthetic-n 8 --rl-samples 8 --rl-level1 0 \
      --overlap $ov --out /tmp/ov/$run > /tmp/ov/$run.log 2>&1 || echo "rc $?"
  python3 -c "import json,sys; d=json.load(open('/tmp/ov/$run/rl_batch.json')); print(round(d['distinct_per_minute_running'],1), d['statuses'], d['runs']['batch']['gate_serial_share'])" 2>&1 | tail -1
  [ -f /tmp/ov/$run/rl_batch.json ] && gzip -c /tmp/ov/$run/rl_batch.json > $OUT/rl_batch_overlap$run.json.gz
done
tar -czf $OUT/logs.tgz -C /tmp/ov --wildcards '*.log'; date -u
