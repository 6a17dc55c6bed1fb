# Issues 19, 20: the small task's speedup CV (ReLU 1024 x 1024) and problems 1 and 36, 20 evaluations each, with this
# tree and the code before the judge (46b6c34), on one H100 (a second call: old first, then new).
export PYTHONUNBUFFERED=1
W=/tmp/w4; mkdir -p $W; date -u; cat .carry/S22/TREE
KB=$PWD/.carry/S22/kb.jsonl
st() {
  T=$(date +%s)
  (cd $2 && CUDA_VISIBLE_DEVICES=0 timeout 170 python3 benchmarks/gpu_bench.py stability --repeats 20 --repeat-problems 1_Square_matrix_multiplication_ 36_RMSNorm_ --kernelbench $KB --out $W/st_$1 > $W/st_$1.log 2>&1)
  echo "stability $1: rc $? in $(( $(date +%s) - T )) s"
  python3 -c "
import json; d=json.load(open('$W/st_$1/stability.json'))
for k, v in d.items():
    if isinstance(v, dict): print('  $1', k, {kk: vv for kk, vv in v.items() if kk.endswith('cv') or kk.startswith('ratio')})
" 2>&1 | cut -c1-300
}
st old1 .carry/S22/old
st new3 .

tar czf $OUT/stab.tgz -C $W .; date -u
