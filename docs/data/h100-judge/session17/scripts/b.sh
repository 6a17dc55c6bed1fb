# call B (issue 20): the RL-shaped batch with one scheduler alone on one H100, this tree (the timing phase's release
# follows judge.gives_back) and the tree before (c5ed180), in turn new, prev, new.
export PYTHONUNBUFFERED=1
W=/tmp/wb; mkdir -p $W
nvidia-smi --query-gpu=index,name,driver_version,memory.total --format=csv,noheader; nproc; date -u; cat .carry/S17/TREE
R="python3 benchmarks/gpu_bench.py rl_batch --synthetic-n 8 --rl-samples 8 --rl-level1 0"
rl() { T=$(date +%s); (cd $2 && CUDA_VISIBLE_DEVICES=0 timeout 110 $R --out $W/$1 > $W/$1.log 2>&1); echo "$1: rc $? in $(( $(date +%s) - T )) s"
  python3 -c "import json; d=json.load(open('$W/$1/rl_batch.json')); print('  $1', round(d['distinct_per_minute_running'],2), d['statuses'], {k: d['phase_median_s'].get(k) for k in ('correctness','timing','timing_release','profile')})" 2>&1 | cut -c1-300; }
rl new1 .
rl prev1 .carry/S17/prev
rl new2 .
tar czf $OUT/b.tgz -C $W .; date -u
