# Issue 20 (twenty-eighth session), second call: the RL-shaped half batch on 456cfe2 ("head") and on the working tree
# ("new": the fork server without torch._dynamo), in turn on one machine, each in a fresh scheduler (call 1's run of
# the batch with the level-1 set ran past its 170 s limit after a slow test run: is an evaluation slower?).
export PYTHONUNBUFFERED=1
W=/tmp/w2; mkdir -p $W
nvidia-smi --query-gpu=index,name,driver_version,memory.total --format=csv,noheader; date -u
KB=$PWD/.carry/S28/kb.jsonl
rl() {
  T=$(date +%s)
  (cd $2 && CUDA_VISIBLE_DEVICES=0 PYTHONPATH=$PWD timeout 200 python3 benchmarks/gpu_bench.py rl_batch --synthetic-n 8 --rl-samples 8 \
     --rl-level1 0 --kernelbench $KB --out $W/$1 > $W/$1.log 2>&1)
  echo "$1: rc $? in $(( $(date +%s) - T )) s"; tail -2 $W/$1.log | cut -c1-300
  python3 docs/data/h100-judge/session28/compare_rl.py $W/$1/rl_batch.json docs/data/h100-judge/session27/c2_rl.json.gz 2>&1 | cut -c1-1800
  gzip -c $W/$1/rl_batch.json > $OUT/c2_rl_$1.json.gz
}
rl head1 .carry/S28/head
rl new1 .
rl head2 .carry/S28/head
date -u
