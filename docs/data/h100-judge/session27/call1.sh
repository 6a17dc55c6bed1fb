# Issue 20 (twenty-seventh session), first call: a scheduler's start-up on the working tree ("new": torch's global
# dependencies loaded beside the fork server's imports of pure Python, and the worker reading drkernel's bytecode
# from the fork server's folder), the same without the loader thread ("nodeps") and HEAD 8cd4330 ("head"), in turn;
# where the fork server's start-up goes; the isolation suite on the GPU; the RL-shaped half batch, its verdicts
# against the twenty-sixth session's.
export PYTHONUNBUFFERED=1
W=/tmp/w1; mkdir -p $W
nvidia-smi --query-gpu=index,name,driver_version,memory.total --format=csv,noheader; date -u; python3 -V
D=docs/data/h100-judge/session27
BC=$HOME/.cache/drkernel/bytecode   # the fork server's bytecode folder
mkdir -p $W/nodeps && cp -r drkernel $W/nodeps/
sed -i 's/^    _TORCH_DEPS.start()$/    pass/' $W/nodeps/drkernel/sandbox/zygote.py; grep -c "^    pass$" $W/nodeps/drkernel/sandbox/zygote.py
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
startup new-first . | tee -a $W/first.txt
for i in 1 2 3 4 5 6 7 8; do
  startup new . | tee -a $W/startup.txt; startup nodeps $W/nodeps | tee -a $W/startup.txt
  startup head .carry/S27/head | tee -a $W/startup.txt
done
python3 - $W/startup.txt <<'PY'
import collections, statistics, sys
runs = collections.defaultdict(lambda: collections.defaultdict(list))
for line in open(sys.argv[1]):
    f = line.split()
    runs[f[0]]["total"].append(float(f[1])); runs[f[0]]["import"].append(float(f[4])); runs[f[0]]["ready"].append(float(f[6]))
for label, parts in runs.items():
    print(label, " ".join(f"{k}: median {statistics.median(v):.2f} min {min(v):.2f} max {max(v):.2f}" for k, v in parts.items()),
          f"under 3 s: {sum(x < 3 for x in parts['total'])} of {len(parts['total'])}")
PY
echo "without CUDA_VISIBLE_DEVICES (nvidia-smi finds the GPU):"
for i in 1 2; do PYTHONPATH=$PWD timeout 60 python3 $W/startup.py new-nvsmi 2>&1 | tail -1; done
python3 -c "import subprocess, time
for _ in range(3):
    t = time.monotonic(); subprocess.run(['nvidia-smi', '--query-gpu=index', '--format=csv,noheader'], capture_output=True)
    print(f'nvidia-smi {time.monotonic() - t:.2f} s')"
for i in 1 2 3; do for m in plain alone thread; do PYTHONPATH=$PWD PYTHONPYCACHEPREFIX=$BC python3 $D/startup_parts.py $m 2>&1 | tail -1; done; done
echo "bytecode folder: $(find $BC -name '*.pyc' | wc -l) files, $(du -sh $BC | cut -f1)"
T=$(date +%s)
CUDA_VISIBLE_DEVICES=0 DRKERNEL_TEST_DEVICE=cuda timeout 200 python3 -m pytest -q -p no:cacheprovider -o addopts="" -rfEx tests/test_isolation.py "tests/test_scheduler.py::test_a_worker_reads_drkernel_s_bytecode_from_its_fork_server_s_folder" > $W/tests.txt 2>&1
echo "isolation: rc $? in $(( $(date +%s) - T )) s"; tail -n 6 $W/tests.txt | cut -c1-300
T=$(date +%s)
CUDA_VISIBLE_DEVICES=0 timeout 170 python3 benchmarks/gpu_bench.py rl_batch --synthetic-n 8 --rl-samples 8 --rl-level1 0 --out $W/rl > $W/rl.log 2>&1
echo "rl: rc $? in $(( $(date +%s) - T )) s"
python3 - $W/rl/rl_batch.json docs/data/h100-judge/session26/c3_rl.json.gz <<'PY' 2>&1 | cut -c1-1200
import gzip, json, sys
d = json.load(open(sys.argv[1])); old = json.load(gzip.open(sys.argv[2]))
print({k: d.get(k) for k in ("distinct_per_minute_running", "distinct_alone_per_minute_running", "distinct_per_minute_cold",
      "start_up_s", "duplicates_cost_s", "median_overhead_s", "statuses")})
verdict = lambda p: (p["status"], tuple(p["hack_reasons"]))
new, before = d["runs"]["batch"]["problems"], old["runs"]["batch"]["problems"]
print("verdicts as the twenty-sixth session's (call 3):", sum(verdict(new[k]) == verdict(before[k]) for k in before), "of",
      len(before), "; differing:", [k for k in before if verdict(new.get(k, before[k])) != verdict(before[k]) or k not in new][:5])
PY
cp $W/startup.txt $OUT/c1_startup.txt; cp $W/tests.txt $OUT/c1_tests.txt; gzip -c $W/rl/rl_batch.json > $OUT/c1_rl.json.gz; date -u
