"""The report's tables: one Table type rendered as Markdown, CSV and HTML cells, and the builders of each table.

Shares are shown in percent (CSV with 12 significant digits, Markdown and HTML with one decimal); a number that does
not exist (no correct sample, a turn nobody reached, a published number not given) is empty in CSV, "-" elsewhere.
"""

from __future__ import annotations

import csv
import io
import math
from dataclasses import dataclass, field
from typing import Any

from drkernel.report.metrics import (
    CURVE_P,
    FAST_P,
    INTERVAL_LEVEL,
    PHASES,
    SPAN_KINDS,
    Difference,
    Kinds,
    LevelStats,
    Outcomes,
    PhaseMedians,
    StepSpan,
    TaskBest,
    TimingQuality,
    TurnCurves,
)
from drkernel.report.published import Published
from drkernel.report.seeds import Estimate, SeedDifference, SeedRow
from drkernel.report.runs import Turn
from drkernel.rl.kinds import PARTIAL_COVERAGE, AnswerKind

TurnKey = tuple[str, int, int]


def turn_key(turn: Turn) -> TurnKey:
    return (turn.task, turn.sample, turn.turn)


@dataclass(frozen=True)
class Link:
    text: str
    href: str


@dataclass
class Table:
    name: str  # file stem of its .md and .csv
    title: str
    columns: list[str]
    # per column: "text", "int", "float", "percent" (a share, shown x100), "interval" (two shares: "LOW to HIGH"),
    # "estimate" (a share and its interval: "VALUE (LOW to HIGH)", drkernel.report.seeds.Estimate), "speedup"
    kinds: list[str]
    rows: list[list[Any]] = field(default_factory=list)
    caption: str = ""

    def cell(self, value: Any, kind: str) -> str | Link:
        if isinstance(value, Link):
            return value
        if value is None or (isinstance(value, float) and math.isnan(value)):
            return "-"
        if kind == "percent":
            return f"{100 * value:.1f}"
        if kind == "interval":
            return f"{100 * value[0]:.1f} to {100 * value[1]:.1f}"
        if kind == "estimate":
            return _estimate_text(value, "{:.1f}")
        if kind == "speedup":
            return f"{value:.3g}x"
        if kind == "float":
            return f"{value:.3f}"
        return str(value)

    def shown(self) -> list[list[str | Link]]:
        return [[self.cell(v, k) for v, k in zip(row, self.kinds)] for row in self.rows]

    def markdown(self) -> str:
        def text(cell: str | Link) -> str:
            shown = f"[{cell.text}]({cell.href})" if isinstance(cell, Link) else cell
            return shown.replace("|", "\\|")

        lines = [f"### {self.title}", "", "| " + " | ".join(self.columns) + " |",
                 "|" + "|".join("---" if k == "text" else "---:" for k in self.kinds) + "|"]
        lines += ["| " + " | ".join(text(c) for c in row) + " |" for row in self.shown()]
        return "\n".join(lines + (["", self.caption] if self.caption else [])) + "\n"

    def csv(self) -> str:
        def raw(value: Any, kind: str) -> Any:
            if isinstance(value, Link):
                return value.href
            if value is None or (isinstance(value, float) and math.isnan(value)):
                return ""
            if kind == "interval":
                return f"{100 * value[0]:.12g} to {100 * value[1]:.12g}"
            if kind == "estimate":
                return _estimate_text(value, "{:.12g}")
            return f"{100 * value:.12g}" if kind == "percent" else value

        out = io.StringIO()
        writer = csv.writer(out, lineterminator="\n")
        writer.writerow(self.columns)
        writer.writerows([raw(v, k) for v, k in zip(row, self.kinds)] for row in self.rows)
        return out.getvalue()


def _estimate_text(estimate: Estimate, number: str) -> str:
    """A share and its interval, x100: "42.5 (30.1 to 55.0)"; the value alone without an interval."""
    shown = number.format(100 * estimate.value)
    if estimate.interval is None:
        return shown
    low, high = estimate.interval
    return f"{shown} ({number.format(100 * low)} to {number.format(100 * high)})"


def p_label(p: float) -> str:
    return f"Fast@{p:g}"


