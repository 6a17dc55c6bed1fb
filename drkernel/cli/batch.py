"""`drkernel eval --tasks ... --candidates ...`: many evaluations, a progress bar, JSONL results, a summary."""

from __future__ import annotations

import asyncio
import json
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from drkernel.cli.common import INTERPRETER_NOTE
from drkernel.errors import UsageError
from drkernel.scheduling.evaluator import open_evaluator
from drkernel.scheduling.engine import EngineConfig
from drkernel.schema import EvalOptions, EvalResult
from drkernel.tasks import Task, load_candidates, load_tasks, pair_candidates, select_tasks


def run_batch(
    tasks_spec: str,
    candidates_spec: str,
    options: EvalOptions,
    levels: list[int] | None,
    names: list[str] | None,
    out: Path | None,
    engine: EngineConfig,
) -> None:
    all_tasks = load_tasks(tasks_spec)
    chosen = {t.key for t in select_tasks(all_tasks, levels=levels or None, names=names or None)}
    pairs = [(t, c) for t, c in pair_candidates(all_tasks, load_candidates(candidates_spec)) if t.key in chosen]
    if not pairs:
        raise UsageError("no candidate answers the selected tasks")
    if out is not None:
        try:
            out.parent.mkdir(parents=True, exist_ok=True)
            sink = out.open("w")
        except OSError as exc:
            raise UsageError(f"cannot write {out}: {exc}") from exc
    console = Console(stderr=True)
    rows: list[dict[str, Any]] = [{} for _ in pairs]
    try:
        with Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                      console=console, transient=False) as progress:
            bar = progress.add_task("evaluating", total=len(pairs))

            def done(index: int, result: EvalResult) -> None:
                task, cand = pairs[index]
                rows[index] = {"task": task.key, "candidate": cand.id, "result": result.to_dict()}
                if out is not None:
                    sink.write(json.dumps(rows[index]) + "\n")
                    sink.flush()
                progress.update(bar, advance=1, description=f"{cand.id}: {result.status}")

            results = asyncio.run(evaluate_all(engine, options, [(t, c.code) for t, c in pairs], done))
    finally:
        if out is not None:
            sink.close()
    Console().print(results_table(rows))
    Console().print(summary_table(results))
    if out is not None:
        console.print(f"results: {out}")


async def evaluate_all(engine: EngineConfig, options: EvalOptions, pairs: list[tuple[Task, str]],
                       done: Callable[[int, EvalResult], None] | None = None) -> list[EvalResult]:
    """Every (task, code) judged at once by the engine, whose own queue orders the work; `done` as each ends."""
    evaluator, close = open_evaluator(engine, options)

    async def judge(index: int, task: Task, code: str) -> EvalResult:
        result = await evaluator.evaluate(task, code)
        if done is not None:
            done(index, result)
        return result

    try:
        return list(await asyncio.gather(*(judge(i, task, code) for i, (task, code) in enumerate(pairs))))
    finally:
        closed = close()
        if asyncio.iscoroutine(closed):
            await closed


def results_table(rows: list[dict[str, Any]]) -> Table:
    table = Table(title="Results")
    for column in ("task", "candidate", "status", "speedup", "hack reasons / error"):
        table.add_column(column, overflow="fold")
    for row in rows:
        r = EvalResult.from_dict(row["result"])
        why = ", ".join(r.hack_reasons) or (f"{r.error.kind}: {r.error.message[:80]}" if r.error else "")
        speed = f"{r.speedup:.2f}x" if r.speedup is not None and r.correct else ""
        table.add_row(row["task"], row["candidate"], r.status, speed, why)
    return table


def summary_table(results: list[EvalResult]) -> Table:
    from drkernel.rl.metrics import fast_p, geometric_mean_speedup

    correct = [r.correct for r in results]
    speedups = [r.speedup if r.speedup is not None else float("nan") for r in results]
    table = Table(title="Summary")
    table.add_column("metric")
    table.add_column("value", justify="right")
    n = len(results)
    table.add_row("evaluations", str(n))
    table.add_row("correct rate", f"{sum(correct) / n:.1%}")
    table.add_row("Fast@1", f"{float(fast_p(speedups, correct, 1.0)):.1%}")
    table.add_row("Fast@1.2", f"{float(fast_p(speedups, correct, 1.2)):.1%}")
    geo = geometric_mean_speedup(speedups, correct)
    table.add_row("geo-mean speedup (correct)", "-" if geo is None or geo != geo else f"{float(geo):.3f}x")
    for status, count in sorted(Counter(r.status for r in results).items()):
        table.add_row(f"status {status}", str(count))
    if any(r.environment and r.environment.interpreter for r in results):
        table.caption = INTERPRETER_NOTE
    return table
