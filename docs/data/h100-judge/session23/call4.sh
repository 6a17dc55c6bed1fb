# Issues 19, 20 (twenty-third session), fourth call: the small task's speedup CV (20 evaluations, 20 timed calls per
# side) with 8 places (TREE) and with 16 (p16: TREE with PLACEMENTS = 16), in turn, and 46b6c34 (old); then the 20
# level-1 problems with TREE and old.
export PYTHONUNBUFFERED=1
W=/tmp/w4; mkdir -p $W
nvidia-smi --query-gpu=index,name,driver_version,memory.total --format=csv,noheader; date -u; cat .carry/S23/TREE
KB=$PWD/.carry/S23/kb.jsonl
st() {  # $1: label, $2: folder of the tree, $3...: more options
  T=$(date +%s)
  (cd $2 && CUDA_VISIBLE_DEVICES=0 timeout 100 python3 benchmarks/gpu_bench.py stability --repeats 20 --kernelbench $KB --out $W/st_$1 "${@:3}" > $W/st_$1.log 2>&1)
  echo "stability $1: rc $? in $(( $(date +%s) - T )) s"; grep "speedup CV" $W/st_$1.log | head -1 | cut -c1-200
}
st p8a . --repeat-problems
st p16a .carry/S23/p16 --repeat-problems
st p8b . --repeat-problems
st p16b .carry/S23/p16 --repeat-problems
st old1 .carry/S23/old --repeat-problems 88_MinGPTNewGelu
tar czf $OUT/st.tgz -C $W .
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