def levels_table(stats: list[LevelStats], published: list[Published]) -> Table:
    ks = sorted({k for s in stats for k in s.pass_at})
    table = Table(
        "levels", "Per level: last turn of each trajectory",
        ["run", "level", "tasks", "trajectories", "correct (%)"] + [f"{p_label(p)} (%)" for p in FAST_P]
        + ["geo-mean speedup (correct)"] + [f"pass@{k} (%)" for k in ks],
        ["text", "text", "int", "int", "percent"] + ["percent"] * len(FAST_P) + ["speedup"] + ["percent"] * len(ks),
        caption="Fast@p over all trajectories (incorrect, hacked and format errors are not fast); Fast@0 is the "
                "correct rate; pass@k only where every task of the row has at least k samples.",
    )
    for s in stats:
        table.rows.append([s.run, s.level, s.tasks, s.trajectories, s.correct] + [s.fast[p] for p in FAST_P]
                          + [s.geomean_speedup] + [s.pass_at.get(k) for k in ks])
    sources = sorted({e.source for e in published if any(e.value("level", p) is not None for p in FAST_P)})
    if sources:
        table.caption += f" Published rows, not measured here, come from: {'; '.join(sources)}."
    for entry in published:
        if any(entry.value("level", p) is not None for p in FAST_P):
            table.rows.append([entry.name, "all" if entry.level is None else str(entry.level), None, None,
                               entry.value("level", 0.0)] + [entry.value("level", p) for p in FAST_P]
                              + [None] + [None] * len(ks))
    return table


def turns_table(curves: list[TurnCurves], published: list[Published]) -> Table:
    columns, kinds = ["run", "turn", "reached", "correct (%)"], ["text", "int", "int", "percent"]
    level = f"{100 * INTERVAL_LEVEL:g}%"
    for p in CURVE_P:
        label = p_label(p)
        columns += [f"{label} of the turn (%)", f"{label} last turn (%)", f"{label} last turn, {level} interval",
                    f"{label} best of history (%)", f"{label} best of history, {level} interval"]
        kinds += ["percent", "percent", "interval", "percent", "interval"]
    table = Table("turns", "Per turn", columns, kinds,
                  caption="Of the turn: among the trajectories that reached it. Last turn: each trajectory's last "
                          "turn within a budget of t turns. Best of history: some turn <= t is correct and fast. "
                          f"The last two are over all trajectories, each with its {level} interval: a bootstrap "
                          "over tasks, each drawn with all its samples (- with fewer than two tasks).")
    for c in curves:
        for t in range(len(c.reached)):
            row: list[Any] = [c.run, t + 1, c.reached[t], c.correct[t]]
            for p in CURVE_P:
                row += [c.turn[p][t], c.last[p][t], _at(c.last_interval.get(p), t), c.best[p][t],
                        _at(c.best_interval.get(p), t)]
            table.rows.append(row)
    for entry in published:
        if any(entry.value(kind, p) is not None for kind in ("last", "best") for p in CURVE_P):
            row = [entry.name, None, None, None]
            for p in CURVE_P:
                row += [None, entry.value("last", p), None, entry.value("best", p), None]
            table.rows.append(row)
    return table


def _at(values: list[Any] | None, index: int) -> Any:
    return values[index] if values else None


def differences_table(differences: list[Difference]) -> Table:
    level = f"{100 * INTERVAL_LEVEL:g}%"
    table = Table("differences", "Against the first run, task by task",
                  ["run", "against", "measure", "tasks", "run (%)", "against (%)", "difference (points)",
                   f"{level} interval (points)", "tasks better / worse / same"],
                  ["text", "text", "text", "int", "percent", "percent", "percent", "interval", "text"],
                  caption="Over the tasks both runs hold. First turn, last turn (each trajectory's last) and best "
                          "of history (some turn correct and fast), each run over its own samples and turns; the "
                          "difference is the mean over tasks of the per-task differences, its interval a bootstrap "
                          "over tasks that draws each task for both runs at once (paired). Better / worse / same: "
                          "tasks whose share went up, down or stayed.")
    for d in differences:
        table.rows.append([d.run, d.against, f"{p_label(d.p)} {d.measure}", d.tasks, d.share, d.share_against,
                           d.difference, d.interval, f"{d.better} / {d.worse} / {d.same}"])
    return table


def phases_table(all_medians: list[PhaseMedians]) -> Table:
    shown = [name for name in PHASES if any(name in m.medians for m in all_medians)]
    table = Table("phases", "Where the time goes (median seconds)", ["run", "evaluations judged", *shown],
                  ["text", "int"] + ["float"] * len(shown),
                  caption="Medians over the turns that logged each: an evaluation's duration and phases "
                          "(`phases_s` of the results judged in the run, cached ones left out; start_latency: from "
                          "the start signal to the judge; gpu_wait: for the GPU to time alone; gate_wait: at the "
                          "GPU's gate), then the agent's: evaluation, from an answer to its verdict with the queue "
                          "(judged turns), and generation, of the turn's batch (every turn). Set against another "
                          "run's, it shows whether a slower run spent its time on the GPU or on the host.")
    for medians in all_medians:
        table.rows.append([medians.run, medians.judged, *(medians.medians.get(name) for name in shown)])
    return table


