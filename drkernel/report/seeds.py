"""Intervals over seeds and tasks: the hierarchical bootstrap of methods run with several seeds.

A bench run named `METHOD-sN` is seed N of METHOD (the miniature's replicates); any other bench run is a method of
one seed. Each draw takes, per method, its seeds with replacement, and tasks with replacement, one task draw for every
method, so a difference between two methods stays paired by task; methods run with the same seeds also share the
seed draw (seed s of every method starts from the same SFT policy in the study's design), so their difference is
paired by seed too. A method's value in a draw is the mean over its drawn seeds of the task-weighted mean of the
per-task shares; with one seed it is exactly the task bootstrap of `task_intervals` (docs/report.md).
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch

from drkernel.report.metrics import INTERVAL_DRAWS, INTERVAL_LEVEL, Interval, Trajectories, answer_text
from drkernel.rl.metrics import best_of_history_fast, last_turn_fast

SEED_NAME = re.compile(r"(?P<method>.+)-s(?P<seed>\d+)")
ONE_SEED = "-"  # the seed label of a run not named METHOD-sN
MEASURES = ("correct", "Fast@1", "Fast@1.2", "distinct answers")  # the rows of each method
FAST_P = {"correct": 0.0, "Fast@1": 1.0, "Fast@1.2": 1.2}  # p = 0 is the correct rate (drkernel.rl.metrics)


def method_and_seed(name: str) -> tuple[str, str]:
    """`recipe-s2` -> ("recipe", "2"); a name without a seed is a method of one run."""
    match = SEED_NAME.fullmatch(name)
    return (match["method"], match["seed"]) if match else (name, ONE_SEED)


def has_seeds(names: Sequence[str]) -> bool:
    """Whether some method among the named runs has two seeds or more: only then do the seed tables say more."""
    methods = [method_and_seed(name) for name in names]
    return any(sum(m == method for m, _ in methods) > 1 for method, seed in methods if seed != ONE_SEED)


@dataclass(frozen=True)
class Estimate:
    """A value (a share) and its INTERVAL_LEVEL interval; None where the bootstrap has nothing to draw."""

    value: float
    interval: Interval | None


@dataclass(frozen=True)
class SeedRow:
    """One measure of one method over its seeds: per turn t (each trajectory's last turn within t turns; for
    distinct answers, the answers of turn t) and in best of history."""

    method: str
    seeds: tuple[str, ...]
    tasks: int
    measure: str
    turns: list[Estimate | None]
    best: Estimate | None


@dataclass(frozen=True)
class SeedDifference:
    """`method` minus `against` on one measure, paired by task and, where both ran the same seeds, by seed."""

    method: str
    against: str
    paired_by_seed: bool
    measure: str
    turns: list[Estimate | None]
    best: Estimate | None


def _hits(traj: Trajectories, measure: str, turns: int) -> torch.Tensor:
    """[N, turns + 1] per trajectory: the measure at each turn and in best of history (NaN where it has none)."""
    if measure == "distinct answers":
        raise ValueError("distinct answers are per task, not per trajectory")
    p = FAST_P[measure]
    last = last_turn_fast(traj.speedup, traj.correct, p, traj.reached)[:, :turns]
    best = best_of_history_fast(traj.speedup, traj.correct, p, traj.reached)[:, turns - 1:turns]
    return torch.cat([last, best], dim=1).double()


def _distinct(traj: Trajectories, tasks: list[str], turns: int) -> torch.Tensor:
    """[tasks, turns + 1]: per task, distinct answers at turn t over the samples that reached it (1: every sample
    answered differently; 1/samples: all alike); NaN for best of history and where no sample reached t."""
    values = torch.full((len(tasks), turns + 1), math.nan, dtype=torch.float64)
    position = {task: i for i, task in enumerate(tasks)}
    for t in range(turns):
        answers: dict[str, list[str | None]] = {}
        for (task, _), row in zip(traj.keys, traj.cells):
            if task in position and row[t] is not None:
                answers.setdefault(task, []).append(answer_text(row[t].code))
        for task, texts in answers.items():
            values[position[task], t] = len({text for text in texts if text is not None}) / len(texts)
    return values


def task_values(traj: Trajectories, tasks: list[str], measure: str, turns: int) -> torch.Tensor:
    """[tasks, turns + 1]: the per-task share of the measure (over the task's samples) at each turn and in best of
    history."""
    if measure == "distinct answers":
        return _distinct(traj, tasks, turns)
    hits = _hits(traj, measure, turns)
    position = {task: i for i, task in enumerate(tasks)}
    rows = [i for i, (task, _) in enumerate(traj.keys) if task in position]
    index = torch.tensor([position[traj.keys[i][0]] for i in rows], dtype=torch.long)
    sums = torch.zeros(len(tasks), turns + 1, dtype=torch.float64).index_add_(0, index, hits[rows])
    return sums / torch.bincount(index, minlength=len(tasks)).double().unsqueeze(1)


def _task_weights(tasks: int, draws: int, seed: int) -> torch.Tensor:
    """[draws, tasks]: how often each draw takes each task (the same stream as `task_intervals`)."""
    picks = torch.randint(tasks, (draws, tasks), generator=torch.Generator().manual_seed(seed))
    return torch.zeros(draws, tasks, dtype=torch.float64).scatter_add_(
        1, picks, torch.ones(draws, tasks, dtype=torch.float64))


def _seed_weights(seeds: int, draws: int, generator_seed: int) -> torch.Tensor:
    """[draws, seeds]: how often each draw takes each seed, over the number of seeds."""
    if seeds == 1:
        return torch.ones(draws, 1, dtype=torch.float64)
    picks = torch.randint(seeds, (draws, seeds), generator=torch.Generator().manual_seed(generator_seed))
    counts = torch.zeros(draws, seeds, dtype=torch.float64).scatter_add_(
        1, picks, torch.ones(draws, seeds, dtype=torch.float64))
    return counts / seeds


def bootstrap_draws(values: dict[str, tuple[tuple[str, ...], torch.Tensor]], draws: int = INTERVAL_DRAWS,
                    seed: int = 0) -> dict[str, torch.Tensor]:
    """Per method (its seed labels, its values [seeds, tasks, columns]): its value in each draw, [draws, columns].
    One task draw for all methods; one seed draw for all methods with the same seed labels."""
    shapes = {tensor.shape[1] for _, tensor in values.values()}
    if len(shapes) != 1:
        raise ValueError(f"the methods hold different numbers of tasks: {sorted(shapes)}")
    weights = _task_weights(shapes.pop(), draws, seed)
    label_sets = sorted({labels for labels, _ in values.values()})
    seed_weights = {labels: _seed_weights(len(labels), draws, seed + 1 + i) for i, labels in enumerate(label_sets)}
    drawn = {}
    for method, (labels, tensor) in values.items():
        per_seed = torch.einsum("bk,skc->bsc", weights, tensor) / weights.sum(1)[:, None, None]
        drawn[method] = torch.einsum("bs,bsc->bc", seed_weights[labels], per_seed)
    return drawn


def _estimates(point: torch.Tensor, drawn: torch.Tensor, level: float, tasks: int) -> list[Estimate | None]:
    """Per column: the point value and the percentile interval of the draws; None where a value is NaN."""
    ends = torch.quantile(drawn, torch.tensor([(1 - level) / 2, (1 + level) / 2], dtype=torch.float64), dim=0)
    out: list[Estimate | None] = []
    for c, value in enumerate(point.tolist()):
        if math.isnan(value) or bool(drawn[:, c].isnan().any()):
            out.append(None)
        else:
            out.append(Estimate(value, (ends[0, c].item(), ends[1, c].item()) if tasks >= 2 else None))
    return out


@dataclass(frozen=True)
class SeedAnalysis:
    rows: list[SeedRow]
    differences: list[SeedDifference]
    notes: list[str]


def seed_analysis(runs: Sequence[tuple[str, Trajectories]], level: float = INTERVAL_LEVEL,
                  draws: int = INTERVAL_DRAWS, seed: int = 0,
                  pairs: Callable[[list[str]], list[tuple[str, str]]] | None = None) -> SeedAnalysis:
    """Every method (runs grouped by `method_and_seed`, in the order they come) on every measure, and every pair
    of methods (`pairs`: (method, against); by default each method against every one before it), over the tasks
    all runs hold and the turns all runs have."""
    groups: dict[str, dict[str, Trajectories]] = {}
    for name, traj in runs:
        method, label = method_and_seed(name)
        groups.setdefault(method, {})[label] = traj
    tasks = sorted(set.intersection(*({task for task, _ in traj.keys} for _, traj in runs))) if runs else []
    turns = min((len(traj.cells[0]) for _, traj in runs if traj.cells), default=0)
    if len(tasks) < 2 or turns < 1:
        return SeedAnalysis([], [], [f"seed intervals: the runs share {len(tasks)} task(s); they need two"])
    notes = []
    if any(len({task for task, _ in traj.keys}) != len(tasks) for _, traj in runs):
        notes.append(f"seed intervals over the {len(tasks)} tasks every run holds")
    methods = list(groups)
    labels = {m: tuple(sorted(groups[m], key=lambda s: (len(s), s))) for m in methods}
    rows, differences = [], []
    wanted = pairs(methods) if pairs else [(m, a) for i, m in enumerate(methods) for a in methods[:i]]
    for measure in MEASURES:
        values = {m: (labels[m], torch.stack([task_values(groups[m][s], tasks, measure, turns) for s in labels[m]]))
                  for m in methods}
        drawn = bootstrap_draws(values, draws, seed)
        points = {m: values[m][1].mean(1).mean(0) for m in methods}
        for m in methods:
            *per_turn, best = _estimates(points[m], drawn[m], level, len(tasks))
            rows.append(SeedRow(m, labels[m], len(tasks), measure, per_turn, best))
        for m, against in wanted:
            *per_turn, best = _estimates(points[m] - points[against], drawn[m] - drawn[against], level, len(tasks))
            differences.append(SeedDifference(m, against, labels[m] == labels[against] and len(labels[m]) > 1,
                                              measure, per_turn, best))
    return SeedAnalysis(rows, differences, notes)
