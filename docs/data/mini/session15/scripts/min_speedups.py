"""Lease 10's benches, Fast@1.2 again with each side's fastest timed call in place of its median (docs/experiments.md,
"Lease 10": in a fifth of the timed evaluations the candidate's median was ruined by slow calls). An estimate of
what clean medians would have given, not a verdict: the minimum is the optimistic end of each side.

    python docs/data/mini/session15/scripts/min_speedups.py docs/data/mini/session15/bench_*_trajectories.jsonl.gz
"""

import gzip
import json
import sys
from collections import defaultdict


def fast(turn: dict, by_min: bool) -> bool:
    result = turn.get("result") or {}
    if not result.get("correct") or result.get("speedup") is None:
        return False
    if not by_min:
        return result["speedup"] >= 1.2
    timing = result.get("timing") or {}
    ref, cand = timing.get("reference") or {}, timing.get("candidate") or {}
    if not ref.get("min_ms") or not cand.get("min_ms"):
        return result["speedup"] >= 1.2
    return ref["min_ms"] / cand["min_ms"] >= 1.2


for path in sys.argv[1:]:
    turns = [json.loads(line) for line in gzip.open(path, "rt")]
    trajectories = defaultdict(dict)
    for turn in turns:
        trajectories[(turn["task"], turn["sample"])][turn["turn"]] = turn
    timed = [t for t in turns if (t.get("result") or {}).get("timing") and not t["result"].get("cached")]
    ruined = sum(1 for t in timed if (c := t["result"]["timing"].get("candidate") or {}).get("median_ms")
                 and c["median_ms"] > 2 * c["min_ms"])
    row = {"run": path.split("/")[-1].removeprefix("bench_").removesuffix("_trajectories.jsonl.gz"),
           "timed": len(timed), "candidate median > 2 x its min": ruined}
    for by_min in (False, True):
        name = "min" if by_min else "median"
        hits = {key: [fast(turns_[k], by_min) for k in sorted(turns_)] for key, turns_ in trajectories.items()}
        n = len(hits)
        row[f"first/last/best ({name})"] = [round(100 * sum(h[0] for h in hits.values()) / n, 1),
                                            round(100 * sum(h[-1] for h in hits.values()) / n, 1),
                                            round(100 * sum(any(h) for h in hits.values()) / n, 1)]
    print(json.dumps(row))
