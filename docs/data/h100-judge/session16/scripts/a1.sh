# call A1 (issue 19, 20): exploit l9 on the code before the share pool (ffcca1d) and the red team on this tree, on
# GPU 0; then driver_contention with the new `starting` scenario on all four GPUs.
export PYTHONUNBUFFERED=1
W=/tmp/w; mkdir -p $W
nvidia-smi --query-gpu=index,name,driver_version,memory.total --format=csv,noheader; nproc; date -u; cat .carry/S16/TREE
T0=$(date +%s)
cp tests/exploits/l9_*.py .carry/S16/base/tests/exploits/
(cd .carry/S16/base && CUDA_VISIBLE_DEVICES=0 DRKERNEL_TEST_DEVICE=cuda timeout 120 python3 -m pytest -q -p no:cacheprovider -o addopts="" -rfEx tests/test_hacking.py -k "exploit_is_caught and l9") > $W/l9_before.txt 2>&1
echo "l9 before: rc $? in $(( $(date +%s) - T0 )) s"; grep -E "passed|failed|expected" $W/l9_before.txt | tail -n 4 | cut -c1-600
T1=$(date +%s)
CUDA_VISIBLE_DEVICES=0 DRKERNEL_TEST_DEVICE=cuda timeout 260 python3 -m pytest -q -p no:cacheprovider -o addopts="" -rfEx tests/test_hacking.py tests/test_precision.py tests/test_isolation.py::test_what_the_judge_shares_lies_alone_in_its_allocations > $W/redteam.txt 2>&1
echo "red team: rc $? in $(( $(date +%s) - T1 )) s"; tail -n 8 $W/redteam.txt | cut -c1-400
T2=$(date +%s)
timeout 200 python3 benchmarks/driver_contention.py --gpus 0,1,2,3 --iterations 100 --contexts 3 --out $W/dc > $W/dc.log 2>&1
echo "driver_contention: rc $? in $(( $(date +%s) - T2 )) s"; tail -n 8 $W/dc.log
tar czf $OUT/a1.tgz -C $W . ; ls -la $OUT; date -u
