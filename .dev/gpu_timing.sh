#!/usr/bin/env bash
# Timing quality of this tree against the tree before the channel and timing changes (.old/), in one run on one
# GPU: the small task's speedup CV (gpu_bench stability) and the level-1 set's speedups and rate (gpu_bench
# kernelbench), in the order old, new, new, old. Writes $OUT/timing.tar.gz and $OUT/timing_summary.json.
set -u
export PYTHONUNBUFFERED=1 PYTHONDONTWRITEBYTECODE=1
KB=$PWD/.kb/kernelbench_levels1-3.jsonl
ROOT=$PWD
mkdir -p /tmp/timing
n=0
for tree in ${ORDER:-.old . . .old}; do
  n=$((n+1)); name=$([ "$tree" = . ] && echo new || echo old)$n
  echo "== $name"
  (cd $ROOT/$tree && timeout 150 python3 benchmarks/gpu_bench.py stability kernelbench --kernelbench $KB \
      --repeats 10 --repeat-problems --out /tmp/timing/$name 2>&1 | tail -4)
done
python3 - <<'PY'
import json, os, statistics, glob
out = {}
for run in sorted(os.listdir("/tmp/timing")):
    row = {}
    try:
        st = json.load(open(f"/tmp/timing/{run}/stability.json"))
        small = next(iter(st.values()))
        row["small_speedup_cv"] = small.get("speedup_cv")
        row["small_speedup_median"] = statistics.median(small["speedups"]) if small.get("speedups") else None
        row["small_statuses"] = sorted(set(small["statuses"]))
    except Exception as exc:
        row["stability_error"] = repr(exc)
    try:
        kb = json.load(open(f"/tmp/timing/{run}/kernelbench.json"))
        row["per_minute"] = kb.get("per_minute"); row["per_minute_running"] = kb.get("per_minute_running")
        row["speedups"] = {k: v.get("speedup") for k, v in kb["problems"].items()}
        row["statuses"] = {k: v.get("status") for k, v in kb["problems"].items()}
        row["hack_reasons"] = {k: v.get("hack_reasons") for k, v in kb["problems"].items() if v.get("hack_reasons")}
    except Exception as exc:
        row["kernelbench_error"] = repr(exc)
    out[run] = row
json.dump(out, open(os.environ["OUT"] + "/timing_summary.json", "w"), indent=1)
for run, row in out.items():
    print(run, row.get("small_speedup_cv"), row.get("small_speedup_median"), row.get("per_minute"),
          row.get("stability_error", "")[:80], row.get("kernelbench_error", "")[:80])
PY
tar czf $OUT/timing.tar.gz -C /tmp timing
