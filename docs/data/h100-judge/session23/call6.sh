# Issues 19, 20 (twenty-third session), sixth call, the final tree (TREE): the red team, the gate's tests (the rerun
# alone end to end) and the isolation suite on the GPU; the 20 level-1 problems with TREE and 46b6c34 (old).
export PYTHONUNBUFFERED=1
W=/tmp/w6; mkdir -p $W
nvidia-smi --query-gpu=index,name,driver_version,memory.total --format=csv,noheader; date -u; cat .carry/S23/TREE
KB=$PWD/.carry/S23/kb.jsonl
T=$(date +%s)
CUDA_VISIBLE_DEVICES=0 DRKERNEL_TEST_DEVICE=cuda timeout 220 python3 -m pytest -q -p no:cacheprovider -o addopts="" -rfEx tests/test_hacking.py tests/test_precision.py > $W/redteam.txt 2>&1
echo "red team: rc $? in $(( $(date +%s) - T )) s"; tail -n 5 $W/redteam.txt | cut -c1-300
T=$(date +%s)
CUDA_VISIBLE_DEVICES=0 DRKERNEL_TEST_DEVICE=cuda timeout 150 python3 -m pytest -q -p no:cacheprovider -o addopts="" -rfEx tests/test_gate.py tests/test_isolation.py > $W/gate_isolation.txt 2>&1
echo "gate + isolation: rc $? in $(( $(date +%s) - T )) s"; tail -n 4 $W/gate_isolation.txt | cut -c1-300
cp $W/redteam.txt $W/gate_isolation.txt $OUT/
kb() {  # $1: label, $2: folder of the tree
  T=$(date +%s)
  (cd $2 && CUDA_VISIBLE_DEVICES=0 timeout 110 python3 benchmarks/gpu_bench.py kernelbench --kernelbench $KB --out $W/kb_$1 > $W/kb_$1.log 2>&1)
  echo "kb $1: rc $? in $(( $(date +%s) - T )) s"
  python3 -c "
import json; d=json.load(open('$W/kb_$1/kernelbench.json')); p=d['problems']
print('  $1', round(d['per_minute_running'],2), 'serial', round(d.get('gate_serial_s') or 0,1), 'correct', sum(v['status']=='correct' for v in p.values()), 'of', len(p))" 2>&1 | cut -c1-300
}
kb new1 .
kb old1 .carry/S23/old
tar czf $OUT/kb.tgz -C $W kb_new1 kb_old1; date -u
