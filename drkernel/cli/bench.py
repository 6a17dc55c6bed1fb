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

from drkernel.cli.common import INTERPRETER_NOTE, err, parse_ids
from drkernel.errors import EngineError, UsageError

_UNSET: Any = None  # options left unset fall back to the saved config on --resume, else to BenchConfig's defaults


def bench_command(
    out: Path = typer.Option(..., "--out", help="Run directory: trajectories.jsonl, config.json, summary.json."),
    tasks: Optional[str] = typer.Option(_UNSET, "--tasks", help="A folder of tasks, a .jsonl/.parquet, or hub:."),
    level: Optional[list[str]] = typer.Option(_UNSET, "--level", help="Only tasks of these levels: 1,2 or 1-3."),
    problems: Optional[list[str]] = typer.Option(_UNSET, "--problems", help="Only these problem ids: 1,2,19 or "
                                                 "1-5."),
    name: Optional[list[str]] = typer.Option(_UNSET, "--name", help="Only tasks with these names (globs)."),
    model: Optional[str] = typer.Option(_UNSET, "--model", help="The served model's name, or hf:PATH (local)."),
    base_url: Optional[str] = typer.Option(_UNSET, "--base-url", help="OpenAI-compatible endpoint, e.g. .../v1"),
    api_key_env: Optional[str] = typer.Option(_UNSET, "--api-key-env", help="Variable holding the API key "
                                              "(default: OPENAI_API_KEY); unset sends no key."),
    samples: Optional[int] = typer.Option(_UNSET, "--samples", min=1, help="Trajectories per task (default: 1)."),
    turns: Optional[int] = typer.Option(_UNSET, "--turns", min=1, help="Turns per trajectory (default: 1)."),
    context: Optional[str] = typer.Option(_UNSET, "--context", help="Earlier turns each prompt shows: full, "
                                          "last:K, topk:K or window:K (default: full)."),
    temperature: Optional[float] = typer.Option(_UNSET, "--temperature", min=0.0,
                                                 help="Sampling temperature (default: 1.0)."),
    top_p: Optional[float] = typer.Option(_UNSET, "--top-p", min=0.0, max=1.0,
                                           help="Nucleus sampling: the probability mass kept (default: 0.95)."),
    max_tokens: Optional[int] = typer.Option(_UNSET, "--max-tokens", min=1,
                                              help="Most tokens per model answer (default: 8192)."),
    stop: Optional[list[str]] = typer.Option(_UNSET, "--stop", help="Stop sequence (repeatable)."),
    seed: Optional[int] = typer.Option(_UNSET, "--seed", help="Sample i asks with seed + i (default: none sent)."),
    prompts: Optional[str] = typer.Option(_UNSET, "--prompts", help="TOML/JSON file overriding prompt templates."),
    profiling_reward: Optional[bool] = typer.Option(_UNSET, "--profiling-reward/--no-profiling-reward",
                                                    help="Reward coverage too (PR) (default: off)."),
    concurrency: Optional[int] = typer.Option(_UNSET, "--concurrency", min=1,
                                              help="Trajectories in flight (default: 32)."),
    request_timeout: Optional[float] = typer.Option(_UNSET, "--request-timeout", min=0.1,
                                                    help="Seconds per model request (default: 600)."),
    retries: Optional[int] = typer.Option(_UNSET, "--retries", min=0, help="Retries of a failed request "
                                          "(429, 5xx, connection, timeout) (default: 5)."),
    device: Optional[str] = typer.Option(_UNSET, "--device", help="Evaluation device: auto, cpu or cuda "
                                         "(default: auto)."),
    workers: Optional[int] = typer.Option(_UNSET, "--workers", min=1, help="Evaluation workers "
                                         "(default: one per GPU; on the CPU, half the cores)."),
    result_cache: Optional[int] = typer.Option(_UNSET, "--result-cache", min=0, help="Verdicts of identical "
                                               "answers the embedded scheduler keeps; 0: off (default: 4096)."),
    ray: Optional[str] = typer.Option(_UNSET, "--ray", help="Evaluate on a Ray cluster: its address, or auto."),
    service: Optional[str] = typer.Option(_UNSET, "--service", help="Evaluate on a drkernel serve URL "
                                          "(token from $DRKERNEL_TOKEN)."),
    timeout: Optional[float] = typer.Option(_UNSET, "--timeout", min=1.0, help="Seconds per evaluation "
                                            "(default: 180)."),
    trials: Optional[int] = typer.Option(_UNSET, "--trials", min=1, help="Correctness trials (default: 5)."),
    precision: Optional[str] = typer.Option(_UNSET, "--precision", help="matched: a speedup bought with lower "
                                            "precision than the reference's is refused; tolerance: atol/rtol alone, "
                                            "as KernelBench and the paper judge (default: matched)."),
    perf_trials: Optional[int] = typer.Option(_UNSET, "--perf-trials", min=1, help="Timed calls per side "
                                              "(default: 20)."),
    no_perf: Optional[bool] = typer.Option(_UNSET, "--no-perf/--perf",
                                           help="Check correctness only (default: --perf)."),
    resume: bool = typer.Option(False, "--resume", help="Continue the run in --out: ask only missing turns."),
) -> None:
    """Let a model write and refine kernels for each task; record every judged turn; print Fast@p per turn."""
    from drkernel.agent.backends import FatalGenerationError
    from drkernel.agent.bench import load_usable_tasks, prepare_run_dir, run_bench
    from drkernel.agent.records import GENERATION_ERRORS, read_trajectories

    given = {
        "tasks": tasks, "levels": parse_ids(level, "--level") if level else None,
        "problems": parse_ids(problems, "--problems") if problems else None, "names": name,
        "model": model, "base_url": base_url, "api_key_env": api_key_env, "samples": samples, "turns": turns,
        "context": context, "temperature": temperature, "top_p": top_p, "max_tokens": max_tokens, "stop": stop,
        "seed": seed, "prompts": prompts, "profiling_reward": profiling_reward, "concurrency": concurrency,
        "request_timeout_s": request_timeout, "retries": retries, "device": device,
        "workers": workers, "result_cache": result_cache, "ray": ray, "service": service, "timeout_s": timeout,
        "correctness_trials": trials,
        "perf_trials": perf_trials, "measure_performance": None if no_perf is None else not no_perf,
        "precision": precision,
    }
    given = {key: value for key, value in given.items() if value not in (None, [])}
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
    any_verdict: bool = typer.Option(False, "--any-verdict", help="Keep incorrect turns too (never hacked ones)."),
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
