"""`drkernel bench` as a library: a run directory and its configuration (drkernel.agent.config), its model and
evaluator, the loop, the summary.

The configuration is saved as RUN_DIR/config.json; `resume` takes it back, so a killed run continues with the
settings it started with. Settings that shape the trajectories (tasks, model, samples, context, sampling, prompts,
reward) cannot change on resume; `turns` may grow (continue a finished run for more turns), and how the run is
served (endpoint, concurrency, timeouts, evaluation engine) may change.
"""

from __future__ import annotations

import asyncio
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

from drkernel.agent.backends import ChatModel, HFChatModel, OpenAIChatConfig, OpenAIChatModel
from drkernel.agent.config import FIXED_ON_RESUME, HF_PREFIX, BenchConfig, flat_settings
from drkernel.scheduling.evaluator import open_evaluator
from drkernel.agent.loop import LoopOutcome, run_loop
from drkernel.agent.records import (
    CONFIG,
    SUMMARY,
    TRAJECTORIES,
    TurnRecord,
    read_generation_errors,
    read_json,
    read_trajectories,
    write_json,
)
from drkernel.agent.summary import completeness, summarize
from drkernel.errors import UsageError
from drkernel.runner.devices import discover_gpus
from drkernel.runner.supervisor import gpu_gate_path
from drkernel.sandbox.gate import DeviceGate
from drkernel.settings import flatten, nest
from drkernel.tasks import Task, TaskLoadError, load_tasks, select_tasks
from drkernel.tasks.loaders import load_task_file, python_files, read_jsonl, task_from_row

class RunDirError(UsageError):
    """The run directory does not fit the request (a run already there, or settings that differ on resume)."""


def prepare_run_dir(run_dir: Path, given: dict[str, Any], resume: bool) -> BenchConfig:
    """The run's configuration: `given` (settings named on the command line, nested as BenchConfig's fields) over
    the saved one when resuming.

    A fresh run refuses a directory that already holds turns, so nothing recorded is overwritten or mixed.
    """
    saved_path = run_dir / CONFIG
    has_turns = (run_dir / TRAJECTORIES).exists() and (run_dir / TRAJECTORIES).stat().st_size > 0
    if not resume:
        if has_turns:
            raise RunDirError(f"{run_dir} already holds a run; pass --resume to continue it, or choose another --out")
        if "tasks" not in given or "model" not in given:
            raise RunDirError("need --tasks and --model (or --resume to continue the run in --out)")
        config = BenchConfig.from_dict(given)
    elif not saved_path.exists():
        if has_turns:
            raise RunDirError(f"{run_dir} has turns but no {CONFIG}: cannot tell how they were made")
        if "tasks" not in given or "model" not in given:
            raise RunDirError(f"{run_dir} holds no run to resume (no {CONFIG}); give --tasks and --model to start one")
        config = BenchConfig.from_dict(given)
    else:
        saved, named = flatten(BenchConfig.from_dict(read_json(saved_path)).to_dict()), flat_settings(given)
        changed = [key for key in FIXED_ON_RESUME if key in named and named[key] != saved.get(key)]
        if changed:
            listed = ", ".join(f"{key} ({saved.get(key)!r} -> {named[key]!r})" for key in changed)
            raise RunDirError(f"--resume cannot change what the recorded trajectories were made with: {listed}")
        config = BenchConfig.from_dict(nest({**saved, **named}))
    try:
        write_json(saved_path, config.to_dict())
    except OSError as exc:
        raise RunDirError(f"cannot write {saved_path}: {exc}") from exc
    return config


def load_usable_tasks(config: BenchConfig) -> tuple[list[Task], list[str]]:
    """The selected tasks that load, and a problem line for each that does not: a broken task file costs that
    task, not the run. `TaskLoadError` only when nothing usable is left (or the selection is wrong)."""
    path = Path(config.tasks)
    problems: list[str] = []
    if path.is_dir():
        tasks = []
        for file, _level in python_files(path):
            try:
                tasks.append(load_task_file(file))
            except TaskLoadError as exc:
                problems.append(str(exc).replace("\n", " "))
    elif path.suffix == ".jsonl" and path.is_file():
        rows, problems = read_jsonl(path)
        tasks = []
        for where, row in rows:
            try:
                task = task_from_row(row, str(path))
                task.check()
                tasks.append(task)
            except TaskLoadError as exc:
                problems.append(f"{where}: {exc}")
    else:
        tasks = load_tasks(config.tasks)
    if not tasks:
        raise TaskLoadError("no task loads: " + "; ".join(problems) if problems else f"{config.tasks}: no tasks")
    duplicates = sorted(key for key, count in Counter(task.key for task in tasks).items() if count > 1)
    if duplicates:  # records are keyed by task: two tasks of one key would share trajectories
        raise TaskLoadError(f"{config.tasks}: duplicate task {', '.join(duplicates)}")
    selected = select_tasks(tasks, levels=config.levels, ids=config.problems, names=config.names)
    return selected, problems


def make_model(config: BenchConfig, trajectories: int | None = None) -> ChatModel:
    """The configured model; a local one batches up to every trajectory that can be in flight (`concurrency`, or the
    run's `trajectories` when fewer: a static cache fills each batch to that size)."""
    if config.model.startswith(HF_PREFIX):
        device = "cuda" if config.evaluation.device == "cuda" else "cpu"
        in_flight = min(config.concurrency, trajectories or config.concurrency)
        return HFChatModel(config.model[len(HF_PREFIX):], device=device, max_batch=in_flight,
                           gate=generation_gate(config), static_cache=config.static_cache)
    assert config.base_url is not None
    return OpenAIChatModel(OpenAIChatConfig(config.base_url, config.model, config.api_key_env,
                                            config.request_timeout_s, config.retries))


def generation_gate(config: BenchConfig) -> DeviceGate | None:
    """The device gate of the GPU a local model generates on (the first one), when the embedded scheduler evaluates
    there too: generation then runs beside correctness checks but never while a candidate is timed. A service or
    Ray cluster may evaluate anywhere: put the model on a GPU of its own there."""
    if not config.model.startswith(HF_PREFIX) or config.evaluation.device != "cuda" or config.engine.kind != "embedded":
        return None
    gpus = discover_gpus()
    if not gpus:
        return None
    path = gpu_gate_path(gpus[0])
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    return DeviceGate(path, None)


async def run_bench(
    config: BenchConfig, tasks: list[Task], run_dir: Path, on_turn: Callable[[TurnRecord], None] | None = None
) -> tuple[LoopOutcome, dict[str, Any]]:
    """Run the loop with the configured model and evaluator, then write RUN_DIR/summary.json (also after a fatal
    model error, over what was recorded, saying what is still missing)."""
    model = make_model(config, trajectories=len(tasks) * config.samples)
    evaluator, close_evaluator = open_evaluator(config.engine, config.evaluation)
    try:
        outcome = await run_loop(tasks, model, evaluator, config.loop_config(), run_dir, on_turn)
    finally:
        await model.close()
        closed = close_evaluator()
        if asyncio.iscoroutine(closed):
            await closed
        summary = write_summary(run_dir, [(task.key, sample) for task in tasks for sample in range(config.samples)],
                                config.turns)
    return outcome, summary


def write_summary(run_dir: Path, planned: list[tuple[str, int]], turns: int) -> dict[str, Any]:
    """Summarise the run's records into RUN_DIR/summary.json; returns what it wrote."""
    records = read_trajectories(run_dir)
    summary = {**summarize(records), **completeness(records, read_generation_errors(run_dir), planned, turns)}
    write_json(run_dir / SUMMARY, summary)
    return summary
