"""`drkernel bench` as a library: a run's configuration, its model and evaluator, the loop, the summary.

The configuration is saved as RUN_DIR/config.json; `resume` takes it back, so a killed run continues with the
settings it started with. Settings that shape the trajectories (tasks, model, samples, context, sampling, prompts,
reward) cannot change on resume; `turns` may grow (continue a finished run for more turns), and how the run is
served (endpoint, concurrency, timeouts, evaluation engine) may change.
"""

from __future__ import annotations

import asyncio
import dataclasses
import os
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from drkernel.agent.backends import ChatModel, HFChatModel, OpenAIChatConfig, OpenAIChatModel, SamplingParams
from drkernel.agent.context import ContextPolicy
from drkernel.agent.evaluate import BackendEvaluator, Evaluator, ServiceEvaluator
from drkernel.agent.loop import LoopConfig, LoopOutcome, run_loop
from drkernel.agent.prompts import PromptTemplates
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
from drkernel.rl import RewardConfig
from drkernel.runner.devices import discover_gpus
from drkernel.runner.sandbox import gpu_gate_path
from drkernel.sandbox.gate import DeviceGate
from drkernel.scheduling.cache import DEFAULT_ENTRIES
from drkernel.schema import EvalOptions
from drkernel.tasks import Task, TaskLoadError, load_tasks, select_tasks
from drkernel.tasks.loaders import load_task_file, python_files, read_jsonl, task_from_row

HF_PREFIX = "hf:"


@dataclass
class BenchConfig:
    tasks: str
    model: str  # a served model's name, or hf:PATH for a local transformers model
    base_url: str | None = None
    api_key_env: str = "OPENAI_API_KEY"
    levels: list[int] | None = None
    problems: list[int] | None = None
    names: list[str] | None = None
    samples: int = 1
    turns: int = 1
    context: str = "full"
    temperature: float = 1.0
    top_p: float = 0.95
    max_tokens: int = 8192
    stop: list[str] = field(default_factory=list)
    seed: int | None = None
    prompts: str | None = None  # a TOML or JSON file of PromptTemplates overrides
    profiling_reward: bool = False
    concurrency: int = 32
    request_timeout_s: float = 600.0
    retries: int = 5
    device: str = "auto"
    workers: int | None = None
    result_cache: int = DEFAULT_ENTRIES  # verdicts of identical answers the embedded scheduler keeps; 0: off
    ray: str | None = None
    service: str | None = None  # URL of a `drkernel serve` service
    service_token_env: str = "DRKERNEL_TOKEN"
    timeout_s: float = 180.0
    correctness_trials: int = 5
    perf_trials: int = 20
    measure_performance: bool = True
    precision: str = "matched"  # EvalOptions.precision: matched (the default) or tolerance (KernelBench's rule)

    def __post_init__(self) -> None:
        ContextPolicy.parse(self.context)  # fail early on a bad policy
        if not self.model.startswith(HF_PREFIX) and not self.base_url:
            raise ValueError(f"--base-url is needed for the served model {self.model!r} (or use --model hf:PATH)")
        LoopConfig(self.samples, self.turns, concurrency=self.concurrency)
        self.eval_options()
        if self.result_cache < 0:
            raise ValueError(f"--result-cache must be >= 0 (0 switches it off), not {self.result_cache}")

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    def loop_config(self) -> LoopConfig:
        return LoopConfig(
            samples=self.samples, turns=self.turns, context=ContextPolicy.parse(self.context),
            sampling=SamplingParams(self.temperature, self.top_p, self.max_tokens, list(self.stop), self.seed),
            concurrency=self.concurrency, reward=RewardConfig(profiling_reward=self.profiling_reward),
            templates=PromptTemplates.from_file(self.prompts) if self.prompts else PromptTemplates(),
        )

    def eval_options(self) -> EvalOptions:
        return EvalOptions(device=self.device, timeout_s=self.timeout_s, correctness_trials=self.correctness_trials,
                           perf_trials=self.perf_trials, measure_performance=self.measure_performance,
                           precision=self.precision)


FIXED_ON_RESUME = ("tasks", "model", "levels", "problems", "names", "samples", "context", "temperature", "top_p",
                   "max_tokens", "stop", "seed", "prompts", "profiling_reward", "precision")


class RunDirError(ValueError):
    """The run directory does not fit the request (a run already there, or settings that differ on resume)."""


