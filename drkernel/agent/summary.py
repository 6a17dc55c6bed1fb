"""A run's numbers from its records: per turn correct rate, Fast@1 and Fast@1.2; last turn; best of history; and
what the run still lacks (trajectories short of their turns, model calls that failed for good)."""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Sequence
from typing import Any

from drkernel.agent.records import GenerationErrorRecord, TurnRecord, by_trajectory
from drkernel.rl.metrics import fast_p_best_of_history, fast_p_last_turn, fast_p_per_turn

FAST_P = (1.0, 1.2)


def summarize(records: Sequence[TurnRecord]) -> dict[str, Any]:
    """Metrics over the trajectories (task, sample) the records hold; a turn never reached is masked out."""
    trajectories = list(by_trajectory(records).values())
    if not trajectories:
        return {"trajectories": 0, "turns": 0}
    width = max(turn.turn for turns in trajectories for turn in turns)
    speedups = [[math.nan] * width for _ in trajectories]
    correct = [[False] * width for _ in trajectories]
    reached = [[False] * width for _ in trajectories]
    for row, turns in enumerate(trajectories):
        for turn in turns:
            index = turn.turn - 1
            reached[row][index] = True
            correct[row][index] = turn.correct
            speedup = turn.speedup
            speedups[row][index] = math.nan if speedup is None else float(speedup)
    per_turn_count = [sum(r[t] for r in reached) for t in range(width)]
    summary: dict[str, Any] = {
        "trajectories": len(trajectories),
        "tasks": len({turns[0].task for turns in trajectories}),
        "turns": width,
        "turns_judged": len(records),
        "turns_cached": sum(r.cached for r in records),  # judged by the result cache: an identical earlier answer
        "per_turn": {
            "trajectories": per_turn_count,
            "correct": [
                sum(correct[r][t] for r in range(len(trajectories))) / per_turn_count[t] if per_turn_count[t] else None
                for t in range(width)
            ],
        },
        "last_turn": {},
        "best_of_history": {},
        "statuses": dict(sorted(Counter(r.status for r in records).items())),
        "tokens": {
            "prompt": sum(r.usage.get("prompt_tokens", 0) for r in records),
            "completion": sum(r.usage.get("completion_tokens", 0) for r in records),
        },
    }
    last_correct = [row[max(t for t in range(width) if reached[i][t])] for i, row in enumerate(correct)]
    summary["last_turn"]["correct"] = sum(last_correct) / len(trajectories)
    for p in FAST_P:
        key = f"fast_{p:g}".replace(".", "_")
        summary["per_turn"][key] = [_finite(v) for v in fast_p_per_turn(speedups, correct, p, reached).tolist()]
        summary["last_turn"][key] = fast_p_last_turn(speedups, correct, p, reached)
        summary["best_of_history"][key] = fast_p_best_of_history(speedups, correct, p, reached).tolist()[-1]
    best_correct = [any(row) for row in correct]
    summary["best_of_history"]["correct"] = sum(best_correct) / len(trajectories)
    return summary


def completeness(
    records: Sequence[TurnRecord], failures: Sequence[GenerationErrorRecord], planned: Sequence[tuple[str, int]],
    turns: int,
) -> dict[str, int]:
    """What `--resume` would still ask: the `planned` trajectories (task, sample) with fewer than `turns` turns
    recorded, and the logged failed model calls whose turn is still not recorded (one per turn, however often it
    failed)."""
    recorded = Counter((r.task, r.sample) for r in records)
    turn_keys = {(r.task, r.sample, r.turn) for r in records}
    return {
        "planned_trajectories": len(planned),
        "incomplete_trajectories": sum(recorded[key] < turns for key in planned),
        "generation_errors": len({(f.task, f.sample, f.turn) for f in failures} - turn_keys),
    }


def _finite(value: float) -> float | None:
    return None if math.isnan(value) else value
