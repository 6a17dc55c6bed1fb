"""An rl_batch run's rates and phase medians, and its verdicts against an earlier run's, one by one."""
import gzip
import json
import sys

opened = [gzip.open(p) if p.endswith(".gz") else open(p) for p in sys.argv[1:3]]
d, old = (json.load(f) for f in opened)
print({k: d.get(k) for k in ("distinct_per_minute_running", "distinct_alone_per_minute_running",
                             "distinct_per_minute_cold", "start_up_s", "duplicates_cost_s", "median_overhead_s",
                             "statuses", "level1_per_minute_running", "level1_per_minute_cold")})
for key in ("phase_median_s", "level1_phase_median_s"):
    print(key, {k: round(v, 3) for k, v in (d.get(key) or {}).items()})
def verdict(p):
    return p["status"], tuple(p["hack_reasons"])
for run in ("batch", "level1"):
    if run not in d["runs"] or not d["runs"][run] or run not in old["runs"] or not old["runs"][run]:
        continue
    new, before = d["runs"][run]["problems"], old["runs"][run]["problems"]
    same = sum(k in new and verdict(new[k]) == verdict(before[k]) for k in before)
    print(run, "verdicts as the earlier run's:", same, "of", len(before), "; differing:",
          [k for k in before if k not in new or verdict(new[k]) != verdict(before[k])][:5])
