# Issues 19, 20 (twenty-third session), fifth call, the tree as committed (TREE: 16 places, calls of at most 32 MiB):
# the small task's speedup CV three times and 46b6c34's (old) once, in turn; the red team on the GPU; the RL-shaped
# batch.
export PYTHONUNBUFFERED=1
W=/tmp/w5; mkdir -p $W
nvidia-smi --query-gpu=index,name,driver_version,memory.total --format=csv,noheader; date -u; cat .carry/S23/TREE
KB=$PWD/.carry/S23/kb.jsonl
st() {  # $1: label, $2: folder of the tree, $3...: more options
  T=$(date +%s)
  (cd $2 && CUDA_VISIBLE_DEVICES=0 timeout 100 python3 benchmarks/gpu_bench.py stability --repeats 20 --kernelbench $KB --out $W/st_$1 "${@:3}" > $W/st_$1.log 2>&1)
  echo "stability $1: rc $? in $(( $(date +%s) - T )) s"; grep "speedup CV" $W/st_$1.log | head -1 | cut -c1-200
}
st new1 . --repeat-problems
st new2 . --repeat-problems
st old1 .carry/S23/old --repeat-problems 88_MinGPTNewGelu
st new3 . --repeat-problems
tar czf $OUT/st.tgz -C $W .
T=$(date +%s)
CUDA_VISIBLE_DEVICES=0 DRKERNEL_TEST_DEVICE=cuda timeout 200 python3 -m pytest -q -p no:cacheprovider -o addopts="" -rfEx tests/test_hacking.py tests/test_precision.py > $W/redteam.txt 2>&1
echo "red team: rc $? in $(( $(date +%s) - T )) s"; tail -n 5 $W/redteam.txt | cut -c1-300
cp $W/redteam.txt $OUT/
T=$(date +%s)
CUDA_VISIBLE_DEVICES=0 timeout 170 python3 benchmarks/gpu_bench.py rl_batch --rl-level1 0 --kernelbench $KB --out $W/rl > $W/rl.log 2>&1
echo "rl_batch: rc $? in $(( $(date +%s) - T )) s"
python3 -c "import json; d=json.load(open('$W/rl/rl_batch.json')); print({k: d[k] for k in ('distinct_per_minute_running','distinct_per_minute_cold','start_up_s','duplicates_cost_s','ran','cached') if k in d})" 2>&1 | cut -c1-400
tar czf $OUT/rl.tgz -C $W rl rl.log; date -u
