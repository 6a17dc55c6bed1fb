# call B (issue 19, 20): rl_batch alone (GPU 1), then three at once (GPUs 1-3), each with benchmarks/kernel_waits.py
# sampling where the host's threads wait in the kernel; timed calls now carry their host thread's interruptions.
export PYTHONUNBUFFERED=1
W=/tmp/w3; mkdir -p $W
nvidia-smi --query-gpu=index,name,driver_version,memory.total --format=csv,noheader; nproc; uname -r; date -u; cat .carry/S16/TREE
R="python3 benchmarks/gpu_bench.py rl_batch --synthetic-n 8 --rl-samples 8 --rl-level1 0"
python3 benchmarks/kernel_waits.py --seconds 400 --out $W/kw_alone > $W/kw_alone.log 2>&1 & S=$!
T0=$(date +%s)
CUDA_VISIBLE_DEVICES=1 timeout 150 $R --out $W/alone > $W/alone.log 2>&1
echo "alone: rc $? in $(( $(date +%s) - T0 )) s"; kill -TERM $S; wait $S; cat $W/kw_alone.log | cut -c1-1500
python3 benchmarks/kernel_waits.py --seconds 400 --out $W/kw_three > $W/kw_three.log 2>&1 & S=$!
T2=$(date +%s)
P=""; for g in 1 2 3; do (CUDA_VISIBLE_DEVICES=$g timeout 220 $R --out $W/three$g > $W/three$g.log 2>&1; echo "three$g rc $?") & P="$P $!"; done; wait $P
echo "three at once: $(( $(date +%s) - T2 )) s"; kill -TERM $S; wait $S; cat $W/kw_three.log | cut -c1-1500
tar czf $OUT/b.tgz -C $W . ; ls -la $OUT; date -u
