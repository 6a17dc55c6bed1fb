"""`write_report`: read runs, compute the tables, draw the figures and write them all out with a self-contained
report.html (figures inlined as data: URIs, code files beside it, no network needed to view it)."""

from __future__ import annotations

import base64
import math
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from drkernel.report import figures
from drkernel.report.metrics import (
    Trajectories,
    answer_kinds,
    lazy_threshold,
    level_stats,
    outcomes,
    paired_differences,
    phase_medians,
    step_thirds,
    task_bests,
    timing_quality,
    turn_curves,
)
from drkernel.report.published import Published, load_paper, load_published
from drkernel.report.runs import Run, RunReadError, pool_runs, read_run
from drkernel.report.seeds import has_seeds, seed_analysis
from drkernel.report.tables import (
    Table,
    TurnKey,
    differences_table,
    kinds_table,
    levels_table,
    outcomes_table,
    phases_table,
    seed_differences_table,
    seeds_table,
    tasks_table,
    timing_table,
    training_table,
    turn_key,
    turns_table,
)
from drkernel.tasks.loaders import require


@dataclass
class Report:
    out: Path
    runs: list[Run]
    published: list[Published]
    tables: list[Table] = field(default_factory=list)
    figures: list[tuple[str, str, Path]] = field(default_factory=list)  # (name, caption, PNG path)
    notes: list[str] = field(default_factory=list)

    @property
    def html(self) -> Path:
        return self.out / "report.html"


def write_report(run_dirs: Sequence[str | Path], out: str | Path, published_files: Sequence[str | Path] = (),
                 paper: bool = True, pools: Sequence[tuple[str, Sequence[str | Path]]] = ()) -> Report:
    """Write report.html, report.md, figures/*.png, tables/*.md and *.csv and code/ under `out`; each of `pools`
    (name, bench runs) is one run after those of `run_dirs` (`pool_runs`)."""
    runs = [read_run(d) for d in run_dirs] + [pool_runs(name, paths) for name, paths in pools]
    if not runs:
        raise RunReadError("no run to report: give run folders or a pool")
    _unique_names(runs)
    published = (load_paper() if paper else []) + [e for f in published_files for e in load_published(f)]
    report = Report(Path(out), runs, published)
    for sub in ("figures", "tables", "code"):
        (report.out / sub).mkdir(parents=True, exist_ok=True)
    bench = [r for r in runs if r.turns]
    if bench:
        _bench_sections(report, bench)
    trained = [(r.name, r.steps) for r in runs if r.steps]
    if trained:
        path = figures.training_figure(trained, report.out / "figures" / "training.png")
        report.figures.append(("training", "Training runs over optimizer steps", path))
        report.tables.append(training_table([span for name, steps in trained for span in step_thirds(name, steps)]))
    if not bench and not trained:
        report.notes.append("No run has a judged turn or a training step yet: nothing to tabulate.")
    for table in report.tables:
        (report.out / "tables" / f"{table.name}.md").write_text(table.markdown())
        (report.out / "tables" / f"{table.name}.csv").write_text(table.csv())
    (report.out / "report.md").write_text(_markdown(report))
    report.html.write_text(_html(report))
    return report


def _bench_sections(report: Report, bench: list[Run]) -> None:
    trajs = [Trajectories.of(r.turns) for r in bench]
    stats = [s for r, t in zip(bench, trajs) for s in level_stats(r.turns_name, t)]
    curves = [turn_curves(r.turns_name, t) for r, t in zip(bench, trajs)]
    outs = [outcomes(r.turns_name, t) for r, t in zip(bench, trajs)]
    kinds = [answer_kinds(r.turns_name, t) for r, t in zip(bench, trajs)]
    bests = [task_bests(t) for t in trajs]
    code_paths = [_write_code(report.out, i, r, b) for i, (r, b) in enumerate(zip(bench, bests))]
    report.tables += [
        levels_table(stats, report.published),
        turns_table(curves, report.published),
        outcomes_table(outs),
        kinds_table(kinds),
        tasks_table([r.turns_name for r in bench], bests, code_paths),
    ]
    differences = [d for r, t in zip(bench[1:], trajs[1:])
                   for d in paired_differences(r.turns_name, t, bench[0].turns_name, trajs[0])]
    if differences:
        report.tables.append(differences_table(differences))
    if has_seeds([r.turns_name for r in bench]):
        seeds = seed_analysis([(r.turns_name, t) for r, t in zip(bench, trajs)])
        report.notes += seeds.notes
        if seeds.rows:
            report.tables.append(seeds_table(seeds.rows))
        if seeds.differences:
            report.tables.append(seed_differences_table(seeds.differences))
    medians = [phase_medians(r.turns_name, r.turns) for r in bench]
    if any(m.medians for m in medians):
        report.tables.append(phases_table(medians))
    qualities = [timing_quality(r.turns_name, r.turns) for r in bench]
    if any(q.timed for q in qualities):
        report.tables.append(timing_table(qualities))
    interpreter = any(t.interpreter for r in bench for t in r.turns)
    if interpreter:
        report.notes.append("Some timings come from Triton's interpreter on the CPU: their speedups, and so Fast@p "
                            "for p > 0, say nothing of GPU speed.")
    if bench:
        report.notes.append(precision_note(bench))
    thresholds = {lazy_threshold(r.config) for r in bench}  # the lowest is drawn when runs differ
    folder = report.out / "figures"
    report.figures += [
        ("levels", "Fast@1 and Fast@1.2 per level (last turn of each trajectory)",
         figures.levels_figure(stats, report.published, folder / "levels.png")),
        ("turns", "Fast@p per turn: of the turn, last turn, best of history",
         figures.turns_figure(curves, report.published, folder / "turns.png")),
        ("outcomes", "Outcomes per turn", figures.outcomes_figure(outs, folder / "outcomes.png")),
        ("speedups", "Speedups of correct turns",
         figures.speedups_figure(
             [(r.turns_name, [t.speedup for t in r.turns if t.correct and not math.isnan(t.speedup)]) for r in bench],
             interpreter, folder / "speedups.png")),
        ("coverage", "Coverage of the candidates' own kernels",
         figures.coverage_figure(
             [(r.turns_name, [t.coverage for t in r.turns if not math.isnan(t.coverage)]) for r in bench],
             min(thresholds), folder / "coverage.png")),
    ]


