# Issues 19, 20 (twenty-fifth session), fourth call, the final tree (TREE: large ablations paired, and a median well
# above the fastest quarter of its calls measured again): the red team on the GPU; the 20 level-1 problems with TREE
# and 46b6c34 ("old") in turn, twice; the small task's speedup CV.
export PYTHONUNBUFFERED=1
W=/tmp/w4; mkdir -p $W
nvidia-smi --query-gpu=index,name,driver_version,memory.total --format=csv,noheader; date -u; cat .carry/S25/TREE
KB=$PWD/.carry/S25/kb.jsonl
T=$(date +%s)
CUDA_VISIBLE_DEVICES=0 DRKERNEL_TEST_DEVICE=cuda timeout 170 python3 -m pytest -q -p no:cacheprovider -o addopts="" -rfEx tests/test_hacking.py tests/test_precision.py > $W/redteam.txt 2>&1
echo "red team: rc $? in $(( $(date +%s) - T )) s"; tail -n 5 $W/redteam.txt | cut -c1-300
kb() {  # $1: label, $2: folder of the tree
  T=$(date +%s)
  (cd $2 && CUDA_VISIBLE_DEVICES=0 timeout 75 python3 benchmarks/gpu_bench.py kernelbench --kernelbench $KB --out $W/kb_$1 > $W/kb_$1.log 2>&1)
  echo "kb $1: rc $? in $(( $(date +%s) - T )) s"
  python3 - $W/kb_$1/kernelbench.json $1 <<'PY' 2>&1 | cut -c1-600
import json, sys
d = json.load(open(sys.argv[1])); p = d["problems"]; t = d.get("phase_total_s", {})
print("  %s %.2f/min serial %.1f alone %.1f large %.1f paired %.1f ablation %.1f timing %.1f start-up %.1f correct %d of %d, measured twice %d" % (
    sys.argv[2], d["per_minute_running"], d.get("gate_serial_s") or 0, t.get("gate_alone", 0), t.get("gate_large", 0),
    t.get("gate_paired", 0), t.get("ablation", 0), t.get("timing", 0), d["start_up_s"],
    sum(v["status"] == "correct" for v in p.values()), len(p), sum((v.get("measurements") or 1) > 1 for v in p.values())))
PY
}
kb new1 .
kb old1 .carry/S25/old
kb new2 .
kb old2 .carry/S25/old
T=$(date +%s)
CUDA_VISIBLE_DEVICES=0 timeout 90 python3 benchmarks/gpu_bench.py stability --repeats 20 --repeat-problems --kernelbench $KB --out $W/st_new1 > $W/st_new1.log 2>&1
echo "stability new1: rc $? in $(( $(date +%s) - T )) s"; grep "speedup CV" $W/st_new1.log | head -1 | cut -c1-200
tar czf $OUT/c4.tgz -C $W kb_new1 kb_old1 kb_new2 kb_old2 st_new1 st_new1.log redteam.txt; date -u
