"""Compare `gpu_bench.py kernelbench` runs made on one machine: rates, statuses, where the time goes, and each run's
speedups against the first run's (the baseline), as ratios on that machine.

    python benchmarks/compare_kernelbench.py BASELINE.json RUN.json [RUN.json ...]
"""

from __future__ import annotations

import json
import statistics
import sys
from collections import Counter
from pathlib import Path

PHASES = ("correctness", "timing", "timing_stage", "timing_warmup", "timing_refill", "timing_reference",
          "timing_candidate", "timing_null", "timing_verify", "timing_checks", "timing_release", "profile",
          "ablation", "handover", "gate_wait", "gate_alone", "gate_large")


def summary(baseline: dict, run: dict) -> dict:
    """A run's rate, its statuses, its phase medians and its speedups' deviation from the baseline's, where both are
    correct."""
    deviations = {name: row["speedup"] / base["speedup"] - 1 for name, row in run["problems"].items()
                  if (base := baseline["problems"].get(name)) and row["status"] == base["status"] == "correct"}
    worst = max(deviations, key=lambda name: abs(deviations[name])) if deviations else None
    return {
        "per_minute_running": run["per_minute_running"],
        "rate_vs_baseline": run["per_minute_running"] / baseline["per_minute_running"],
        "gate_serial_share": run.get("gate_serial_share"),  # absent in runs of the code before the judge
        "footprint_max_gib": run.get("footprint_max_gib"),  # likewise; and in runs of code before 2026-11-25
        "statuses": dict(Counter(row["status"] for row in run["problems"].values())),
        "not_correct": {name: (row["status"], row["hack_reasons"], (row.get("error") or "")[:300])
                        for name, row in run["problems"].items() if row["status"] != "correct"},
        "phase_median_s": {p: run["phase_median_s"].get(p) for p in PHASES},
        "speedup_deviation_max": (worst, deviations[worst]) if worst else None,
        "speedup_deviation_median": statistics.median(abs(d) for d in deviations.values()) if deviations else None,
    }


def main(paths: list[str]) -> None:
    if len(paths) < 2:
        sys.exit(__doc__)
    runs = [json.loads(Path(p).read_text()) for p in paths]
    for path, run in zip(paths[1:], runs[1:]):
        print(path, json.dumps(summary(runs[0], run), indent=1))
    print(f"baseline {paths[0]}: {runs[0]['per_minute_running']:.1f}/min, "
          f"{dict(Counter(r['status'] for r in runs[0]['problems'].values()))}")


if __name__ == "__main__":
    main(sys.argv[1:])