def prepare_run_dir(run_dir: Path, given: dict[str, Any], resume: bool) -> BenchConfig:
    """The run's configuration: `given` (settings named on the command line) over the saved one when resuming.

    A fresh run refuses a directory that already holds turns, so nothing recorded is overwritten or mixed.
    """
    saved_path = run_dir / CONFIG
    has_turns = (run_dir / TRAJECTORIES).exists() and (run_dir / TRAJECTORIES).stat().st_size > 0
    if not resume:
        if has_turns:
            raise RunDirError(f"{run_dir} already holds a run; pass --resume to continue it, or choose another --out")
        if "tasks" not in given or "model" not in given:
            raise RunDirError("need --tasks and --model (or --resume to continue the run in --out)")
        config = BenchConfig(**given)
    elif not saved_path.exists():
        if has_turns:
            raise RunDirError(f"{run_dir} has turns but no {CONFIG}: cannot tell how they were made")
        if "tasks" not in given or "model" not in given:
            raise RunDirError(f"{run_dir} holds no run to resume (no {CONFIG}); give --tasks and --model to start one")
        config = BenchConfig(**given)
    else:
        saved = read_json(saved_path)
        changed = [key for key in FIXED_ON_RESUME if key in given and given[key] != saved.get(key)]
        if changed:
            listed = ", ".join(f"{key} ({saved.get(key)!r} -> {given[key]!r})" for key in changed)
            raise RunDirError(f"--resume cannot change what the recorded trajectories were made with: {listed}")
        known = {f.name for f in dataclasses.fields(BenchConfig)}
        config = BenchConfig(**{**{k: v for k, v in saved.items() if k in known}, **given})
    write_json(saved_path, config.to_dict())
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


def make_model(config: BenchConfig) -> ChatModel:
    if config.model.startswith(HF_PREFIX):
        return HFChatModel(config.model[len(HF_PREFIX):], device="cuda" if config.device == "cuda" else "cpu",
                           gate=generation_gate(config))
    assert config.base_url is not None
    return OpenAIChatModel(OpenAIChatConfig(config.base_url, config.model, config.api_key_env,
                                            config.request_timeout_s, config.retries))


def generation_gate(config: BenchConfig) -> DeviceGate | None:
    """The device gate of the GPU a local model generates on (the first one), when the embedded scheduler evaluates
    there too: generation then runs beside correctness checks but never while a candidate is timed. A service or
    Ray cluster may evaluate anywhere: put the model on a GPU of its own there."""
    if not config.model.startswith(HF_PREFIX) or config.device != "cuda" or config.service or config.ray:
        return None
    gpus = discover_gpus()
    if not gpus:
        return None
    path = gpu_gate_path(gpus[0])
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    return DeviceGate(path, None)


def open_evaluator(config: BenchConfig) -> tuple[Evaluator, Callable[[], Any]]:
    """The evaluator and how to close it: the service when given, else Ray when given, else the embedded
    scheduler."""
    return open_engine(config.eval_options(), service=config.service, service_token_env=config.service_token_env,
                       ray=config.ray, workers=config.workers, result_cache=config.result_cache)


def open_engine(
    options: EvalOptions,
    service: str | None = None,
    service_token_env: str = "DRKERNEL_TOKEN",
    ray: str | None = None,
    workers: int | None = None,
    result_cache: int = DEFAULT_ENTRIES,
) -> tuple[Evaluator, Callable[[], Any]]:
    """`open_evaluator` for callers without a bench configuration (the framework integrations): a `drkernel serve`
    service at `service`, else a Ray cluster at `ray`, else the embedded scheduler on `options.device`."""
    if service:
        from drkernel.service.client import AsyncClient

        client = AsyncClient(service, token=os.environ.get(service_token_env))
        return ServiceEvaluator(client, options), client.close
    if ray:
        from drkernel.scheduling.ray_backend import RayBackend

        backend: Any = RayBackend(address=ray, device=options.device)
    else:
        from drkernel.scheduling.scheduler import Scheduler

        backend = Scheduler(device=options.device, workers=workers, cache_entries=result_cache)
    return BackendEvaluator(backend, options), backend.close


async def run_bench(
    config: BenchConfig, tasks: list[Task], run_dir: Path, on_turn: Callable[[TurnRecord], None] | None = None
) -> tuple[LoopOutcome, dict[str, Any]]:
    """Run the loop with the configured model and evaluator, then write RUN_DIR/summary.json (also after a fatal
    model error, over what was recorded, saying what is still missing)."""
    model = make_model(config)
    evaluator, close_evaluator = open_evaluator(config)
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
