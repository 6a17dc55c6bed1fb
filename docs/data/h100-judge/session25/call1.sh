# Issue 19 (twenty-fifth session), first call: the 20 level-1 problems with the CUDA contexts' starts and ends held
# beside others' checks, never beside a timing (TREE, "new"), against b7ab161 ("prev") and 46b6c34 ("old"), in turn.
export PYTHONUNBUFFERED=1
W=/tmp/w1; mkdir -p $W
nvidia-smi --query-gpu=index,name,driver_version,memory.total --format=csv,noheader; date -u; cat .carry/S25/TREE
KB=$PWD/.carry/S25/kb.jsonl
kb() {  # $1: label, $2: folder of the tree
  T=$(date +%s)
  (cd $2 && CUDA_VISIBLE_DEVICES=0 timeout 110 python3 benchmarks/gpu_bench.py kernelbench --kernelbench $KB --out $W/kb_$1 > $W/kb_$1.log 2>&1)
  echo "kb $1: rc $? in $(( $(date +%s) - T )) s"
  python3 - $W/kb_$1/kernelbench.json $1 <<'PY' 2>&1 | cut -c1-600
import json, sys
d = json.load(open(sys.argv[1])); p = d["problems"]; t = d.get("phase_total_s", {})
print("  %s %.2f/min serial %.1f alone %.1f timing %.1f profile %.1f exit %.1f start-up %.1f correct %d of %d" % (
    sys.argv[2], d["per_minute_running"], d.get("gate_serial_s") or 0, t.get("gate_alone", 0), t.get("timing", 0),
    t.get("profile", 0), t.get("exit", 0), d["start_up_s"], sum(v["status"] == "correct" for v in p.values()), len(p)))
PY
}
kb new1 .
kb prev1 .carry/S25/prev
kb old1 .carry/S25/old
kb new2 .
kb prev2 .carry/S25/prev
tar czf $OUT/c1_kb.tgz -C $W kb_new1 kb_prev1 kb_old1 kb_new2 kb_prev2; date -u
