# The red team on the GPU with this tree, then the RL-shaped batch (issue 20).
export PYTHONUNBUFFERED=1
W=/tmp/w2; mkdir -p $W; date -u; cat .carry/S22/TREE
T=$(date +%s)
CUDA_VISIBLE_DEVICES=0 DRKERNEL_TEST_DEVICE=cuda timeout 400 python3 -m pytest -q -p no:cacheprovider -o addopts="" -rfEx tests/test_hacking.py tests/test_precision.py > $W/redteam.txt 2>&1
echo "red team: rc $? in $(( $(date +%s) - T )) s"; tail -n 8 $W/redteam.txt | cut -c1-300
cp $W/redteam.txt $OUT/
T=$(date +%s)
CUDA_VISIBLE_DEVICES=0 timeout 170 python3 benchmarks/gpu_bench.py rl_batch --rl-level1 0 --kernelbench .carry/S22/kb.jsonl --out $W/rl > $W/rl.log 2>&1
echo "rl_batch: rc $? in $(( $(date +%s) - T )) s"
python3 -c "import json; d=json.load(open('$W/rl/rl_batch.json')); print({k: d[k] for k in ('distinct_per_minute_running','distinct_per_minute_cold','start_up_s','duplicates_cost_s','ran','cached') if k in d})" 2>&1 | cut -c1-400
tar czf $OUT/rl.tgz -C $W rl rl.log; date -u
