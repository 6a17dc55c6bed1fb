"""The numbers of a report, computed from a run's turns with drkernel.rl's metrics (definitions: docs/report.md).

A trajectory is one (task, sample) pair; its turns form one row of [N, T] arrays. The level table judges each
trajectory by its last recorded turn, over ALL trajectories: an incorrect, hacked or unparsable answer is simply not
fast. Levels come from the records (None is "unknown").
"""

from __future__ import annotations

import math
import statistics
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

import torch

from drkernel.agent.records import FORMAT_ERROR
from drkernel.report.runs import Turn
from drkernel.rl.metrics import (
    best_of_history_fast,
    fast_p,
    fast_p_per_turn,
    geometric_mean_speedup,
    last_turn_fast,
    pass_at_k,
)
from drkernel.schema import EvalOptions, Status

FAST_P = (0.0, 1.0, 1.2, 1.5, 2.0)  # the level table's thresholds
CURVE_P = (1.0, 1.2)  # the per-turn curves' thresholds
INTERVAL_LEVEL = 0.95
INTERVAL_DRAWS = 2000  # bootstrap draws: the interval's ends move by well under a point from seed to seed
OUTCOME_ORDER = (*(status.value for status in Status if status is not Status.HACKED), FORMAT_ERROR)


@dataclass
class Trajectories:
    """A run's (non-empty) turns as [N, T] arrays, one row per (task, sample), sorted by (level, task, sample)."""

    keys: list[tuple[str, int]]
    levels: list[int | None]
    cells: list[list[Turn | None]]  # [N][T]
    speedup: torch.Tensor  # float64 [N, T], NaN where not measured or not reached
    correct: torch.Tensor  # bool [N, T]
    reached: torch.Tensor  # bool [N, T]: the turn is recorded

    @classmethod
    def of(cls, turns: list[Turn]) -> Trajectories:
        levels_of = {t.task: t.level for t in turns}
        keys = sorted({(t.task, t.sample) for t in turns}, key=lambda k: (_level_order(levels_of[k[0]]), k))
        index = {key: i for i, key in enumerate(keys)}
        width = max((t.turn for t in turns), default=0)
        cells: list[list[Turn | None]] = [[None] * width for _ in keys]
        for t in turns:
            cells[index[(t.task, t.sample)]][t.turn - 1] = t
        speedup = torch.tensor([[c.speedup if c else math.nan for c in row] for row in cells], dtype=torch.float64)
        correct = torch.tensor([[bool(c and c.correct) for c in row] for row in cells], dtype=torch.bool)
        reached = torch.tensor([[c is not None for c in row] for row in cells], dtype=torch.bool)
        levels = [next(c.level for c in row if c) for row in cells]
        return cls(keys, levels, cells, speedup, correct, reached)

    def last(self) -> list[Turn]:
        """Each trajectory's last recorded turn."""
        return [[c for c in row if c][-1] for row in self.cells]


def _level_order(level: int | None) -> tuple[int, int]:
    return (1, 0) if level is None else (0, level)


def level_name(level: int | None) -> str:
    return "unknown" if level is None else str(level)


@dataclass(frozen=True)
class LevelStats:
    run: str
    level: str  # "1", "2", ..., "unknown", or "all"
    tasks: int
    trajectories: int
    correct: float
    fast: dict[float, float]  # p -> Fast@p of the last turns
    geomean_speedup: float  # of the correct last turns; NaN when none
    pass_at: dict[int, float]  # k -> mean over tasks of unbiased pass@k of the last turns


def level_stats(run: str, traj: Trajectories) -> list[LevelStats]:
    """One row per level (in order, "unknown" last) and one for all levels."""
    last = traj.last()
    groups: dict[str, list[int]] = {}
    for i, level in enumerate(traj.levels):
        groups.setdefault(level_name(level), []).append(i)
    if len(groups) > 1:
        groups["all"] = list(range(len(last)))
    rows = []
    for name, members in groups.items():
        chosen = [last[i] for i in members]
        speedups = [t.speedup for t in chosen]
        correct = [t.correct for t in chosen]
        per_task = Counter(t.task for t in chosen)
        solved = Counter(t.task for t in chosen if t.correct)
        n = torch.tensor([per_task[task] for task in per_task])
        c = torch.tensor([solved[task] for task in per_task])
        ks = pass_ks(int(n.min()))
        rows.append(LevelStats(
            run=run, level=name, tasks=len(per_task), trajectories=len(chosen),
            correct=sum(correct) / len(chosen),
            fast={p: fast_p(speedups, correct, p) for p in FAST_P},
            geomean_speedup=geometric_mean_speedup(speedups, correct),
            pass_at={k: pass_at_k(n, c, k).mean().item() for k in ks},
        ))
    return rows


