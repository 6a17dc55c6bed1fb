"""The report's figures as PNG files, drawn with matplotlib's object API (Figure + Agg canvas, no pyplot state and
no display), so reports can be made on a headless machine, from several threads, while runs are still going.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from drkernel.report.metrics import CURVE_P, LevelStats, Outcomes, TurnCurves
from drkernel.report.published import NOT_MEASURED, Published
from drkernel.report.tables import p_label
from drkernel.tasks.loaders import require

DPI = 110
OUTCOME_COLORS = {
    "correct": "#2ca02c", "incorrect": "#ff7f0e", "compile_error": "#8c564b", "runtime_error": "#bcbd22",
    "timeout": "#7f7f7f", "crashed": "#17becf", "invalid": "#c7c7c7", "format_error": "#1f77b4",
}
HACKED_COLORS = ("#d62728", "#9467bd", "#e377c2", "#ff9896", "#c5b0d5", "#f7b6d2", "#8b0000", "#4b0082")


def _figure(width: float, height: float) -> Any:
    require("matplotlib", "report", "drawing the report's figures")
    from matplotlib.figure import Figure

    return Figure(figsize=(width, height), dpi=DPI, layout="constrained")


def _plain() -> Any:
    """Tick labels of a log axis as plain numbers (0.5, 2) rather than powers of ten."""
    from matplotlib.ticker import FuncFormatter

    return FuncFormatter(lambda value, _: f"{value:g}")


def _integers() -> Any:
    from matplotlib.ticker import MaxNLocator

    return MaxNLocator(integer=True)


def _color(index: int) -> str:
    return f"C{index % 10}"


def _save(fig: Any, path: Path) -> Path:
    fig.savefig(path, format="png")
    return path


def levels_figure(stats: list[LevelStats], published: list[Published], path: Path) -> Path:
    """Grouped bars: Fast@1 and Fast@1.2 per level, one bar per run and per published entry (hatched)."""
    def label(entry: Published) -> str:
        return "all" if entry.level is None else str(entry.level)

    # published bars stand beside the runs' own levels only: a level-2 bar beside a run of unknown level compares
    # nothing (with no run, the published entries are the figure)
    levels = {s.level for s in stats} or {label(e) for e in published}
    levels = sorted(levels, key=lambda lv: (0, int(lv)) if lv.isdigit() else (1 if lv == "unknown" else 2, 0))
    runs = list(dict.fromkeys(s.run for s in stats))
    shown = [e for e in published if label(e) in levels and any(e.value("level", p) is not None for p in CURVE_P)]
    bars = len(runs) + len(shown)
    fig = _figure(min(14.0, max(8.0, 2.0 + 0.35 * len(levels) * bars)), 4.2)
    axes = fig.subplots(1, len(CURVE_P), sharey=True)
    width = 0.8 / max(bars, 1)
    for ax, p in zip(axes, CURVE_P):
        for i, run in enumerate(runs):
            values = {s.level: s.fast[p] for s in stats if s.run == run}
            xs = [x for x, lv in enumerate(levels) if lv in values]
            drawn = ax.bar([x + (i - bars / 2 + 0.5) * width for x in xs], [100 * values[levels[x]] for x in xs],
                           width, color=_color(i), label=run)
            ax.bar_label(drawn, fmt="%.1f", fontsize=6.5)
        for j, entry in enumerate(shown, len(runs)):
            value = entry.value("level", p)
            level = label(entry)
            if value is not None and level in levels:
                drawn = ax.bar(levels.index(level) + (j - bars / 2 + 0.5) * width, 100 * value, width,
                               color="white", edgecolor=_color(j), hatch="//", label=f"{entry.label} ({NOT_MEASURED})")
                ax.bar_label(drawn, fmt="%.1f", fontsize=6.5)
        ax.set_xticks(range(len(levels)), [f"level {lv}" if lv not in ("all", "unknown") else lv for lv in levels])
        ax.set_title(f"{p_label(p)} (%), last turn")
        ax.grid(axis="y", alpha=0.3)
    axes[0].set_ylabel("% of all trajectories")
    handles, labels = axes[0].get_legend_handles_labels()
    more = axes[1].get_legend_handles_labels()
    unique = dict(zip(labels + more[1], handles + more[0]))
    fig.legend(unique.values(), unique.keys(), loc="outside lower center", ncols=2, fontsize="small")
    return _save(fig, path)


def turns_figure(curves: list[TurnCurves], published: list[Published], path: Path) -> Path:
    """Fast@1 and Fast@1.2 per turn: of the turn (solid), last turn (dashed), best of history (dotted); published
    last-turn and best-of-history numbers as grey horizontal lines."""
    lines = 3 * len(curves) + sum(e.value(k, p) is not None for e in published for k in ("last", "best")
                                  for p in CURVE_P)
    fig = _figure(11.0, 4.2 + 0.2 * (lines + 1) // 2)
    axes = fig.subplots(1, len(CURVE_P), sharey=True)
    for ax, p in zip(axes, CURVE_P):
        for i, c in enumerate(curves):
            turns = range(1, len(c.reached) + 1)
            for values, style, name in ((c.turn, "-o", "of the turn"), (c.last, "--s", "last turn"),
                                        (c.best, ":^", "best of history")):
                ax.plot(turns, [100 * v for v in values[p]], style, color=_color(i), label=f"{c.run}: {name}",
                        clip_on=False)  # markers at 0 % stay whole
        for entry in published:
            for kind, style in (("last", "--"), ("best", ":")):
                value = entry.value(kind, p)
                if value is not None:
                    name = "last turn" if kind == "last" else "best of history"
                    ax.axhline(100 * value, color="grey", linestyle=style, linewidth=1.2,
                               label=f"{entry.label}: {name} ({NOT_MEASURED})")
        width = max((len(c.reached) for c in curves), default=1)
        ax.set_xticks(range(1, width + 1))
        ax.set_xlabel("turn")
        ax.set_title(f"{p_label(p)} (%)")
        ax.grid(alpha=0.3)
    # the panels share their y axis: its top is set once, over every panel's curves and published lines (set per
    # panel, the first panel's top cut off the published lines drawn only in the second)
    top = max([100 * v for c in curves for values in (c.turn, c.last, c.best) for p in CURVE_P for v in values[p]
               if not math.isnan(v)]
              + [100 * v for e in published for k in ("last", "best") for p in CURVE_P
                 if (v := e.value(k, p)) is not None], default=0.0)
    axes[0].set_ylim(0, max(10.0, 1.05 * top))
    axes[0].set_ylabel("% of trajectories")
    handles, labels = axes[0].get_legend_handles_labels()
    more = axes[-1].get_legend_handles_labels()
    unique = dict(zip(labels + more[1], handles + more[0]))
    fig.legend(unique.values(), unique.keys(), loc="outside lower center", ncols=2, fontsize="small")
    return _save(fig, path)


def outcomes_figure(all_outcomes: list[Outcomes], path: Path) -> Path:
    """One panel per run: stacked shares of each outcome per turn (hacked split by first reason)."""
    fig = _figure(9.0, 2.2 + 2.4 * len(all_outcomes))
    axes = fig.subplots(len(all_outcomes), 1, squeeze=False)[:, 0]
    hacked = sorted({c for o in all_outcomes for c in o.categories if c.startswith("hacked")})
    colors = {**OUTCOME_COLORS, **{c: HACKED_COLORS[i % len(HACKED_COLORS)] for i, c in enumerate(hacked)}}
    for ax, o in zip(axes, all_outcomes):
        turns = list(range(1, len(o.counts) + 1))
        bottom = [0.0] * len(turns)
        for category in o.categories:
            shares = [100 * counts.get(category, 0) / max(sum(counts.values()), 1) for counts in o.counts]
            ax.bar(turns, shares, 0.6, bottom=bottom, color=colors.get(category, "black"), label=category)
            bottom = [b + s for b, s in zip(bottom, shares)]
        ax.set_xticks(turns)
        ax.set_title(o.run)
        ax.set_ylabel("% of turns")
        ax.set_ylim(0, 100)
        ax.legend(loc="center left", bbox_to_anchor=(1.01, 0.5), fontsize="small")
    axes[-1].set_xlabel("turn")
    return _save(fig, path)


def speedups_figure(speedups: Sequence[tuple[str, list[float]]], interpreter: bool, path: Path) -> Path:
    """Histogram (log axis) of the speedups of correct turns, all turns, one outline per run."""
    fig = _figure(8.0, 4.0)
    ax = fig.subplots()
    values = [v for _, vs in speedups for v in vs]
    if values:
        low, high = min(values + [0.9]), max(values + [1.3])
        edges = [low * (high / low) ** (i / 30) for i in range(31)] if high > low else [low * 0.9, low * 1.1]
        for i, (run, vs) in enumerate(speedups):
            if vs:
                ax.hist(vs, bins=edges, histtype="step", linewidth=1.8, color=_color(i), label=f"{run} ({len(vs)})")
        ax.set_xscale("log")
        ax.xaxis.set_major_formatter(_plain())
        if high / low < 10:  # within one decade the minor ticks are the only labels; past it they overlap
            ax.xaxis.set_minor_formatter(_plain())
        else:
            from matplotlib.ticker import NullFormatter

            ax.xaxis.set_minor_formatter(NullFormatter())
        ax.yaxis.set_major_locator(_integers())
        for p, style in ((1.0, "-"), (1.2, "--")):
            ax.axvline(p, color="black", linestyle=style, linewidth=0.8, label=f"speedup {p:g}")
        ax.legend(fontsize="small")
    else:
        ax.text(0.5, 0.5, "no correct turn with a measured speedup", ha="center", va="center",
                transform=ax.transAxes)
    ax.set_xlabel("speedup over the reference (log scale)")
    ax.set_ylabel("correct turns")
    title = "Speedups of correct turns (all turns)"
    ax.set_title(title + ("\nTriton interpreter timings: they say nothing of GPU speed" if interpreter else ""))
    return _save(fig, path)


def coverage_figure(coverages: Sequence[tuple[str, list[float]]], threshold: float, path: Path) -> Path:
    """Histogram of the share of GPU time in the candidates' own Triton kernels, lazy threshold marked."""
    fig = _figure(8.0, 4.0)
    ax = fig.subplots()
    edges = [i / 20 for i in range(21)]
    for i, (run, vs) in enumerate(coverages):
        if vs:
            ax.hist(vs, bins=edges, histtype="step", linewidth=1.8, color=_color(i), label=f"{run} ({len(vs)})")
    ax.axvline(threshold, color="red", linestyle="--", label=f"lazy threshold (coverage < {threshold:g})")
    if not any(vs for _, vs in coverages):
        ax.text(0.5, 0.5, "coverage not measured (it needs a GPU)", ha="center", va="center", transform=ax.transAxes)
    ax.set_xlim(0, 1)
    ax.yaxis.set_major_locator(_integers())
    ax.set_xlabel("coverage: own Triton kernels' share of GPU time")
    ax.set_ylabel("evaluated turns")
    ax.set_title("Coverage of the candidates' own kernels (all evaluated turns)")
    ax.legend(fontsize="small")
    return _save(fig, path)


