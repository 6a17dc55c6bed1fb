"""drkernel's OpenEnv server with nothing to write: `drkernel-openenv` (the console script), `python -m
drkernel.integrations.openenv_app`, or the module's `app` (what OpenEnv's manifest, envs/drkernel_env/openenv.yaml,
names, and what `uvicorn drkernel.integrations.openenv_app:app` serves).

Why a module of its own: OpenEnv publishes an environment as an importable `app` plus a `main()`, configured by
the environment (a container's variables), not by Python. By default the tasks are the synthetic family's train
split and the example tasks of a source tree or the image (examples/tasks, when present); KernelBench joins by
path (`--tasks PATH`, or `--tasks hub:` where the hub is reachable). Each flag has a variable, DRKERNEL_ENV_<NAME>
(`--eval-timeout-s` is DRKERNEL_ENV_EVAL_TIMEOUT_S); the bearer token is read from DRKERNEL_TOKEN.
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

from drkernel.scheduling.evaluator import Evaluator, open_evaluator
from drkernel.errors import UsageError
from drkernel.integrations.openenv import EpisodeConfig, create_server
from drkernel.scheduling.engine import EngineConfig
from drkernel.schema import EvalOptions, EvalResult
from drkernel.tasks import Task, load_tasks
from drkernel.tasks.synthetic import generate_tasks

EXAMPLE_TASKS = "examples/tasks"  # relative to the working folder: a source tree's, or the image's /app
VARIABLE_PREFIX = "DRKERNEL_ENV_"
TOKEN_VARIABLE = "DRKERNEL_TOKEN"


@dataclass(frozen=True)
class AppSettings:
    """The server's settings; every field is a flag (--name-with-dashes) and a variable (DRKERNEL_ENV_NAME)."""

    tasks: tuple[str, ...] = ()  # task sources beside the defaults (anything `drkernel.tasks.load_tasks` reads)
    synthetic: int = 64  # tasks of the synthetic family's train split (0: none)
    shape_scale: float = 1.0  # of the synthetic shapes: 1 for a datacenter GPU, 1/256 for a CPU
    examples: bool = True  # add examples/tasks when the working folder has it
    turns: int = 3
    engine: str = "embedded"  # embedded, ray:ADDRESS or a `drkernel serve` URL (its token in DRKERNEL_TOKEN)
    workers: int | None = None  # of the embedded engine
    device: str = "auto"
    eval_timeout_s: float = 180.0
    max_episodes: int = 64
    host: str = "0.0.0.0"
    port: int = 8000

    def __post_init__(self) -> None:
        if self.turns < 1 or self.max_episodes < 1 or self.synthetic < 0 or not self.shape_scale > 0:
            raise UsageError("turns and max_episodes must be positive, synthetic not negative, shape_scale positive")

    @classmethod
    def from_environment(cls, environ: Mapping[str, str] = os.environ) -> AppSettings:
        """The defaults, overridden by each DRKERNEL_ENV_<NAME> variable that is set (tasks: comma-separated)."""
        values: dict[str, Any] = {}
        for f in fields(cls):
            text = environ.get(VARIABLE_PREFIX + f.name.upper())
            if text is not None:
                values[f.name] = _parse(f.name, text)
        return cls(**values)

    def task_set(self) -> list[Task]:
        tasks = [task for source in self.tasks for task in load_tasks(source)]
        if self.examples and Path(EXAMPLE_TASKS).is_dir():
            tasks += load_tasks(EXAMPLE_TASKS)
        if self.synthetic:
            tasks += generate_tasks("train", self.synthetic, shape_scale=self.shape_scale)
        if not tasks:
            raise UsageError("no tasks: give --tasks, or leave --synthetic above 0")
        keys = [t.key for t in tasks]
        if duplicated := sorted({k for k in keys if keys.count(k) > 1}):
            raise UsageError(f"two tasks share each of the keys {', '.join(duplicated)}")
        return tasks

    def options(self) -> EvalOptions:
        return EvalOptions(device=self.device, timeout_s=self.eval_timeout_s)


