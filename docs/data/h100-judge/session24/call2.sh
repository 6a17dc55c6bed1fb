# Issue 20 (twenty-fourth session), second call: how many CUDA processes the host starts and ends a second, started as
# an evaluation's (a profiler session around a first kernel) and with a first kernel only, at 1-8 at once
# (benchmarks/process_starts.py, TREE); then the RL-shaped half batch once more (TREE) with one lane of such starts
# beside it for 40 s, to see what the batch does to a start.
export PYTHONUNBUFFERED=1
W=/tmp/w2; mkdir -p $W
nvidia-smi --query-gpu=index,name,driver_version,memory.total --format=csv,noheader; date -u; cat .carry/S24/TREE; nproc
KB=$PWD/.carry/S24/kb.jsonl
for warm in profiler kernel profiler; do
  T=$(date +%s)
  CUDA_VISIBLE_DEVICES=0 timeout 90 python3 benchmarks/process_starts.py --warm $warm --lanes 1,2,3,4,6,8 --seconds 6 --out $W/ps_$warm$T > $W/ps_$warm$T.log 2>&1
  echo "process_starts $warm: rc $? in $(( $(date +%s) - T )) s"; cat $W/ps_$warm$T.log | cut -c1-200
  cp $W/ps_$warm$T/process_starts.json $OUT/c2_process_starts_${warm}_$T.json
done
T=$(date +%s)
(CUDA_VISIBLE_DEVICES=0 timeout 140 python3 benchmarks/gpu_bench.py rl_batch --synthetic-n 8 --rl-samples 8 --rl-level1 0 --kernelbench $KB --out $W/rl_beside > $W/rl_beside.log 2>&1; echo "rl beside: rc $? in $(( $(date +%s) - T )) s") &
sleep 20
CUDA_VISIBLE_DEVICES=0 timeout 60 python3 benchmarks/process_starts.py --lanes 1 --seconds 40 --out $W/ps_beside > $W/ps_beside.log 2>&1
echo "process_starts beside the batch: rc $?"; cat $W/ps_beside.log | cut -c1-200
cp $W/ps_beside/process_starts.json $OUT/c2_process_starts_beside.json
wait
python3 -c "import json; d=json.load(open('$W/rl_beside/rl_batch.json')); print({k: round(d[k],2) for k in ('distinct_per_minute_running','distinct_alone_per_minute_running','start_up_s')})" 2>&1 | cut -c1-300
gzip -c $W/rl_beside/rl_batch.json > $OUT/c2_rl_beside.json.gz; date -u
