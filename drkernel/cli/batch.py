"""`drkernel eval --tasks ... --candidates ...`: many evaluations, a progress bar, JSONL results, a summary."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from drkernel.cli.common import INTERPRETER_NOTE
from drkernel.errors import UsageError
from drkernel.schema import EvalOptions, EvalRequest, EvalResult
from drkernel.tasks import load_candidates, load_tasks, pair_candidates, select_tasks


def run_batch(
    tasks_spec: str,
    candidates_spec: str,
    options: EvalOptions,
    levels: list[int] | None,
    names: list[str] | None,
    out: Path | None,
    workers: int | None,
    ray_address: str | None,
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
    requests = [EvalRequest(t.code, c.code, options, task_name=t.key) for t, c in pairs]
    backend = _backend(options.device, workers, ray_address)
    console = Console(stderr=True)
    rows: list[dict[str, Any]] = [{} for _ in pairs]
    try:
        with Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                      console=console, transient=False) as progress:
            bar = progress.add_task("evaluating", total=len(requests))

            def done(index: int, result: EvalResult) -> None:
                task, cand = pairs[index]
                rows[index] = {"task": task.key, "candidate": cand.id, "result": result.to_dict()}
                if out is not None:
                    sink.write(json.dumps(rows[index]) + "\n")
                    sink.flush()
                progress.update(bar, advance=1, description=f"{cand.id}: {result.status}")

            results = _evaluate_all(backend, requests, done)
    finally:
        backend.close()
        if out is not None:
            sink.close()
    Console().print(results_table(rows))
    Console().print(summary_table(results))
    if out is not None:
        console.print(f"results: {out}")


def _backend(device: str, workers: int | None, ray_address: str | None, cache: bool = True) -> Any:
    """`cache=False` for the service: its store is the result cache, under the same key."""
    if ray_address:
        from drkernel.scheduling.ray_backend import RayBackend

        return RayBackend(address=ray_address, device=device)
    from drkernel.scheduling.scheduler import Scheduler

    return Scheduler(device=device, workers=workers, **({} if cache else {"cache_entries": 0}))


def _evaluate_all(backend: Any, requests: list[EvalRequest], done: Any) -> list[EvalResult]:
    futures = [backend.submit(r) for r in requests]
    for index, future in enumerate(futures):
        future.add_done_callback(lambda f, i=index: done(i, f.result()))
    return [f.result() for f in futures]


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