# (title, where the keys are: the step, its "validation" object or its first turn's kinds, shown in percent,
# (key, line style) ...); fast_1_2_first_turn and fast_1_2_last_turn are the ends of the step's turn_fast_1_2
TRAINING_PANELS = (
    ("reward", "step", False, (("reward_mean", "-"),)),
    ("Fast@1.2 on the step's prompts (%)", "step", True, (("fast_1_2_first_turn", "-"), ("fast_1_2_last_turn", "--"))),
    ("first answers' kinds (%)", "first_turn_kinds", True, (("fused", "-"), ("partial", "--"), ("lazy", ":"))),
    ("validation (%)", "validation", True, (("fast_1", "-"), ("fast_1_2", "--"), ("correct", ":"))),
    ("hacked and lazy shares (%)", "step", True, (("hacked_share", "-"), ("lazy_share", "--"))),
    ("kept fractions (%)", "step", True, (("kept_mrs", "-"), ("kept_prs", "--"), ("kept_void_turn", ":"))),
    ("policy entropy (nats a token)", "step", False, (("policy_entropy", "-"),)),
)


def _panel_values(step: dict[str, Any], where: str) -> Any:
    """What a panel reads from one step's metrics: the step itself (with its first and last turn's Fast@1.2 taken
    out of the per-turn list), its validation, or the kinds of its first answers."""
    if where == "validation":
        return step.get("validation")
    if where == "first_turn_kinds":
        kinds = step.get("turn_kind_shares")
        return kinds[0] if isinstance(kinds, list) and kinds else None
    per_turn = step.get("turn_fast_1_2")
    if isinstance(per_turn, list) and per_turn:
        return {**step, "fast_1_2_first_turn": per_turn[0], "fast_1_2_last_turn": per_turn[-1]}
    return step


