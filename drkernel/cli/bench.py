"""`drkernel bench` (a model writes kernels, KernelGym judges them, the model refines them) and `drkernel
export-sft` (kept turns of a run as chat data for supervised fine-tuning).

The loop and its imports load when the command runs, so `drkernel eval` pays nothing for them.
"""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path
from typing import Any, Optional

import typer
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from drkernel.agent.config import BenchConfig
from drkernel.cli.common import INTERPRETER_NOTE, engine_settings, err, flag
from drkernel.cli.options import Fields, config_options
from drkernel.errors import EngineError, UsageError
from drkernel.scheduling.engine import EngineConfig
from drkernel.schema import EvalOptions

BENCH_FIELDS = ("tasks", "levels", "problems", "names", "model", "base_url", "api_key_env", "samples", "turns",
                "context", "temperature", "top_p", "max_tokens", "stop", "seed", "prompts", "profiling_reward",
                "concurrency", "request_timeout_s", "retries", "static_cache")
BENCH_EVAL_OPTIONS = ("device", "timeout_s", "correctness_trials", "perf_trials", "measure_performance", "precision")


@config_options(Fields(BenchConfig, BENCH_FIELDS), Fields(EvalOptions, BENCH_EVAL_OPTIONS, "evaluation"),
                Fields(EngineConfig, ("name", "workers", "result_cache", "judge_hosts"), "engine"))
def bench_command(
    settings: dict[str, Any],
    out: Path = typer.Option(..., "--out", help="Run directory: trajectories.jsonl, config.json, summary.json."),
    ray: Optional[str] = typer.Option(None, "--ray", hidden=True, help="The older --engine ray:ADDRESS."),
    service: Optional[str] = typer.Option(None, "--service", hidden=True, help="The older --engine URL."),
    resume: bool = flag("--resume", help="Continue the run in --out: ask only missing turns."),
) -> None:
    """Let a model write and refine kernels for each task; record every judged turn; print Fast@p per turn.

    A setting left out is the saved run's with --resume, else the default shown."""
    from drkernel.agent.backends import FatalGenerationError
    from drkernel.agent.bench import load_usable_tasks, prepare_run_dir, run_bench
    from drkernel.agent.records import GENERATION_ERRORS, read_trajectories

    given = {**settings, "engine": engine_settings(settings, ray=ray, service=service)}
    config = prepare_run_dir(out, given, resume)
    config.loop_config()  # reads the prompt templates: a bad file fails here, before any request
    selected, problems_found = load_usable_tasks(config)
    for problem in problems_found:
        err.print(f"[yellow]warning:[/yellow] skipped a task that does not load: {problem}")
    total = len(selected) * config.samples * config.turns
    keys = {task.key for task in selected}
    recorded = sum(r.task in keys and r.sample < config.samples for r in read_trajectories(out))
    console = Console(stderr=True)
    try:
        with Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                      console=console) as progress:
            bar = progress.add_task("turns", total=total, completed=recorded)

            def on_turn(record: Any) -> None:
                progress.update(bar, advance=1, description=f"{record.task} s{record.sample} t{record.turn}: "
                                                            f"{record.status}")

            outcome, summary = asyncio.run(run_bench(config, selected, out, on_turn))
    except KeyboardInterrupt:
        err.print(f"interrupted: the turns recorded so far are kept in {out}; rerun with --resume to continue")
        raise typer.Exit(130)
    except FatalGenerationError as exc:  # a wrong key, model or endpoint: the arguments' to fix
        raise UsageError(f"the model cannot be used: {exc}. Turns recorded so far are kept in {out}; fix the cause "
                         f"and rerun with --resume.") from exc
    except UsageError as exc:  # a local model that does not load
        raise UsageError(f"{exc}. Turns recorded so far are kept in {out}.") from exc
    except EngineError as exc:  # no evaluator
        raise EngineError(f"{exc}. Turns recorded so far are kept in {out}; rerun with --resume once the "
                          f"evaluation engine is back.") from exc
    Console().print(summary_table(summary))
    if any(_interpreted(record) for record in read_trajectories(out)):
        err.print(f"[yellow]warning:[/yellow] {INTERPRETER_NOTE}")
    failures = outcome.generation_errors
    for cause in sorted({failure.cause for failure in failures}):
        err.print(f"[yellow]warning:[/yellow] a model request failed for good (its trajectory stopped; --resume "
                  f"asks the turn again): {cause}")
    if failures and not outcome.new_turns:
        raise UsageError(f"every model request failed ({len(failures)}); first cause: {failures[0].cause}. Logged in "
                   f"{out / GENERATION_ERRORS}; rerun with --resume once the model answers.")
    console.print(f"records: {out}")


