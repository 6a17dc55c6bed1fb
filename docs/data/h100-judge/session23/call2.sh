# Issues 19, 20 (twenty-third session), second call: a large evaluation's ablation never paired, and a phase whose
# memory ran out beside others run again alone (TREE), against 46b6c34 (old: before the judge): the 20 level-1
# problems, new old new, the GPU's memory in use sampled every 200 ms; where a small input lies against a 7 us kernel's
# time (placement.py); the red team and the test of a large evaluation's memory on the GPU.
export PYTHONUNBUFFERED=1
W=/tmp/w2; mkdir -p $W
nvidia-smi --query-gpu=index,name,driver_version,memory.total --format=csv,noheader; date -u; cat .carry/S23/TREE
KB=$PWD/.carry/S23/kb.jsonl
kb() {  # $1: label, $2: folder of the tree
  T=$(date +%s)
  nvidia-smi --query-gpu=memory.used --format=csv,noheader,nounits -lms 200 > $W/mem_$1.txt 2>/dev/null & S=$!
  (cd $2 && CUDA_VISIBLE_DEVICES=0 timeout 110 python3 benchmarks/gpu_bench.py kernelbench --kernelbench $KB --out $W/kb_$1 > $W/kb_$1.log 2>&1)
  echo "kb $1: rc $? in $(( $(date +%s) - T )) s"; kill $S
  python3 -c "
import json; d=json.load(open('$W/kb_$1/kernelbench.json')); p=d['problems']
used=[int(x) for x in open('$W/mem_$1.txt').read().split() if x.isdigit()]
again=[n for n,v in p.items() if any('run again alone' in x for x in (v.get('notes') or []))]
print('  $1', round(d['per_minute_running'],2), 'serial', round(d.get('gate_serial_s') or 0,1), 'paired', round(d.get('gate_paired_s') or 0,1), 'correct', sum(v['status']=='correct' for v in p.values()), 'of', len(p), 'max used MiB', max(used or [0]), 'run again alone', again)
[print('   ', n, v['status'], (v.get('error') or '')[:150]) for n, v in p.items() if v['status'] != 'correct']" 2>&1 | cut -c1-400
}
kb new1 .
kb old1 .carry/S23/old
kb new2 .
tar czf $OUT/kb.tgz -C $W .
CUDA_VISIBLE_DEVICES=0 timeout 60 python3 .carry/S23/placement.py $OUT/placement.json 2>&1 | cut -c1-600
T=$(date +%s)
CUDA_VISIBLE_DEVICES=0 DRKERNEL_TEST_DEVICE=cuda timeout 200 python3 -m pytest -q -p no:cacheprovider -o addopts="" -rfEx tests/test_hacking.py tests/test_precision.py > $W/redteam.txt 2>&1
echo "red team: rc $? in $(( $(date +%s) - T )) s"; tail -n 6 $W/redteam.txt | cut -c1-300
cp $W/redteam.txt $OUT/
T=$(date +%s)
CUDA_VISIBLE_DEVICES=0 DRKERNEL_TEST_DEVICE=cuda timeout 60 python3 -m pytest -q -p no:cacheprovider -o addopts="" -rfEx tests/test_isolation.py -k 'large_evaluations or shares' > $W/memtest.txt 2>&1
echo "memory test: rc $? in $(( $(date +%s) - T )) s"; tail -n 3 $W/memtest.txt | cut -c1-300
cp $W/memtest.txt $OUT/; date -u
