# Issue 20 (twenty-fourth session), fifth call: the RL-shaped half batch with two lanes of CUDA process starts beside
# it for the whole run (benchmarks/process_starts.py --lanes 2, started before the scheduler), then the same batch
# without them, as the control (TREE).
export PYTHONUNBUFFERED=1
W=/tmp/w5; mkdir -p $W
nvidia-smi --query-gpu=index,name,driver_version,memory.total --format=csv,noheader; date -u; cat .carry/S24/TREE
KB=$PWD/.carry/S24/kb.jsonl
rl() {  # $1: label
  T=$(date +%s)
  CUDA_VISIBLE_DEVICES=0 timeout 150 python3 benchmarks/gpu_bench.py rl_batch --synthetic-n 8 --rl-samples 8 --rl-level1 0 --kernelbench $KB --out $W/rl_$1 > $W/rl_$1.log 2>&1
  echo "rl $1: rc $? in $(( $(date +%s) - T )) s"
  python3 -c "import json; d=json.load(open('$W/rl_$1/rl_batch.json')); print({k: round(d[k],2) for k in ('distinct_per_minute_running','distinct_alone_per_minute_running','start_up_s')})" 2>&1 | cut -c1-300
  gzip -c $W/rl_$1/rl_batch.json > $OUT/c5_rl_$1.json.gz
}
CUDA_VISIBLE_DEVICES=0 timeout 150 python3 benchmarks/process_starts.py --lanes 2 --seconds 110 --out $W/ps > $W/ps.log 2>&1 &
P=$!
sleep 8
rl beside2
wait $P; echo "process_starts beside: rc $?"; grep -v Warn $W/ps.log | grep lanes
cp $W/ps/process_starts.json $OUT/c5_process_starts_beside2.json
rl control
date -u
