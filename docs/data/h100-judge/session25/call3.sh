# Issue 19 (twenty-fifth session), third call: the red team on TREE ("new": large ablations paired, and the CUDA
# contexts' starts and ends held beside checks, never beside a timing); the 20 level-1 problems with TREE, "pair"
# (the ablations paired, the starts and ends not held) and 46b6c34 ("old"), in turn, twice.
export PYTHONUNBUFFERED=1
W=/tmp/w3; mkdir -p $W
nvidia-smi --query-gpu=index,name,driver_version,memory.total --format=csv,noheader; date -u; cat .carry/S25/TREE
KB=$PWD/.carry/S25/kb.jsonl
T=$(date +%s)
CUDA_VISIBLE_DEVICES=0 DRKERNEL_TEST_DEVICE=cuda timeout 200 python3 -m pytest -q -p no:cacheprovider -o addopts="" -rfEx tests/test_hacking.py tests/test_precision.py > $W/redteam.txt 2>&1
echo "red team: rc $? in $(( $(date +%s) - T )) s"; tail -n 5 $W/redteam.txt | cut -c1-300
kb() {  # $1: label, $2: folder of the tree
  T=$(date +%s)
  (cd $2 && CUDA_VISIBLE_DEVICES=0 timeout 100 python3 benchmarks/gpu_bench.py kernelbench --kernelbench $KB --out $W/kb_$1 > $W/kb_$1.log 2>&1)
  echo "kb $1: rc $? in $(( $(date +%s) - T )) s"
  python3 - $W/kb_$1/kernelbench.json $1 <<'PY' 2>&1 | cut -c1-600
import json, sys
d = json.load(open(sys.argv[1])); p = d["problems"]; t = d.get("phase_total_s", {})
print("  %s %.2f/min serial %.1f alone %.1f large %.1f paired %.1f ablation %.1f timing %.1f start-up %.1f correct %d of %d" % (
    sys.argv[2], d["per_minute_running"], d.get("gate_serial_s") or 0, t.get("gate_alone", 0), t.get("gate_large", 0),
    t.get("gate_paired", 0), t.get("ablation", 0), t.get("timing", 0), d["start_up_s"],
    sum(v["status"] == "correct" for v in p.values()), len(p)))
PY
}
kb new1 .
kb pair1 .carry/S25/pair
kb old1 .carry/S25/old
kb new2 .
kb pair2 .carry/S25/pair
kb old2 .carry/S25/old
tar czf $OUT/c3_kb.tgz -C $W kb_new1 kb_pair1 kb_old1 kb_new2 kb_pair2 kb_old2 redteam.txt; date -u