def pass_ks(samples: int) -> list[int]:
    """The k of pass@k that every task's sample count allows: 1, 2, 4, ... and the count itself."""
    return sorted({2**i for i in range(samples.bit_length())} | {samples})


Interval = tuple[float, float]


@dataclass(frozen=True)
class TurnCurves:
    """Per turn t = 1..T: Fast@p of turn t among the trajectories that reached it, of the last turn with a budget
    of t turns (over all trajectories), and best of history up to t (over all trajectories); the last two with their
    INTERVAL_LEVEL intervals over tasks (`task_intervals`; None with fewer than two tasks)."""

    run: str
    reached: list[int]
    correct: list[float]  # correct rate of turn t among the trajectories that reached it
    turn: dict[float, list[float]]
    last: dict[float, list[float]]
    best: dict[float, list[float]]
    last_interval: dict[float, list[Interval | None]] = field(default_factory=dict)
    best_interval: dict[float, list[Interval | None]] = field(default_factory=dict)


def turn_curves(run: str, traj: Trajectories) -> TurnCurves:
    s, ok, reached = traj.speedup, traj.correct, traj.reached
    tasks = [task for task, _ in traj.keys]
    last = {p: last_turn_fast(s, ok, p, reached) for p in CURVE_P}
    best = {p: best_of_history_fast(s, ok, p, reached) for p in CURVE_P}
    return TurnCurves(
        run=run,
        reached=reached.sum(0).tolist(),
        correct=((ok & reached).sum(0).double() / reached.sum(0).double()).tolist(),
        turn={p: fast_p_per_turn(s, ok, p, reached).tolist() for p in CURVE_P},
        last={p: hits.double().mean(0).tolist() for p, hits in last.items()},
        best={p: hits.double().mean(0).tolist() for p, hits in best.items()},
        last_interval={p: task_intervals(hits, tasks) for p, hits in last.items()},
        best_interval={p: task_intervals(hits, tasks) for p, hits in best.items()},
    )


def task_intervals(hits: torch.Tensor, tasks: list[str], level: float = INTERVAL_LEVEL,
                   draws: int = INTERVAL_DRAWS, seed: int = 0) -> list[Interval | None]:
    """Per column of `hits` [N, T] (one row per trajectory, `tasks[i]` its task): the percentile bootstrap interval of
    the column's mean, drawing tasks with replacement, each with all its samples. So the interval holds both what the
    samples of a task vary by and which tasks a benchmark of this size happens to hold; seeded, so a report is the
    same every time it is built. None for every column with fewer than two tasks."""
    names = sorted(set(tasks))
    if len(names) < 2:
        return [None] * hits.shape[1]
    sums, counts = _task_totals(hits, tasks, names)
    picks = torch.randint(len(names), (draws, len(names)), generator=torch.Generator().manual_seed(seed))
    weights = torch.zeros(draws, len(names), dtype=torch.float64).scatter_add_(
        1, picks, torch.ones(draws, len(names), dtype=torch.float64))
    means = (weights @ sums) / (weights @ counts).unsqueeze(1)
    ends = torch.quantile(means, torch.tensor([(1 - level) / 2, (1 + level) / 2], dtype=torch.float64), dim=0)
    return [(lo, hi) for lo, hi in zip(ends[0].tolist(), ends[1].tolist())]


@dataclass(frozen=True)
class Difference:
    """One measure of a run against the report's first run, over the tasks both hold: shares over each run's own
    trajectories, the difference of the per-task means, its INTERVAL_LEVEL interval (bootstrap over the shared
    tasks, paired: a draw takes a task for both runs) and how many tasks went up, down or stayed."""

    run: str
    against: str
    p: float
    measure: str  # "first turn", "last turn", "best of history"
    tasks: int
    share: float
    share_against: float
    difference: float
    interval: Interval | None
    better: int
    worse: int
    same: int


DIFFERENCE_MEASURES = ("first turn", "last turn", "best of history")


def paired_differences(run: str, traj: Trajectories, against: str, base: Trajectories) -> list[Difference]:
    """Each measure of DIFFERENCE_MEASURES at each CURVE_P, `run` against `against`; none with fewer than two
    shared tasks (nothing to pair)."""
    shared = sorted({task for task, _ in traj.keys} & {task for task, _ in base.keys})
    if len(shared) < 2:
        return []
    rows = []
    for p in CURVE_P:
        mine, theirs = _task_means(traj, p, shared), _task_means(base, p, shared)
        for measure in DIFFERENCE_MEASURES:
            change = mine[measure] - theirs[measure]
            (interval,) = task_intervals(change.unsqueeze(1), shared)
            rows.append(Difference(
                run=run, against=against, p=p, measure=measure, tasks=len(shared),
                share=mine[measure].mean().item(), share_against=theirs[measure].mean().item(),
                difference=change.mean().item(), interval=interval, better=int((change > 0).sum()),
                worse=int((change < 0).sum()), same=int((change == 0).sum())))
    return rows