def training_figure(runs: Sequence[tuple[str, list[dict[str, Any]]]], path: Path) -> Path:
    """Training runs over optimizer steps: reward (mean +- std), Fast@1.2 of the first and last turn on the step's
    own prompts, the kinds of the first answers, validation Fast@1/Fast@1.2, hacked and lazy shares, and the
    fractions of turns kept by MRS, PRS and the void-turn rule, and the policy's entropy. Keys a run lacks are left
    out."""
    fig = _figure(20.0, 7.5)
    axes = fig.subplots(2, 4).ravel()
    for ax in axes[len(TRAINING_PANELS):]:
        ax.set_visible(False)
    for ax, (title, where, percent, series) in zip(axes, TRAINING_PANELS):
        for i, (run, steps) in enumerate(runs):
            rows = [(s["step"], _panel_values(s, where)) for s in steps]
            rows = [(step, values) for step, values in rows if isinstance(values, dict)]
            for key, style in series:
                points = [(step, values[key]) for step, values in rows if _finite(values.get(key))]
                if not points:
                    continue
                xs, ys = zip(*points)
                ax.plot(xs, [100 * y if percent else y for y in ys], style,
                        marker="o" if where == "validation" or len(xs) == 1 else None,
                        markersize=3, color=_color(i), label=f"{run}: {key}")
                if key == "reward_mean":
                    band = [(step, v[key], v["reward_std"]) for step, v in rows
                            if _finite(v.get(key)) and _finite(v.get("reward_std"))]
                    if band:
                        bx, mean, std = zip(*band)
                        ax.fill_between(bx, [m - d for m, d in zip(mean, std)], [m + d for m, d in zip(mean, std)],
                                        color=_color(i), alpha=0.15)
        ax.set_title(title)
        ax.set_xlabel("step")
        ax.xaxis.set_major_locator(_integers())
        ax.grid(alpha=0.3)
        if percent:
            ax.set_ylim(0, 102)
        if ax.get_legend_handles_labels()[0]:
            ax.legend(fontsize="x-small")
        else:
            ax.text(0.5, 0.5, "not recorded", ha="center", va="center", transform=ax.transAxes)
    return _save(fig, path)


def _finite(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
