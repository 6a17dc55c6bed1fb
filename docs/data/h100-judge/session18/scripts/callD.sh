# issue 20 (call D): the instrumented candidates again on this tree (the hand-over's reference cycle gone), then the
# RL-shaped batch alone, this tree and the tree before (179407f), in turn new, old.
cd $(dirname $0)/../..; nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; date -u
for t in 1_elementwise_leaky_relu_abs_mul_gain_sigmoid 2_norm_tanh_rmsnorm_add_bias_add_one_softplus; do
  for k in fused unfused; do
    CUDA_VISIBLE_DEVICES=0 timeout 120 python3 -m drkernel.cli.main eval -r .carry/S18x/$t.ref.py -c .carry/S18x/$t.$k.py --device cuda --trials 3 --perf-trials 10 --json > /tmp/o.json 2>/tmp/e.txt
    python3 -c "
import json; d=json.load(open('/tmp/o.json')); e=d.get('error') or {}; print('$t $k', d['status'], [l for l in (e.get('traceback') or '').splitlines() if l.startswith(('CALLS', 'SEG')) and ('CALLS' in l or 'timing.py' in l)])" || tail -5 /tmp/e.txt
  done
done
W=/tmp/wd; mkdir -p $W
R="python3 benchmarks/gpu_bench.py rl_batch --synthetic-n 8 --rl-samples 8 --rl-level1 0"
rl() { T=$(date +%s); (cd $2 && CUDA_VISIBLE_DEVICES=0 timeout 150 $R --out $W/$1 > $W/$1.log 2>&1); echo "$1: rc $? in $(( $(date +%s) - T )) s"
  python3 -c "import json; d=json.load(open('$W/$1/rl_batch.json')); print('  $1', round(d['distinct_per_minute_running'],2), d['statuses'], {k: d['phase_median_s'].get(k) for k in ('correctness','timing','profile')})" 2>&1 | cut -c1-300; }
rl new .
rl old .carry/S18old
tar czf $OUT/d.tgz -C $W .; date -u
