# call A (issues 19, 20): the 20 level-1 problems on one H100 with this tree (a large evaluation's first call lets
# others' timing in while Triton compiles; the timing phase's release follows judge.gives_back), the tree before
# (c5ed180) and the code before the judge (46b6c34), alternated (new, old, prev, new, old); then driver_contention's launch and pointer ops
# beside CUDA starts; then the red team on the GPU with this tree.
export PYTHONUNBUFFERED=1
W=/tmp/w1; mkdir -p $W
nvidia-smi --query-gpu=index,name,driver_version,memory.total --format=csv,noheader; nproc; uname -r; date -u; cat .carry/S17/TREE
python3 -c "import torch, triton; print(torch.__version__, triton.__version__)"
KB=$PWD/.carry/S13C/kb.jsonl
kb() {  # $1: label, $2: folder of the tree
  T=$(date +%s)
  (cd $2 && CUDA_VISIBLE_DEVICES=0 timeout 120 python3 benchmarks/gpu_bench.py kernelbench --kernelbench $KB --out $W/kb_$1 > $W/kb_$1.log 2>&1)
  echo "kb $1: rc $? in $(( $(date +%s) - T )) s"
  python3 -c "import json; d=json.load(open('$W/kb_$1/kernelbench.json')); p=d['problems']; print('  $1', round(d['per_minute_running'],2), 'running_s', round(d['running_s'],1), 'serial', d.get('gate_serial_s'), 'correct', sum(v['status']=='correct' for v in p.values()), 'of', len(p))" 2>&1 | cut -c1-300
}
kb new1 .
kb old1 .carry/S13C/baseline
kb prev1 .carry/S17/prev
kb new2 .
kb old2 .carry/S13C/baseline
tar czf $OUT/a_kb.tgz -C $W .
T=$(date +%s)
timeout 100 python3 benchmarks/driver_contention.py --gpus 0,0,0 --starters 0,0 --iterations 100 --contexts 3 --scenarios alone,spread,starting --out $W/dc > $W/dc.log 2>&1
echo "driver_contention: rc $? in $(( $(date +%s) - T )) s"; tail -n 12 $W/dc.log | cut -c1-200
cp $W/dc/driver_contention.json $OUT/ 2>/dev/null
T=$(date +%s)
CUDA_VISIBLE_DEVICES=0 DRKERNEL_TEST_DEVICE=cuda timeout 175 python3 -m pytest -q -p no:cacheprovider -o addopts="" -rfEx tests/test_hacking.py tests/test_precision.py tests/test_isolation.py::test_what_the_judge_shares_lies_alone_in_its_allocations > $W/redteam.txt 2>&1
echo "red team: rc $? in $(( $(date +%s) - T )) s"; tail -n 6 $W/redteam.txt | cut -c1-300
cp $W/redteam.txt $OUT/; date -u