def _parse(name: str, text: str) -> Any:
    kinds = {"tasks": lambda t: tuple(s for s in t.split(",") if s), "synthetic": int, "shape_scale": float,
             "examples": lambda t: t.lower() in ("1", "true", "yes"), "turns": int, "workers": lambda t: int(t) or None,
             "eval_timeout_s": float, "max_episodes": int, "port": int}
    try:
        return kinds.get(name, str)(text)
    except ValueError as exc:
        raise UsageError(f"{VARIABLE_PREFIX}{name.upper()}={text!r}: {exc}") from exc


class EngineEvaluator:
    """The configured engine, opened when the server starts and closed when it stops (not at import: importing the
    app, as OpenEnv's tools and uvicorn do, must not start evaluation workers)."""

    def __init__(self, engine: EngineConfig, options: EvalOptions) -> None:
        self.engine, self.options = engine, options
        self._evaluator: Evaluator | None = None
        self._close: Any = None

    async def open(self) -> None:
        self._evaluator, self._close = open_evaluator(self.engine, self.options)

    async def close(self) -> None:
        if self._close is not None:
            closed = self._close()
            if hasattr(closed, "__await__"):
                await closed
        self._evaluator = self._close = None

    async def evaluate(self, task: Task, code: str) -> EvalResult:
        if self._evaluator is None:
            raise RuntimeError("the evaluation engine is not open: the server has not started, or has stopped")
        return await self._evaluator.evaluate(task, code)


def build_app(settings: AppSettings) -> Any:
    """The OpenEnv app of `settings`: `create_server` over the task set, judging on an engine opened at start-up."""
    evaluator = EngineEvaluator(EngineConfig(name=settings.engine, workers=settings.workers), settings.options())
    app = create_server(settings.task_set(), evaluator, EpisodeConfig(turns=settings.turns),
                        max_episodes=settings.max_episodes, token=os.environ.get(TOKEN_VARIABLE))
    app.router.on_startup.append(evaluator.open)
    app.router.on_shutdown.append(evaluator.close)
    return app


def parse_settings(argv: Sequence[str] | None = None, environ: Mapping[str, str] = os.environ) -> AppSettings:
    """Flags over variables over defaults."""
    base = AppSettings.from_environment(environ)
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--tasks", action="append", metavar="SPEC", help="a task source beside the defaults (repeatable)")
    p.add_argument("--synthetic", type=int, help=f"synthetic train tasks (default {base.synthetic}; 0: none)")
    p.add_argument("--shape-scale", type=float, help=f"synthetic shapes' scale (default {base.shape_scale})")
    p.add_argument("--no-examples", dest="examples", action="store_false", default=None,
                   help=f"leave out {EXAMPLE_TASKS}")
    p.add_argument("--turns", type=int, help=f"answers per episode (default {base.turns})")
    p.add_argument("--engine", help=f"embedded, ray:ADDRESS or a drkernel serve URL (default {base.engine})")
    p.add_argument("--workers", type=int, help="workers of the embedded engine")
    p.add_argument("--device", choices=("auto", "cpu", "cuda"), help=f"evaluation device (default {base.device})")
    p.add_argument("--eval-timeout-s", type=float, help=f"limit of one evaluation (default {base.eval_timeout_s})")
    p.add_argument("--max-episodes", type=int, help=f"concurrent episodes (default {base.max_episodes})")
    p.add_argument("--host", help=f"default {base.host}")
    p.add_argument("--port", type=int, help=f"default {base.port}")
    given = {k: v for k, v in vars(p.parse_args(argv)).items() if v is not None}
    if "tasks" in given:
        given["tasks"] = base.tasks + tuple(given["tasks"])
    try:
        return AppSettings(**{**{f.name: getattr(base, f.name) for f in fields(base)}, **given})
    except UsageError as exc:
        p.error(str(exc))


def main(argv: Sequence[str] | None = None) -> int:
    import uvicorn

    settings = parse_settings(argv)
    uvicorn.run(build_app(settings), host=settings.host, port=settings.port)
    return 0


app = build_app(AppSettings.from_environment())

if __name__ == "__main__":
    raise SystemExit(main())
