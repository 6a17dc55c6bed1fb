# Issue 20 (twenty-sixth session), first call: why the fork server's imports take 9 s on the H100's host (2.4 s on
# the 2-core CPU machine). Is Python's bytecode of torch, sympy and triton compiled in the image, and what do the
# imports and a scheduler's start-up take before and after it is?
export PYTHONUNBUFFERED=1
W=/tmp/w1; mkdir -p $W
nvidia-smi --query-gpu=index,name,driver_version,memory.total --format=csv,noheader; date -u; git log -1 --format=%h; id -u
python3 - <<'PY'
import importlib.util, os, sys
print(sys.version.split()[0], sys.flags.dont_write_bytecode, sys.pycache_prefix)
for name in ("torch", "torch._dynamo", "sympy", "triton", "numpy"):
    d = os.path.dirname(importlib.util.find_spec(name).origin)
    py = pyc = 0
    for root, _, files in os.walk(d):
        py += sum(f.endswith(".py") for f in files)
        pyc += sum(f.endswith(".pyc") for f in files)
    print(f"{name}: {d} .py {py} .pyc {pyc} writable {os.access(d, os.W_OK)}")
PY
cat > $W/startup.py <<'PY'
import sys, time
t = time.monotonic()
from drkernel.scheduling.scheduler import Scheduler
s = Scheduler(device="cuda")
ok = s.wait_ready(timeout=120)
print(f"scheduler start-up {time.monotonic() - t:.2f} s, ready {ok}")
s.close()
PY
imports() {
  for i in 1 2; do
    PYTHONDONTWRITEBYTECODE=1 python3 -X importtime -c "import drkernel.sandbox.zygote as z, time; t=time.monotonic(); z._preload(); print(f'preload {time.monotonic()-t:.2f} s')" 2> $W/imp_$1_$i.txt
    sort -t'|' -k2 -n $W/imp_$1_$i.txt | tail -1; grep -E "\| (torch|torch._dynamo|sympy|triton)$" $W/imp_$1_$i.txt
  done
  for i in 1 2; do CUDA_VISIBLE_DEVICES=0 python3 $W/startup.py 2>&1 | tail -1; done
}
echo "== before"; imports before
T=$(date +%s)
python3 -c "import drkernel.sandbox.zygote" 2>/dev/null   # bytecode written where the installation lets it be
echo "one import writing bytecode: $(( $(date +%s) - T )) s"
echo "== after"; imports after
python3 - <<'PY'
import importlib.util, os
for name in ("torch", "sympy", "triton"):
    d = os.path.dirname(importlib.util.find_spec(name).origin)
    print(name, sum(f.endswith(".pyc") for r, _, fs in os.walk(d) for f in fs))
PY
tar czf $OUT/c1_imports.tar.gz -C $W . ; date -u
