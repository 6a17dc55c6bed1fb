# The last call (issues 19, 20): the 20 level-1 problems with a large evaluation's smaller float64 allowance and the
# judge's inputs let go before the subject's call (tree in TREE2) against e0bbcce (.carry/S20/old), alternated on one
# H100; then the red team with the new tree.
export PYTHONUNBUFFERED=1
W=/tmp/w1; mkdir -p $W
nvidia-smi --query-gpu=index,name,driver_version,memory.total --format=csv,noheader; nproc; date -u; cat .carry/S20/TREE2
KB=$PWD/.carry/S20/kb.jsonl
kb() {  # $1: label, $2: folder of the tree
  T=$(date +%s)
  (cd $2 && CUDA_VISIBLE_DEVICES=0 timeout 110 python3 benchmarks/gpu_bench.py kernelbench --kernelbench $KB --out $W/kb_$1 > $W/kb_$1.log 2>&1)
  echo "kb $1: rc $? in $(( $(date +%s) - T )) s"
  python3 -c "import json; d=json.load(open('$W/kb_$1/kernelbench.json')); p=d['problems']; print('  $1', round(d['per_minute_running'],2), 'serial', round(d.get('gate_serial_s'),1), 'correct', sum(v['status']=='correct' for v in p.values()), 'of', len(p), 'footprint', d['footprint_max_gib'])" 2>&1 | cut -c1-300
}
kb new1 .
kb old1 .carry/S20/old
kb new2 .
kb old2 .carry/S20/old
tar czf $OUT/kb.tgz -C $W .
T=$(date +%s)
CUDA_VISIBLE_DEVICES=0 DRKERNEL_TEST_DEVICE=cuda timeout 150 python3 -m pytest -q -p no:cacheprovider -o addopts="" -rfEx tests/test_hacking.py tests/test_precision.py > $W/redteam.txt 2>&1
echo "red team: rc $? in $(( $(date +%s) - T )) s"; tail -n 6 $W/redteam.txt | cut -c1-300
cp $W/redteam.txt $OUT/; date -u