def timing_table(qualities: list[TimingQuality]) -> Table:
    table = Table("timing", "How steady the GPU timings were (evaluations)",
                  ["run", "timed on the GPU", "measured again", "candidate's median slow", "reference's median slow",
                   "candidate's calls", "slow calls", "slow, host blocked", "slow, allocating"],
                  ["text", "int", "int", "int", "int", "int", "int", "int", "int"],
                  caption="Over the evaluations judged in the run (cached ones left out) with CUDA event timings. A "
                          "side's median slow: its median timed call took more than twice its fastest, so the "
                          "speedup stands on calls that waited for something else (the host or the GPU busy); the "
                          "judge measures such an evaluation again and keeps the second measurement (measured "
                          "again also counts its wall-clock suspicions), so these count what was still slow after "
                          "it. Runs judged before that rule count their first measurements. Calls: the candidates' "
                          "timed calls in those evaluations, the slow ones (above twice their evaluation's fastest), "
                          "and those of them whose host blocked in the kernel while it enqueued them (a driver call "
                          "waiting: on a host of several GPUs, mostly for the driver's lock of the whole host; 0 in "
                          "records from before 2026-11-26, which do not say), and those during which the caching "
                          "allocator took memory from the driver (cudaMalloc, a call that takes that lock; 0 in "
                          "records older than that count, which do not say).")
    for q in qualities:
        table.rows.append([q.run, q.timed, q.measured_again, q.slow_candidate, q.slow_reference, q.calls,
                           q.slow_calls, q.slow_calls_blocked, q.slow_calls_allocating])
    return table


def training_table(spans: list[StepSpan]) -> Table:
    table = Table("training", "Training runs by thirds of their steps",
                  ["run", "steps", "reward", "Fast@1.2 first turn (%)", "Fast@1.2 last turn (%)",
                   *(f"first answers {kind} (%)" for kind in SPAN_KINDS), "coverage (%)", "policy entropy"],
                  ["text", "text", "float"] + ["percent"] * (3 + len(SPAN_KINDS)) + ["float"],
                  caption="Means over each span's steps of what the run logged per step (metrics.jsonl) on its own "
                          "prompts, which every step draws anew: the first third against the last says whether "
                          "the run moved. First answers' kinds as in the kinds table; policy entropy: the mean token "
                          "entropy (nats) of the policy over the answer tokens each step trained on, falling as it "
                          "collapses onto fewer answers (0 on a step whose loss kept no turn); - where no step logged "
                          "it.")
    for span in spans:
        table.rows.append([span.run, f"{span.first}-{span.last}", span.reward, span.fast_1_2_first_turn,
                           span.fast_1_2_last_turn, *(span.first_answer_kinds[k] for k in SPAN_KINDS),
                           span.coverage, span.policy_entropy])
    return table


def outcomes_table(all_outcomes: list[Outcomes]) -> Table:
    categories = []
    for o in all_outcomes:
        categories += [c for c in o.categories if c not in categories]
    table = Table("outcomes", "Outcomes per turn (number of trajectories)", ["run", "turn"] + categories,
                  ["text", "int"] + ["int"] * len(categories),
                  caption="A hacked turn is counted under its first hack reason.")
    for o in all_outcomes:
        for t, counts in enumerate(o.counts, 1):
            table.rows.append([o.run, t] + [counts.get(c, 0) for c in categories])
    return table


def kinds_table(all_kinds: list[Kinds]) -> Table:
    columns = [kind.value for kind in AnswerKind]
    table = Table("kinds", "Answers per turn by kind (number of trajectories)",
                  ["run", "turn"] + columns + ["distinct answers", "tasks answered alike"],
                  ["text", "int"] + ["int"] * (len(columns) + 2),
                  caption=f"Lazy: hacked as lazy_kernel. Partial: correct, own kernels under {PARTIAL_COVERAGE:g} of "
                          "the GPU time. Unfused / fused: correct and covering, several own kernels / one. "
                          "Unmeasured: correct, coverage (no GPU) or own kernels not recorded. Failed: anything else. "
                          "Distinct answers: different codes among the turn's answers (trailing spaces and blank "
                          "lines aside); tasks answered alike: tasks of two samples or more whose samples all gave "
                          "one code at the turn. A policy collapsed onto one answer a task has few distinct answers "
                          "and many tasks answered alike.")
    for k in all_kinds:
        for t, counts in enumerate(k.counts, 1):
            table.rows.append([k.run, t] + [counts.get(c, 0) for c in columns] + [k.distinct[t - 1], k.alike[t - 1]])
    return table


