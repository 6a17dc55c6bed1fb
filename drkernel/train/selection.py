"""Model selection of an RL run on its validation split: of the policies its validations saved
(validation/step_N/policy), the one whose validation had the best Fast@1.2 on the last turn, the later step on a
tie; a run that never validated is its final policy. The test split then sees one policy a run, chosen without
it (docs/miniature.md, the study's protocol). Standard library only."""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path

METRICS = "metrics.jsonl"
VALIDATION = "validation"
VALIDATED_POLICY = "policy"  # validation/step_N/policy: the policy that step validated
FINAL = "final"
SELECTED_BY = "fast_1_2"  # the validation entry's Fast@1.2 of each trajectory's last turn


class SelectionError(ValueError):
    """A run with neither a validated policy nor a final one."""


@dataclass(frozen=True)
class Selection:
    run: Path
    policy: Path
    step: int | None  # None: the final policy of a run without validated policies
    score: float | None  # its validation's Fast@1.2 on the last turn
    validations: dict[int, float] = field(default_factory=dict)  # step -> Fast@1.2 on the last turn, every one saved


def validation_scores(run: str | Path) -> dict[int, float]:
    """Step -> validation Fast@1.2 on the last turn, of the steps whose validated policy is on disk (the last line
    of a step wins: a resumed run logs a step again)."""
    folder = Path(run)
    scores: dict[int, float] = {}
    path = folder / METRICS
    lines = path.read_text().splitlines() if path.is_file() else []
    for line in lines:
        try:
            row = json.loads(line)
        except ValueError:  # a last line still being written
            continue
        validation = row.get("validation") if isinstance(row, dict) else None
        score = validation.get(SELECTED_BY) if isinstance(validation, dict) else None
        step = row.get("step")
        if isinstance(step, int) and isinstance(score, (int, float)) and math.isfinite(score) \
                and (folder / VALIDATION / f"step_{step}" / VALIDATED_POLICY).is_dir():
            scores[step] = float(score)
    return scores


def select_policy(run: str | Path) -> Selection:
    """The run's policy: the validated one with the best score (the later step on a tie), else final/."""
    folder = Path(run)
    scores = validation_scores(folder)
    if scores:
        step = max(scores, key=lambda s: (scores[s], s))
        return Selection(folder, folder / VALIDATION / f"step_{step}" / VALIDATED_POLICY, step, scores[step], scores)
    if (folder / FINAL).is_dir():
        return Selection(folder, folder / FINAL, None, None)
    raise SelectionError(f"{folder}: no validated policy (validation/step_N/{VALIDATED_POLICY}) and no {FINAL}/")
