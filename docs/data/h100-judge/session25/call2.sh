# Issue 19 (twenty-fifth session), second call: large evaluations' ablations paired as their correctness phases are,
# with a subject that holds at most three copies (TREE, "new"); its memory test and the gate's tests on the GPU; the
# 20 level-1 problems with TREE, b7ab161 ("prev") and 46b6c34 ("old") in turn, the GPU's memory in use sampled.
export PYTHONUNBUFFERED=1
W=/tmp/w2; mkdir -p $W
nvidia-smi --query-gpu=index,name,driver_version,memory.total --format=csv,noheader; date -u; cat .carry/S25/TREE
KB=$PWD/.carry/S25/kb.jsonl
T=$(date +%s)
CUDA_VISIBLE_DEVICES=0 DRKERNEL_TEST_DEVICE=cuda timeout 150 python3 -m pytest -q -p no:cacheprovider -o addopts="" -rfEx tests/test_gate.py "tests/test_isolation.py::test_a_large_evaluations_checks_hold_few_copies_of_its_inputs" > $W/gate_memory.txt 2>&1
echo "gate + memory: rc $? in $(( $(date +%s) - T )) s"; tail -n 4 $W/gate_memory.txt | cut -c1-400
kb() {  # $1: label, $2: folder of the tree
  nvidia-smi --query-gpu=memory.used --format=csv,noheader,nounits -lms 200 > $W/mem_$1.txt & M=$!
  T=$(date +%s)
  (cd $2 && CUDA_VISIBLE_DEVICES=0 timeout 110 python3 benchmarks/gpu_bench.py kernelbench --kernelbench $KB --out $W/kb_$1 > $W/kb_$1.log 2>&1)
  echo "kb $1: rc $? in $(( $(date +%s) - T )) s"; kill $M
  python3 - $W/kb_$1/kernelbench.json $1 $W/mem_$1.txt <<'PY' 2>&1 | cut -c1-900
import json, sys
d = json.load(open(sys.argv[1])); p = d["problems"]; t = d.get("phase_total_s", {})
mem = [int(x) for x in open(sys.argv[3]).read().split() if x.isdigit()]
abl = [(v.get("memory_gib") or {}) for v in p.values()]
print("  %s %.2f/min serial %.1f alone %.1f large %.1f paired %.1f ablation %.1f timing %.1f start-up %.1f correct %d of %d; most GPU memory %d MiB; ablation judge <= %.1f subject <= %.1f GiB" % (
    sys.argv[2], d["per_minute_running"], d.get("gate_serial_s") or 0, t.get("gate_alone", 0), t.get("gate_large", 0),
    t.get("gate_paired", 0), t.get("ablation", 0), t.get("timing", 0), d["start_up_s"],
    sum(v["status"] == "correct" for v in p.values()), len(p), max(mem or [0]),
    max([m.get("ablation_judge", 0) for m in abl] or [0]), max([m.get("ablation_subject", 0) for m in abl] or [0])))
PY
}
kb new1 .
kb prev1 .carry/S25/prev
kb old1 .carry/S25/old
kb new2 .
kb prev2 .carry/S25/prev
tar czf $OUT/c2_kb.tgz -C $W kb_new1 kb_prev1 kb_old1 kb_new2 kb_prev2 mem_new1.txt mem_new2.txt mem_prev1.txt gate_memory.txt; date -u
