# Issue 20 (twenty-eighth session), first call: a scheduler's start-up on the working tree ("new": the fork server
# imports no torch._dynamo; the profiler entered through torch.autograd.profiler) against 456cfe2 ("head", the
# session's start), in turn; where the new fork server's imports go; the isolation suite and the red team on the GPU
# (with the new tests: no evaluation imports torch._dynamo); the RL-shaped half batch and the 20 level-1 problems.
export PYTHONUNBUFFERED=1
W=/tmp/w1; mkdir -p $W
nvidia-smi --query-gpu=index,name,driver_version,memory.total --format=csv,noheader; date -u; python3 -V
lscpu | grep -E '^Model name|^CPU\(s\)' | head -2
KB=$PWD/.carry/S28/kb.jsonl
BC=$HOME/.cache/drkernel/bytecode   # the fork server's bytecode folder
cat > $W/startup.py <<'PY'
import sys, time
t = time.monotonic()
from drkernel.scheduling.scheduler import Scheduler
imported = time.monotonic()
s = Scheduler(device="cuda")
ok = s.wait_ready(timeout=120)
end = time.monotonic()
print(f"{sys.argv[1]} {end - t:.2f} {ok} import {imported - t:.2f} construct-to-ready {end - imported:.2f}")
s.close()
PY
startup() { (cd $2 && CUDA_VISIBLE_DEVICES=0 PYTHONPATH=$PWD timeout 60 python3 $W/startup.py $1 2>&1 | tail -1); }
rm -rf $BC
startup new-first . | tee -a $W/first.txt; startup head-first .carry/S28/head | tee -a $W/first.txt
for i in 1 2 3 4 5 6 7 8 9 10; do
  startup new . | tee -a $W/startup.txt; startup head .carry/S28/head | tee -a $W/startup.txt
done
python3 - $W/startup.txt <<'PY'
import collections, statistics, sys
runs = collections.defaultdict(list)
for line in open(sys.argv[1]):
    f = line.split(); runs[f[0]].append(float(f[1]))
for label, v in runs.items():
    print(label, f"median {statistics.median(v):.2f} min {min(v):.2f} max {max(v):.2f} under 3 s: {sum(x < 3 for x in v)} of {len(v)}")
PY
for tree in . .carry/S28/head; do
  (cd $tree && PYTHONPATH=$PWD PYTHONPYCACHEPREFIX=$BC python3 -c "
import sys, time; t = time.monotonic()
import drkernel.sandbox.zygote
print('$tree', f'zygote imports {time.monotonic() - t:.2f} s', 'dynamo', 'torch._dynamo' in sys.modules, 'sympy', 'sympy' in sys.modules)")
done
for i in 1 2; do PYTHONPATH=$PWD PYTHONPYCACHEPREFIX=$BC python3 -X importtime -c "import drkernel.sandbox.zygote" 2> $W/importtime_$i.txt; done
sort -t'|' -k2 -n $W/importtime_1.txt | tail -12
tar czf $OUT/c1_importtime.tar.gz -C $W importtime_1.txt importtime_2.txt
cp $W/startup.txt $OUT/c1_startup.txt
T=$(date +%s)
CUDA_VISIBLE_DEVICES=0 DRKERNEL_TEST_DEVICE=cuda timeout 290 python3 -m pytest -q -p no:cacheprovider -o addopts="" -rfEx tests/test_isolation.py tests/test_hacking.py > $W/tests.txt 2>&1
echo "isolation and red team: rc $? in $(( $(date +%s) - T )) s"; tail -n 6 $W/tests.txt | cut -c1-300
cp $W/tests.txt $OUT/c1_tests.txt
T=$(date +%s)
CUDA_VISIBLE_DEVICES=0 timeout 170 python3 benchmarks/gpu_bench.py rl_batch --synthetic-n 8 --rl-samples 8 --kernelbench $KB --out $W/rl > $W/rl.log 2>&1
echo "rl: rc $? in $(( $(date +%s) - T )) s"; tail -3 $W/rl.log | cut -c1-300
python3 docs/data/h100-judge/session28/compare_rl.py $W/rl/rl_batch.json docs/data/h100-judge/session27/c2_rl.json.gz 2>&1 | cut -c1-2500
gzip -c $W/rl/rl_batch.json > $OUT/c1_rl.json.gz; date -u
