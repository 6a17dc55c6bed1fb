# Issue 20 (twenty-sixth session), fifth call: the final tree (TREE) chooses its bytecode folder on the H100's image
# (torch's installation holds none), starts as measured in call 4, and passes the bytecode tests on the GPU.
export PYTHONUNBUFFERED=1
W=/tmp/w5; mkdir -p $W
nvidia-smi --query-gpu=index,name,driver_version,memory.total --format=csv,noheader; date -u; git log -1 --format=%h
python3 -c "from drkernel.runner.sandbox import fork_server_bytecode, installation_has_bytecode as h; print('installation has bytecode:', h('torch'), '; folder:', fork_server_bytecode())"
cat > $W/startup.py <<'PY'
import sys, time
t = time.monotonic()
from drkernel.scheduling.scheduler import Scheduler
s = Scheduler(device="cuda")
ok = s.wait_ready(timeout=120)
print(f"{sys.argv[1]} {time.monotonic() - t:.2f} {ok}")
s.close()
PY
rm -rf ~/.cache/drkernel/bytecode
for i in 0 1 2 3 4 5 6; do CUDA_VISIBLE_DEVICES=0 PYTHONPATH=$PWD timeout 60 python3 $W/startup.py start$i 2>&1 | tail -1; done | tee $W/startup.txt
T=$(date +%s)
CUDA_VISIBLE_DEVICES=0 DRKERNEL_TEST_DEVICE=cuda timeout 120 python3 -m pytest -q -p no:cacheprovider -o addopts="" -rfEx tests/test_isolation.py -k "bytecode or next_evaluation or secrets" > $W/tests.txt 2>&1
echo "bytecode tests: rc $? in $(( $(date +%s) - T )) s"; tail -n 2 $W/tests.txt | cut -c1-300
cp $W/startup.txt $OUT/c5_startup.txt; cp $W/tests.txt $OUT/c5_tests.txt; date -u