def _task_means(traj: Trajectories, p: float, tasks: list[str]) -> dict[str, torch.Tensor]:
    """Per measure, [len(tasks)]: the share of each task's trajectories that are fast at p."""
    last = last_turn_fast(traj.speedup, traj.correct, p, traj.reached)
    best = best_of_history_fast(traj.speedup, traj.correct, p, traj.reached)
    hits = torch.stack([last[:, 0], last[:, -1], best[:, -1]], dim=1)  # in DIFFERENCE_MEASURES' order
    wanted = set(tasks)
    rows = [i for i, (task, _) in enumerate(traj.keys) if task in wanted]
    sums, counts = _task_totals(hits[rows], [traj.keys[i][0] for i in rows], tasks)
    return dict(zip(DIFFERENCE_MEASURES, (sums / counts.unsqueeze(1)).T))


def _task_totals(hits: torch.Tensor, tasks: list[str], names: list[str]) -> tuple[torch.Tensor, torch.Tensor]:
    """Per task of `names`: its trajectories' rows of `hits` summed ([len(names), T]) and how many there are."""
    position = {name: i for i, name in enumerate(names)}
    index = torch.tensor([position[task] for task in tasks], dtype=torch.long)
    sums = torch.zeros(len(names), hits.shape[1], dtype=torch.float64).index_add_(0, index, hits.double())
    return sums, torch.bincount(index, minlength=len(names)).double()


def outcome(turn: Turn) -> str:
    """The turn's outcome category: its status, with hacked split by its first hack reason."""
    if turn.status == Status.HACKED:
        return f"hacked: {turn.hack_reasons[0] if turn.hack_reasons else 'no reason given'}"
    return turn.status


@dataclass(frozen=True)
class Outcomes:
    run: str
    categories: list[str]  # every category seen, in a fixed order (hacked ones by reason, last)
    counts: list[dict[str, int]]  # per turn: category -> number of trajectories


def outcomes(run: str, traj: Trajectories) -> Outcomes:
    counts = [Counter(outcome(c) for c in column if c) for column in zip(*traj.cells)]
    seen = set().union(*counts) if counts else set()
    order = [c for c in OUTCOME_ORDER if c in seen]
    order += sorted(c for c in seen if c not in OUTCOME_ORDER and not c.startswith("hacked"))
    order += sorted(c for c in seen if c.startswith("hacked"))
    return Outcomes(run, order, [dict(c) for c in counts])


@dataclass(frozen=True)
class Kinds:
    run: str
    counts: list[dict[str, int]]  # per turn: answer kind -> number of trajectories
    distinct: list[int] = field(default_factory=list)  # per turn: different codes among the answers
    alike: list[int] = field(default_factory=list)  # per turn: tasks of 2+ samples whose answers are all one code


def answer_text(code: str | None) -> str | None:
    """An answer's code with trailing spaces and blank lines left out: two answers differing only there are one."""
    if code is None:
        return None
    return "\n".join(line.rstrip() for line in code.splitlines() if line.strip())


def answer_kinds(run: str, traj: Trajectories) -> Kinds:
    """Per turn, how many answers were lazy, partial, unfused, fused (drkernel.rl.kinds), unmeasured or failed, how
    many were different code, and on how many tasks every sample gave one answer (a policy's collapse)."""
    distinct, alike = [], []
    for column in zip(*traj.cells):
        texts = [answer_text(c.code) for c in column if c]
        distinct.append(len({text for text in texts if text is not None}))
        by_task: dict[str, list[str | None]] = {}
        for c in column:
            if c:
                by_task.setdefault(c.task, []).append(answer_text(c.code))
        alike.append(sum(len(answers) > 1 and None not in answers and len(set(answers)) == 1
                         for answers in by_task.values()))
    return Kinds(run, [dict(Counter(c.kind for c in column if c)) for column in zip(*traj.cells)], distinct, alike)


@dataclass(frozen=True)
class TaskBest:
    task: str
    level: int | None
    best: Turn | None  # the correct turn with the highest speedup (earliest on ties); None when none is correct
    worst: Turn | None  # the turn with code and the lowest reward (earliest on ties)


def task_bests(traj: Trajectories) -> dict[str, TaskBest]:
    by_task: dict[str, list[Turn]] = {}
    for row in traj.cells:
        for cell in row:
            if cell:
                by_task.setdefault(cell.task, []).append(cell)
    result = {}
    for task, turns in by_task.items():
        turns.sort(key=lambda t: (t.sample, t.turn))
        correct = [t for t in turns if t.correct]
        best = max(correct, key=lambda t: -math.inf if math.isnan(t.speedup) else t.speedup, default=None)
        worst = min((t for t in turns if t.code is not None), key=lambda t: t.reward, default=None)
        result[task] = TaskBest(task, turns[0].level, best, worst)
    return result