def _slug(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]+", "_", text).strip("_") or "_"


def _write_code(out: Path, index: int, run: Run, bests: dict[str, Any]) -> dict[TurnKey, str]:
    """Write the code of each task's best and worst turn under code/; return their paths relative to `out`."""
    paths: dict[TurnKey, str] = {}
    for best in bests.values():
        for turn in (best.best, best.worst):
            if turn is None or turn.code is None or turn_key(turn) in paths:
                continue
            relative = Path("code", f"{index}_{_slug(run.name)}", _slug(turn.task), f"s{turn.sample}_t{turn.turn}.py")
            (out / relative).parent.mkdir(parents=True, exist_ok=True)
            (out / relative).write_text(turn.code)
            paths[turn_key(turn)] = relative.as_posix()
    return paths


def _unique_names(runs: list[Run]) -> None:
    """Two runs named alike (…/a/run, …/b/run) are told apart by their parent folder, then by their position."""
    for run in runs:
        if sum(r.name == run.name for r in runs) > 1:
            run.name = f"{run.path.parent.name}/{run.name}"
    for i, run in enumerate(runs):
        if sum(r.name == run.name for r in runs) > 1:
            run.name = f"{run.name} #{i + 1}"


def _scalars(data: dict[str, Any] | None, prefix: str = "") -> list[tuple[str, Any]]:
    """Flattened scalar entries of a config or summary, for the run overview."""
    items: list[tuple[str, Any]] = []
    for key, value in (data or {}).items():
        if isinstance(value, dict):
            items += _scalars(value, f"{prefix}{key}.")
        elif isinstance(value, (str, int, float, bool)) or value is None:
            items.append((f"{prefix}{key}", value))
    return items


def _markdown(report: Report) -> str:
    parts = ["# drkernel report", ""]
    parts += [f"- {note}" for note in report.notes] + [""]
    parts += [f"![{caption}](figures/{path.name})\n" for _, caption, path in report.figures]
    parts += [table.markdown() for table in report.tables]
    return "\n".join(parts)


def _html(report: Report) -> str:
    jinja2 = require("jinja2", "report", "writing the report's HTML")
    env = jinja2.Environment(loader=jinja2.PackageLoader("drkernel.report", "templates"),
                             autoescape=jinja2.select_autoescape(["html", "j2"]), undefined=jinja2.StrictUndefined)
    images = {name: base64.b64encode(path.read_bytes()).decode("ascii") for name, _, path in report.figures}
    runs = [{
        "name": run.name, "path": str(run.path), "turns": len(run.turns),
        "trajectories": len({(t.task, t.sample) for t in run.turns}), "tasks": len({t.task for t in run.turns}),
        "steps": len(run.steps), "notes": run.notes, "config": _scalars(run.config), "summary": _scalars(run.summary),
    } for run in report.runs]
    return env.get_template("report.html.j2").render(
        report=report, runs=runs, images=images, tables={table.name: table for table in report.tables},
        generated=datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
    )


def precision_note(runs: list[Run]) -> str:
    """Which precision rule each run's verdicts were made under (EvalOptions.precision, kept in its config.json): a
    run made before drkernel had the rule was judged by tolerance alone."""
    rules = [f"{run.turns_name}: {_rule(run.config)}" for run in runs]
    return ("Precision rule of the verdicts: " + "; ".join(rules) + ". Under `matched` a speedup bought with lower "
            "precision than the reference's is hacked; under `tolerance` it counts, as in KernelBench and the paper's "
            "published numbers.")


def _rule(config: dict[str, Any]) -> str:
    """The precision rule in a config.json: under `evaluation`, or at the top in one written before it nested."""
    evaluation = config.get("evaluation") if isinstance(config.get("evaluation"), dict) else config
    return evaluation.get("precision") or "tolerance (made before the rule existed)"
