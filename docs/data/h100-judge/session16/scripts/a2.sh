# call A2 (issue 19, 20): rl_batch on one GPU alone, with the code before the share pool (ffcca1d) and this tree, then
# three at once (GPUs 1-3) with this tree; then the 20 level-1 problems on GPU 0 with this tree and the code before the
# judge (46b6c34).
export PYTHONUNBUFFERED=1
W=/tmp/w2; mkdir -p $W
nvidia-smi --query-gpu=index,name,driver_version,memory.total --format=csv,noheader; nproc; date -u; cat .carry/S16/TREE
cp tests/exploits/l9_*.py .carry/S16/base/tests/exploits/
for t in base new; do d=.; [ $t = base ] && d=.carry/S16/base
  (cd $d && CUDA_VISIBLE_DEVICES=0 DRKERNEL_TEST_DEVICE=cuda timeout 60 python3 -m pytest -q -p no:cacheprovider -o addopts="" -rfEx tests/test_hacking.py -k "exploit_is_caught and l9") > $W/l9_$t.txt 2>&1
  echo "l9 $t: rc $?"; grep -E "passed|failed|expected" $W/l9_$t.txt | tail -n 3 | cut -c1-500; done
R="python3 benchmarks/gpu_bench.py rl_batch --synthetic-n 8 --rl-samples 8 --rl-level1 0"
T0=$(date +%s)
(cd .carry/S16/base && CUDA_VISIBLE_DEVICES=1 timeout 150 $R --out $W/old_alone > $W/old_alone.log 2>&1)
echo "old alone: rc $? in $(( $(date +%s) - T0 )) s"; tail -n 3 $W/old_alone.log | cut -c1-300
T1=$(date +%s)
CUDA_VISIBLE_DEVICES=1 timeout 150 $R --out $W/alone > $W/alone.log 2>&1
echo "alone: rc $? in $(( $(date +%s) - T1 )) s"; tail -n 3 $W/alone.log | cut -c1-300
T2=$(date +%s)
for g in 1 2 3; do (CUDA_VISIBLE_DEVICES=$g timeout 200 $R --out $W/three$g > $W/three$g.log 2>&1; echo "three$g rc $?") & done; wait
echo "three at once: $(( $(date +%s) - T2 )) s"; for g in 1 2 3; do tail -n 2 $W/three$g.log | cut -c1-300; done
T3=$(date +%s)
CUDA_VISIBLE_DEVICES=0 timeout 100 python3 benchmarks/gpu_bench.py kernelbench --kernelbench .carry/S13C/kb.jsonl --out $W/kb_new > $W/kb_new.log 2>&1
echo "kb new: rc $? in $(( $(date +%s) - T3 )) s"; tail -n 3 $W/kb_new.log | cut -c1-300
T4=$(date +%s)
(cd .carry/S13C/baseline && CUDA_VISIBLE_DEVICES=0 timeout 100 python3 benchmarks/gpu_bench.py kernelbench --kernelbench ../kb.jsonl --out $W/kb_old > $W/kb_old.log 2>&1)
echo "kb old: rc $? in $(( $(date +%s) - T4 )) s"; tail -n 3 $W/kb_old.log | cut -c1-300
tar czf $OUT/a2.tgz -C $W . ; ls -la $OUT; date -u
