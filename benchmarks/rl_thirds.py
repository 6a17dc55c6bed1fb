"""Did RL runs move their answers? Fast@1.2 on the train prompts, first third of the steps against the last, pooled
over runs (replicates), with a bootstrap interval over prompts: of the first answers (`--measure first`, the
default), of each trajectory's last turn (`last`) or of any of its turns (`best`, best of history).

    python benchmarks/rl_thirds.py RUN/samples.jsonl[.gz] [...] [--measure first|last|best] [--p 1.2] [--draws 2000]
                                   [--seed 0]

Reads what `drkernel train --log-samples` writes (one line per judged turn). Each run's steps are cut into thirds as
`drkernel report`'s training table cuts them (drkernel.report.metrics.step_thirds); a prompt is one (run, step,
task) with its trajectories (one `sample` of it each; its last turn is the last one recorded). Every step draws new
prompts, so the two thirds hold different prompts: the interval draws each third's prompts with replacement,
independently (docs/miniature.md).
"""

from __future__ import annotations

import argparse
import gzip
import json
import random
import sys
from pathlib import Path
from typing import Any

from drkernel.report.metrics import INTERVAL_DRAWS, INTERVAL_LEVEL, step_thirds

Prompt = list[bool]  # one prompt's trajectories: Fast@p or not, by the measure
MEASURES = ("first", "last", "best")


NEEDED = ("step", "task", "turn")  # of each line; correct and speedup may be absent (a failed turn)


def read_samples(path: Path) -> list[dict]:
    """The judged turns of one run; a line that is not one (metrics.jsonl's, a cut line) stops with its number."""
    opener = gzip.open if path.suffix == ".gz" else open
    samples = []
    with opener(path, "rt") as lines:
        for number, line in enumerate(lines, 1):
            if not line.strip():
                continue
            try:
                sample = json.loads(line)
            except json.JSONDecodeError as exc:
                raise SystemExit(f"{path}:{number}: not JSON ({exc.msg})") from None
            if not isinstance(sample, dict) or any(key not in sample for key in NEEDED):
                raise SystemExit(f"{path}:{number}: not a judged turn of drkernel train --log-samples (needs "
                                 f"{', '.join(NEEDED)})")
            samples.append(sample)
    return samples


def thirds(samples: list[dict], p: float, measure: str = "first") -> tuple[list[Prompt], list[Prompt]]:
    """One run's prompts of its first and its last third of steps, each trajectory judged by `measure`."""
    steps = sorted({s["step"] for s in samples})
    spans = step_thirds("", [{"step": step} for step in steps])
    if len(spans) < 3:
        raise SystemExit(f"a run with {len(steps)} steps has no thirds to compare (3 at least)")
    trajectories: dict[tuple[int, str, Any], dict[int, bool]] = {}
    for number, s in enumerate(samples):
        if measure != "first" and "sample" not in s:
            raise SystemExit(f"--measure {measure} needs each turn's `sample` (its trajectory); a turn of step "
                             f"{s['step']} has none")
        trajectory = (s["step"], s["task"], s.get("sample", number))  # first answers need no sample: one a line
        if measure != "first" or s["turn"] == 1:
            fast = bool(s.get("correct")) and (s.get("speedup") or 0.0) >= p
            trajectories.setdefault(trajectory, {})[s["turn"]] = fast
    prompts: dict[tuple[int, str], Prompt] = {}
    for (step, task, _), turns in trajectories.items():
        hit = any(turns.values()) if measure == "best" else turns[max(turns)]
        prompts.setdefault((step, task), []).append(hit)

    def span(first: int, last: int) -> list[Prompt]:
        return [hits for (step, _), hits in prompts.items() if first <= step <= last]

    return span(spans[0].first, spans[0].last), span(spans[-1].first, spans[-1].last)


def share(prompts: list[Prompt]) -> float:
    return sum(sum(hits) for hits in prompts) / sum(len(hits) for hits in prompts)


def compare(first: list[Prompt], last: list[Prompt], draws: int, seed: int) -> dict:
    rng = random.Random(seed)
    differences = sorted(share(rng.choices(last, k=len(last))) - share(rng.choices(first, k=len(first)))
                         for _ in range(draws))
    low, high = (differences[int(q * (draws - 1))] for q in ((1 - INTERVAL_LEVEL) / 2, (1 + INTERVAL_LEVEL) / 2))
    return {"prompts": [len(first), len(last)], "answers": [sum(map(len, first)), sum(map(len, last))],
            "first_third": share(first), "last_third": share(last), "difference": share(last) - share(first),
            "interval": [low, high], "level": INTERVAL_LEVEL}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("samples", nargs="+", type=Path, help="samples.jsonl(.gz) of each run")
    parser.add_argument("--measure", choices=MEASURES, default="first", help="a trajectory's first answer, its last "
                        "turn, or any of its turns (best of history)")
    parser.add_argument("--p", type=float, default=1.2, help="the speedup an answer must reach (Fast@p)")
    parser.add_argument("--draws", type=int, default=INTERVAL_DRAWS)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    pooled_first, pooled_last, runs = [], [], {}
    for path in args.samples:
        if not path.is_file():
            raise SystemExit(f"{path}: no such file (a run's samples.jsonl from drkernel train --log-samples)")
        first, last = thirds(read_samples(path), args.p, args.measure)
        runs[str(path)] = {"first_third": share(first), "last_third": share(last)}
        pooled_first += first
        pooled_last += last
    pooled = compare(pooled_first, pooled_last, args.draws, args.seed)
    json.dump({"measure": args.measure, "p": args.p, "runs": runs, "pooled": pooled}, sys.stdout, indent=1)
    print()


if __name__ == "__main__":
    main()