def summary_table(summary: dict[str, Any]) -> Table:
    table = Table(title=f"{summary.get('tasks', 0)} tasks, {summary['trajectories']} trajectories, "
                        f"{summary.get('turns_judged', 0)} turns judged")
    for column in ("turn", "trajectories", "correct", "Fast@1", "Fast@1.2"):
        table.add_column(column, justify="right")
    if summary.get("incomplete_trajectories"):
        table.caption = (f"{summary['incomplete_trajectories']} of {summary['planned_trajectories']} trajectories "
                         f"incomplete, {summary['generation_errors']} turns whose model call failed for good: "
                         f"--resume asks the missing turns")
    if not summary["trajectories"]:
        return table
    per_turn = summary["per_turn"]
    for t in range(summary["turns"]):
        table.add_row(str(t + 1), str(per_turn["trajectories"][t]), _pct(per_turn["correct"][t]),
                      _pct(per_turn["fast_1"][t]), _pct(per_turn["fast_1_2"][t]))
    for label, key in (("last turn", "last_turn"), ("best of history", "best_of_history")):
        row = summary[key]
        table.add_row(label, str(summary["trajectories"]), _pct(row["correct"]), _pct(row["fast_1"]),
                      _pct(row["fast_1_2"]))
    return table


def _interpreted(record: Any) -> bool:
    return bool(((record.result or {}).get("environment") or {}).get("interpreter"))


def _pct(value: float | None) -> str:
    return "-" if value is None else f"{value:.1%}"


def export_sft_command(
    run_dir: Path = typer.Argument(..., help="A bench run directory (holding trajectories.jsonl)."),
    out: Path = typer.Option(..., "--out", help="JSONL file of {\"messages\": [...]} rows."),
    min_speedup: float = typer.Option(1.0, "--min-speedup", help="Keep turns at least this fast; 0 keeps any "
                                      "measured or unmeasured speed."),
    any_verdict: bool = flag("--any-verdict", help="Keep incorrect turns too (never hacked ones)."),
) -> None:
    """Write the kept turns of a run (default: correct, not hacked, speedup >= 1) as chat data for SFT."""
    from drkernel.agent.export import SftFilter, write_sft
    from drkernel.agent.records import TRAJECTORIES, read_trajectories

    if not (run_dir / TRAJECTORIES).is_file():
        raise UsageError(f"{run_dir} holds no {TRAJECTORIES}: not a bench run directory")
    records = read_trajectories(run_dir)
    try:
        count = write_sft(records, out, SftFilter(not any_verdict, min_speedup or None))
    except OSError as exc:
        raise UsageError(f"cannot write {out}: {exc}") from exc
    print(f"{count} of {len(records)} turns written to {out}", file=sys.stderr)
    slower = [r for r in records if r.correct and (r.speedup or 0.0) < min_speedup]
    if count == 0 and min_speedup and slower:
        cpu = " (their timings come from Triton's interpreter on the CPU)" if any(map(_interpreted, slower)) else ""
        print(f"hint: {len(slower)} correct turns measured no speedup of at least --min-speedup {min_speedup:g}"
              f"{cpu}; --min-speedup 0 keeps them", file=sys.stderr)
