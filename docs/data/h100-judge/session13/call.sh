# one call: the red team (pooled, warm sandboxes) on the H100, then the 20 level-1 problems: this tree, the code before the judge, this tree
export PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; date -u
T0=$(date +%s)
DRKERNEL_TEST_DEVICE=cuda timeout 280 python3 -m pytest -q -p no:cacheprovider -o addopts="" -rfEx tests/test_hacking.py tests/test_precision.py > $OUT/redteam_h100.txt 2>&1
echo "red team rc $? in $(( $(date +%s) - T0 )) s"; tail -n 8 $OUT/redteam_h100.txt
for run in new1 old1 new2; do
  T1=$(date +%s)
  if [ $run = old1 ]; then (cd .carry/S13C/baseline && timeout 90 python3 benchmarks/gpu_bench.py kernelbench --kernelbench ../kb.jsonl --out $OUT/$run > $OUT/$run.log 2>&1)
  else timeout 90 python3 benchmarks/gpu_bench.py kernelbench --kernelbench .carry/S13C/kb.jsonl --out $OUT/$run > $OUT/$run.log 2>&1; fi
  echo "$run rc $? in $(( $(date +%s) - T1 )) s"; tail -n 4 $OUT/$run.log
done
ls -R $OUT | head; date -u
