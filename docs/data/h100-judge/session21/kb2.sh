# While the GGUF's chunks come (issues 19, 20): the 20 level-1 problems with this tree (a3344b1's per-trial release of
# a large evaluation's outputs and its cache after the float64 evaluation) against c3df689 (.carry/S21/old), on one
# GPU, new then old; each phase's footprint per problem is in the JSON (memory_gib). $1: a label for this pair.
W=/tmp/mini/kb; mkdir -p $W; KB=/tmp/repo/.carry/S21/kb.jsonl; export PYTHONPATH=/tmp/site  # each tree's own drkernel, from its folder
kb() {  # $1: label, $2: folder of the tree
  T=$(date +%s)
  (cd $2 && python3 -c "import drkernel.sandbox.judge as j, inspect; print('  judge', j.__file__, 'per-trial release:', 'forget_outputs()' in inspect.getsource(j))" && CUDA_VISIBLE_DEVICES=0 timeout 110 python3 benchmarks/gpu_bench.py kernelbench --kernelbench $KB --out $W/kb_$1 > $W/kb_$1.log 2>&1)
  echo "kb $1: rc $? in $(( $(date +%s) - T )) s"
  python3 -c "import json; d=json.load(open('$W/kb_$1/kernelbench.json')); p=d['problems']; print('  $1', round(d['per_minute_running'],2), 'serial', round(d.get('gate_serial_s'),1), 'correct', sum(v['status']=='correct' for v in p.values()), 'of', len(p), 'footprint', d['footprint_max_gib'])" 2>&1 | cut -c1-400
}
kb new${1:-1} /tmp/repo
kb old${1:-1} /tmp/repo/.carry/S21/old
