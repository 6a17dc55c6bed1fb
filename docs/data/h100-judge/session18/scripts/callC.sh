# issue 20: which allocations take segments from the driver during timed calls? Instrumented candidates (the call's
# segment count, the outputs still alive, the allocator's history with Python frames), printed on a crash at the
# first call after the timed ones.
cd $(dirname $0)/../..; nvidia-smi --query-gpu=name --format=csv,noheader; date -u
for t in 1_elementwise_leaky_relu_abs_mul_gain_sigmoid 2_norm_tanh_rmsnorm_add_bias_add_one_softplus; do
  for k in fused unfused; do
    echo "##### $t $k"
    CUDA_VISIBLE_DEVICES=0 timeout 120 python3 -m drkernel.cli.main eval -r .carry/S18x/$t.ref.py -c .carry/S18x/$t.$k.py --device cuda --trials 3 --perf-trials 10 --json > /tmp/o.json 2>/tmp/e.txt
    python3 -c "
import json; d=json.load(open('/tmp/o.json')); e=d.get('error') or {}; print(d['status'], e.get('message')); print((e.get('traceback') or '')[-2900:])" || tail -5 /tmp/e.txt
  done
done
