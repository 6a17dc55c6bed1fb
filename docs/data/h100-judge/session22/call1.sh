# Issues 19, 20 (twenty-second session): the 20 level-1 problems with this tree (forget_inputs, the degeneracy sample
# on the host) against 153eb24 (before both: prev) and 46b6c34 (before the judge: old), on one H100, in turn
# new old prev new old; then the GPU test of a large evaluation's memory. Footprints per problem: memory_gib.
export PYTHONUNBUFFERED=1
W=/tmp/w1; mkdir -p $W
nvidia-smi --query-gpu=index,name,driver_version,memory.total --format=csv,noheader; nproc; date -u; cat .carry/S22/TREE
KB=$PWD/.carry/S22/kb.jsonl
kb() {  # $1: label, $2: folder of the tree
  T=$(date +%s)
  (cd $2 && CUDA_VISIBLE_DEVICES=0 timeout 110 python3 benchmarks/gpu_bench.py kernelbench --kernelbench $KB --out $W/kb_$1 > $W/kb_$1.log 2>&1)
  echo "kb $1: rc $? in $(( $(date +%s) - T )) s"
  python3 -c "import json; d=json.load(open('$W/kb_$1/kernelbench.json')); p=d['problems']; print('  $1', round(d['per_minute_running'],2), 'serial', round(d.get('gate_serial_s') or 0,1), 'correct', sum(v['status']=='correct' for v in p.values()), 'of', len(p), 'footprint', d['footprint_max_gib'])" 2>&1 | cut -c1-300
}
kb new1 .
kb old1 .carry/S22/old
kb prev1 .carry/S22/prev
kb new2 .
kb old2 .carry/S22/old
tar czf $OUT/kb.tgz -C $W .
T=$(date +%s)
CUDA_VISIBLE_DEVICES=0 DRKERNEL_TEST_DEVICE=cuda timeout 100 python3 -m pytest -q -p no:cacheprovider -o addopts="" -rfEx tests/test_isolation.py -k 'large_evaluations or shares' > $W/memtest.txt 2>&1
echo "memory test: rc $? in $(( $(date +%s) - T )) s"; tail -n 8 $W/memtest.txt | cut -c1-400
cp $W/memtest.txt $OUT/; date -u
