# call C (issue 20): the RL-shaped batch three at once (GPUs 1-3) with the code before (e0f9e19) and this tree (memory
# kept between phases, mappings kept open), this tree alone (GPU 1), with kernel_waits beside each; then the red team
# on this tree (GPU 0).
export PYTHONUNBUFFERED=1
W=/tmp/w4; mkdir -p $W
nvidia-smi --query-gpu=index,name,driver_version,memory.total --format=csv,noheader; nproc; date -u; cat .carry/S16/TREE
R="python3 benchmarks/gpu_bench.py rl_batch --synthetic-n 8 --rl-samples 8 --rl-level1 0"
three() {  # $1: label, $2: folder to run in
  python3 benchmarks/kernel_waits.py --seconds 400 --out $W/kw_$1 > $W/kw_$1.log 2>&1 & S=$!
  T=$(date +%s); P=""
  for g in 1 2 3; do (cd $2 && CUDA_VISIBLE_DEVICES=$g timeout 200 $R --out $W/$1$g > $W/$1$g.log 2>&1; echo "$1$g rc $?") & P="$P $!"; done; wait $P
  echo "$1: $(( $(date +%s) - T )) s"; kill -TERM $S; wait $S; cut -c1-700 $W/kw_$1.log
}
three base .carry/S16/base2
three new .
python3 benchmarks/kernel_waits.py --seconds 400 --out $W/kw_alone > $W/kw_alone.log 2>&1 & S=$!
T=$(date +%s); CUDA_VISIBLE_DEVICES=1 timeout 120 $R --out $W/alone > $W/alone.log 2>&1
echo "alone: rc $? in $(( $(date +%s) - T )) s"; kill -TERM $S; wait $S; cut -c1-700 $W/kw_alone.log
for f in base1 base2 base3 new1 new2 new3 alone; do python3 -c "import json,sys; d=json.load(open('$W/$f/rl_batch.json')); print('$f', round(d['distinct_per_minute_running'],1), d['statuses'])" 2>&1 | cut -c1-300; done
tar czf $OUT/c1.tgz -C $W .
T=$(date +%s)
CUDA_VISIBLE_DEVICES=0 DRKERNEL_TEST_DEVICE=cuda timeout 170 python3 -m pytest -q -p no:cacheprovider -o addopts="" -rfEx tests/test_hacking.py tests/test_precision.py tests/test_isolation.py::test_what_the_judge_shares_lies_alone_in_its_allocations > $W/redteam.txt 2>&1
echo "red team: rc $? in $(( $(date +%s) - T )) s"; tail -n 6 $W/redteam.txt | cut -c1-300
cp $W/redteam.txt $OUT/; date -u
