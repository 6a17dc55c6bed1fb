# Issue 20 (twenty-fifth session), fifth call: the RL-shaped half batch (8 synthetic tasks x 8 samples) on the final
# tree (TREE), for its verdicts against the twenty-fourth session's runs of the same batch, and its rate.
export PYTHONUNBUFFERED=1
W=/tmp/w5; mkdir -p $W
nvidia-smi --query-gpu=index,name,driver_version,memory.total --format=csv,noheader; date -u; cat .carry/S25/TREE
KB=$PWD/.carry/S25/kb.jsonl
T=$(date +%s)
CUDA_VISIBLE_DEVICES=0 timeout 140 python3 benchmarks/gpu_bench.py rl_batch --synthetic-n 8 --rl-samples 8 --rl-level1 0 --kernelbench $KB --out $W/rl > $W/rl.log 2>&1
echo "rl: rc $? in $(( $(date +%s) - T )) s"
python3 -c "import json; d=json.load(open('$W/rl/rl_batch.json')); print({k: d[k] for k in ('distinct_per_minute_running','distinct_alone_per_minute_running','distinct_per_minute_cold','start_up_s','duplicates_cost_s','statuses') if k in d})" 2>&1 | cut -c1-500
gzip -c $W/rl/rl_batch.json > $OUT/c5_rl_batch.json.gz; date -u