def seeds_table(rows: list[SeedRow]) -> Table:
    turns = max(len(row.turns) for row in rows)
    level = f"{100 * INTERVAL_LEVEL:g}%"
    table = Table("seeds", f"Per method over its seeds, with {level} intervals over seeds and tasks",
                  ["method", "seeds", "tasks", "measure", *(f"turn {t}" for t in range(1, turns + 1)),
                   "best of history"], ["text", "text", "int", "text"] + ["estimate"] * (turns + 1),
                  caption="Runs named METHOD-sN are seed N of METHOD. Turn t: each trajectory's last turn within t "
                          "turns (turn 1: first answers); best of history: some turn correct and fast. The value is "
                          "the mean over seeds of the mean over tasks; the interval a hierarchical bootstrap that "
                          "draws the method's seeds with replacement, then tasks with replacement (each with all its "
                          "samples). With one seed it is the bootstrap over tasks. Distinct answers: per task, "
                          "different codes at turn t over the samples (1: all differ; 1/samples: all alike).")
    for row in rows:
        table.rows.append([row.method, ", ".join(row.seeds), row.tasks, row.measure, *row.turns, row.best])
    return table


def seed_differences_table(differences: list[SeedDifference]) -> Table:
    turns = max(len(d.turns) for d in differences)
    level = f"{100 * INTERVAL_LEVEL:g}%"
    table = Table("seed_differences", f"Methods against each other, with {level} intervals over seeds and tasks",
                  ["method", "against", "paired by", "measure", *(f"turn {t}" for t in range(1, turns + 1)),
                   "best of history", f"last turn: {level} interval excludes 0"],
                  ["text", "text", "text", "text"] + ["estimate"] * (turns + 1) + ["text"],
                  caption="Points (method minus against) and the hierarchical bootstrap's interval of the difference: "
                          "every draw takes one set of tasks for both methods (paired by task) and, where both ran "
                          "the same seeds, one set of seeds (paired by seed: seed s of each method starts from the "
                          "same SFT policy). A claim that one method beats another needs the interval to exclude 0.")
    for d in differences:
        last = d.turns[-1]
        excludes = "-" if last is None or last.interval is None else (
            "yes, above" if last.interval[0] > 0 else "yes, below" if last.interval[1] < 0 else "no")
        table.rows.append([d.method, d.against, "tasks and seeds" if d.paired_by_seed else "tasks", d.measure,
                           *d.turns, d.best, excludes])
    return table


def tasks_table(runs: list[str], bests: list[dict[str, TaskBest]], code_paths: list[dict[TurnKey, str]]) -> Table:
    """One row per task; per run its best speedup, the sample/turn that reached it and links to the code of the
    best and the worst turn (`code_paths`, per run: (task, sample, turn) -> relative path of the code's file)."""
    columns, kinds = ["task", "level"], ["text", "text"]
    for run in runs:
        columns += [f"{run}: best speedup", f"{run}: reached at", f"{run}: best code", f"{run}: worst code"]
        kinds += ["speedup", "text", "text", "text"]
    table = Table("tasks", "Per task", columns, kinds,
                  caption="Best: the correct turn with the highest speedup. Worst: the turn with code and the lowest "
                          "reward. 'reached at' is sample/turn (0-based sample, 1-based turn).")
    tasks: dict[str, int | None] = {}
    for b in bests:
        tasks.update({task: best.level for task, best in b.items() if task not in tasks})
    for task, level in tasks.items():
        row: list[Any] = [task, "unknown" if level is None else str(level)]
        for b, paths in zip(bests, code_paths):
            entry = b.get(task)
            best = entry.best if entry else None
            worst = entry.worst if entry else None
            row += [best.speedup if best else None, f"s{best.sample}/t{best.turn}" if best else None,
                    _code_link(paths, best), _code_link(paths, worst)]
        table.rows.append(row)
    return table


def _code_link(paths: dict[TurnKey, str], turn: Turn | None) -> Link | None:
    path = paths.get(turn_key(turn)) if turn else None
    return Link("code", path) if path else None