def lazy_threshold(config: dict[str, Any]) -> float:
    """The coverage below which a correct kernel is lazy: the run's min_coverage option, else the default."""
    stack: list[Any] = [config]
    while stack:
        item = stack.pop()
        if isinstance(item, dict):
            if isinstance(item.get("min_coverage"), (int, float)):
                return float(item["min_coverage"])
            stack.extend(item.values())
    return EvalOptions().min_coverage


@dataclass
class StepSpan:
    """A training run's steps `first`-`last`: the means over them of what each step logged (None where no step of
    the span logged it). A run's thirds set its start against its end (the miniature's lift is read this way)."""

    run: str
    first: int
    last: int
    reward: float | None
    fast_1_2_first_turn: float | None
    fast_1_2_last_turn: float | None
    coverage: float | None
    first_answer_kinds: dict[str, float | None]  # share of each answer kind among first answers
    policy_entropy: float | None = None  # the policy's mean token entropy over the answers it trained on


SPAN_KINDS = ("fused", "lazy", "partial", "failed")  # the first answers' kinds the training table shows


def step_thirds(run: str, steps: list[dict[str, Any]]) -> list[StepSpan]:
    """The run's steps cut into three spans as equal as they go (10 steps: 1-3, 4-7, 8-10); fewer spans when there
    are fewer than three steps."""
    cuts = sorted({round(len(steps) * i / 3) for i in range(4)})
    return [_span(run, steps[a:b]) for a, b in zip(cuts, cuts[1:]) if b > a]


def _span(run: str, steps: list[dict[str, Any]]) -> StepSpan:
    def mean(pick: Any) -> float | None:
        values = []
        for step in steps:
            try:
                value = pick(step)
            except (KeyError, IndexError, TypeError):
                continue
            if isinstance(value, (int, float)) and math.isfinite(value):
                values.append(float(value))
        return sum(values) / len(values) if values else None

    return StepSpan(run, steps[0]["step"], steps[-1]["step"], mean(lambda s: s["reward_mean"]),
                    mean(lambda s: s["turn_fast_1_2"][0]), mean(lambda s: s["turn_fast_1_2"][-1]),
                    mean(lambda s: s["coverage_mean"]),
                    {kind: mean(lambda s, kind=kind: s["turn_kind_shares"][0][kind]) for kind in SPAN_KINDS},
                    mean(lambda s: s["policy_entropy"]))


# the phases the report shows, in the order an evaluation runs them (drkernel.sandbox.judge.judge_request; the sandbox's
# start latency and the GPU's gate waits beside), then the agent's side
PHASES = ("duration", "start_latency", "reference", "load", "correctness", "gpu_wait", "timing", "profile",
          "ablation", "gate_wait", "evaluation", "generation")


@dataclass(frozen=True)
class TimingQuality:
    """A run's GPU-timed evaluations (judged in it, not cached): how many the judge measured twice, how many had
    a side's median timed call slow (above twice its fastest: it waited for something else), and the
    candidates' timed calls, slow, blocked and allocating, summed over them."""

    run: str
    timed: int
    measured_again: int
    slow_candidate: int
    slow_reference: int
    calls: int = 0  # the candidates' timed calls (of the measurement kept)
    slow_calls: int = 0  # the slow ones among them
    slow_calls_blocked: int = 0  # of those, the ones whose host blocked in the kernel while enqueueing them
    slow_calls_allocating: int = 0  # of those, the ones during which the allocator took memory from the driver


def timing_quality(run: str, turns: list[Turn]) -> TimingQuality:
    timed = [turn for turn in turns if turn.measurements]
    return TimingQuality(run, len(timed), sum(turn.measurements > 1 for turn in timed),
                         sum("candidate" in turn.slow_medians for turn in timed),
                         sum("reference" in turn.slow_medians for turn in timed),
                         sum(turn.calls for turn in timed), sum(turn.slow_calls for turn in timed),
                         sum(turn.slow_calls_blocked for turn in timed),
                         sum(turn.slow_calls_allocating for turn in timed))


@dataclass
class PhaseMedians:
    """A run's median seconds per phase over its turns that logged it; `judged`: evaluations run, not cached."""

    run: str
    judged: int
    medians: dict[str, float]


def phase_medians(run: str, turns: list[Turn]) -> PhaseMedians:
    seen: dict[str, list[float]] = {}
    for turn in turns:
        for name, value in turn.seconds:
            seen.setdefault(name, []).append(value)
    return PhaseMedians(run, sum(1 for turn in turns if any(name != "generation" for name, _ in turn.seconds)),
                        {name: statistics.median(values) for name, values in seen.items() if name in PHASES})
