# Issues 19, 20 (twenty-third session): large evaluations paired (b15f604) against bde2ce4 (prev: one large at a time)
# and 46b6c34 (old: before the judge): the 20 level-1 problems, in turn new old prev new, the GPU's memory in use
# sampled every 200 ms. Then the small task's speedup CV at 20 and 100 timed calls per side (this tree); then the GPU
# test of a large evaluation's memory.
export PYTHONUNBUFFERED=1
W=/tmp/w1; mkdir -p $W
nvidia-smi --query-gpu=index,name,driver_version,memory.total --format=csv,noheader; nproc; date -u; cat .carry/S23/TREE
KB=$PWD/.carry/S23/kb.jsonl
kb() {  # $1: label, $2: folder of the tree
  T=$(date +%s)
  nvidia-smi --query-gpu=memory.used --format=csv,noheader,nounits -lms 200 > $W/mem_$1.txt 2>/dev/null & S=$!
  (cd $2 && CUDA_VISIBLE_DEVICES=0 timeout 110 python3 benchmarks/gpu_bench.py kernelbench --kernelbench $KB --out $W/kb_$1 > $W/kb_$1.log 2>&1)
  echo "kb $1: rc $? in $(( $(date +%s) - T )) s"; kill $S
  python3 -c "
import json; d=json.load(open('$W/kb_$1/kernelbench.json')); p=d['problems']
used=[int(x) for x in open('$W/mem_$1.txt').read().split() if x.isdigit()]
oom=[n for n,v in p.items() if any('ran out' in x for x in (v.get('notes') or []))]
print('  $1', round(d['per_minute_running'],2), 'serial', round(d.get('gate_serial_s') or 0,1), 'paired', round(d.get('gate_paired_s') or 0,1), 'correct', sum(v['status']=='correct' for v in p.values()), 'of', len(p), 'footprint', d['footprint_max_gib'], 'max used MiB', max(used or [0]), 'rerun alone', oom)" 2>&1 | cut -c1-400
}
kb new1 .
kb old1 .carry/S23/old
kb prev1 .carry/S23/prev
kb new2 .
tar czf $OUT/kb.tgz -C $W .
st() {  # $1: timed calls per side
  T=$(date +%s)
  CUDA_VISIBLE_DEVICES=0 timeout 100 python3 benchmarks/gpu_bench.py stability --repeats 20 --repeat-problems --perf-trials $1 --kernelbench $KB --out $W/st$1 > $W/st$1.log 2>&1
  echo "stability $1: rc $? in $(( $(date +%s) - T )) s"; grep "speedup CV" $W/st$1.log | cut -c1-200
}
st 20
st 100
tar czf $OUT/st.tgz -C $W st20 st100 st20.log st100.log
T=$(date +%s)
CUDA_VISIBLE_DEVICES=0 DRKERNEL_TEST_DEVICE=cuda timeout 90 python3 -m pytest -q -p no:cacheprovider -o addopts="" -rfEx tests/test_isolation.py -k 'large_evaluations or shares' > $W/memtest.txt 2>&1
echo "memory test: rc $? in $(( $(date +%s) - T )) s"; tail -n 4 $W/memtest.txt | cut -c1-400
cp $W/memtest.txt $OUT/; date -u
