"""drkernel as an OpenEnv environment (`pip install drkernel[openenv]`), for the frameworks that take environments
through `openenv-core` (TRL's GRPOTrainer among them).

An episode is one task, several turns: `reset` gives the task's first prompt (the task named by the client, or
drawn from the server's task set with the client's seed); each `step` takes the model's answer, judges it with
`drkernel.agent.loop.judge_answer` (the very function `drkernel bench` uses, so the verdicts and rewards agree) and
returns the reward, the full result and the chat to show the model next (the context policy of `drkernel bench`
applied). The episode is done after `EpisodeConfig.turns` answers.

Three ways to serve it:
- `drkernel-openenv` (drkernel.integrations.openenv_app): the environment with default tasks and its own engine,
  the app OpenEnv's manifest (envs/drkernel_env/openenv.yaml) names;
- `create_server(tasks, evaluator, ...)`: the environment alone, judging with the evaluator it is given (the
  embedded scheduler, Ray, or a `drkernel serve` service through `ServiceEvaluator`);
- `create_service(dispatcher, tasks, ...)`: `drkernel serve`'s own app (its store, backend and token) with the
  environment at /openenv: every answer an episode judges is committed to the service's durable store before it
  runs, shares its result cache, and shows in /v1/evaluations.

    app = create_server(tasks, evaluator, EpisodeConfig(turns=3))     # uvicorn.run(app, ...)
    with KernelEnvClient(base_url="http://host:8000").sync() as env:   # create_service: http://host:8000/openenv
        observation = env.reset(task="level1/19_ReLU").observation
        result = env.step(KernelAction(answer=completion))
"""

from __future__ import annotations

import asyncio
import random
import uuid
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from openenv.core import EnvClient
from openenv.core.client_types import StepResult
from openenv.core.env_server.http_server import create_app
from openenv.core.env_server.interfaces import Environment
from openenv.core.env_server.types import Action, EnvironmentMetadata, Observation, State
from pydantic import Field
from starlette.requests import Request
from starlette.responses import JSONResponse

from drkernel.agent.context import ContextPolicy, ShownTurn, build_messages
from drkernel.scheduling.evaluator import Evaluator
from drkernel.agent.loop import judge_answer
from drkernel.agent.prompts import PromptTemplates, first_turn_prompt
from drkernel.errors import UsageError
from drkernel.rl import RewardConfig
from drkernel.schema import EvalOptions, EvalRequest, EvalResult
from drkernel.tasks import Task

ENV_NAME = "drkernel_env"  # OpenEnv's name for it (envs/drkernel_env: manifest, package, image)
DOCS = "docs/integrations.md"  # in drkernel's source tree, where the environment is documented
# How long a client waits for one reply: an answer's evaluation may take its limit (EvalOptions.timeout_s, 180 s)
# after waiting for the evaluations queued before it (every connection's answers share one engine), so openenv-core's
# 60 s default would give up on evaluations that are still running.
CLIENT_TIMEOUT_S = 900.0


class KernelAction(Action):
    answer: str = Field(description="the model's reply: a ModelNew in a python block")


class KernelObservation(Observation):
    task: str = Field(description="the task's key")
    turn: int = Field(default=0, description="answers judged so far in this episode")
    messages: list[dict[str, str]] = Field(default_factory=list, description="the chat to show the model next")
    feedback: str = Field(default="", description="what the last answer's verdict says to the model")
    status: str | None = Field(default=None, description="the last answer's status (format_error: no code)")
    result: dict[str, Any] | None = Field(default=None, description="the last answer's full EvalResult")


class KernelState(State):
    task: str | None = None
    turns: int = 0  # the episode's length
    rewards: list[float] = Field(default_factory=list)


@dataclass
class EpisodeConfig:
    """An episode's shape; the paper trains with 3 turns and shows every earlier turn."""

    turns: int = 3
    context: ContextPolicy = field(default_factory=ContextPolicy)
    reward: RewardConfig = field(default_factory=RewardConfig)
    templates: PromptTemplates = field(default_factory=PromptTemplates)

    def __post_init__(self) -> None:
        if self.turns < 1:
            raise ValueError(f"an episode has at least one turn, not {self.turns}")


class EpisodeError(UsageError):
    """The client asked for something the episode cannot do (an unknown task, a step before reset or after the
    end): nothing is judged, nothing is lost."""


class KernelEnvironment(Environment[KernelAction, KernelObservation, KernelState]):
    SUPPORTS_CONCURRENT_SESSIONS = True  # episodes share only the evaluator, whose own queue orders the work

    def __init__(self, tasks: Sequence[Task], evaluator: Evaluator, config: EpisodeConfig | None = None) -> None:
        super().__init__()
        if not tasks:
            raise ValueError("an environment needs at least one task")
        self.tasks = {task.key: task for task in tasks}
        self.evaluator, self.config = evaluator, config or EpisodeConfig()
        self._task: Task | None = None
        self._shown: list[ShownTurn] = []
        self._state = KernelState()

    async def reset_async(self, seed: int | None = None, episode_id: str | None = None,
                          task: str | None = None, **_: Any) -> KernelObservation:
        if task is not None and task not in self.tasks:
            raise EpisodeError(f"unknown task {task!r}; this server has {len(self.tasks)} (e.g. {next(iter(self.tasks))})")
        key = task if task is not None else random.Random(seed).choice(sorted(self.tasks))
        self._task, self._shown = self.tasks[key], []
        self._state = KernelState(episode_id=episode_id or uuid.uuid4().hex, step_count=0, task=key,
                                  turns=self.config.turns)
        return KernelObservation(task=key, messages=self._messages(), reward=None, done=False)

    async def step_async(self, action: KernelAction, timeout_s: float | None = None, **_: Any) -> KernelObservation:
        if self._task is None or self._state.step_count >= self.config.turns:
            raise EpisodeError("no episode in progress: reset first (an episode ends after its last turn)")
        judged = await judge_answer(self._task, action.answer, self.evaluator, self.config.reward,
                                    self.config.templates)
        self._shown.append(ShownTurn(action.answer, judged.feedback, judged.reward))
        self._state.step_count += 1
        self._state.rewards.append(judged.reward)
        done = self._state.step_count >= self.config.turns
        return KernelObservation(
            task=self._task.key, turn=self._state.step_count, messages=[] if done else self._messages(),
            feedback=judged.feedback, status=judged.status,
            result=judged.result.to_dict() if judged.result is not None else None, reward=judged.reward, done=done)

    def reset(self, seed: int | None = None, episode_id: str | None = None, **kwargs: Any) -> KernelObservation:
        return asyncio.run(self.reset_async(seed, episode_id, **kwargs))

    def step(self, action: KernelAction, timeout_s: float | None = None, **kwargs: Any) -> KernelObservation:
        return asyncio.run(self.step_async(action, timeout_s, **kwargs))

    @property
    def state(self) -> KernelState:
        return self._state

    def get_metadata(self) -> EnvironmentMetadata:
        from drkernel import __version__

        return EnvironmentMetadata(
            name=ENV_NAME, version=__version__, documentation_url=DOCS, readme_content=__doc__,
            description=f"Triton kernel episodes judged by drkernel (KernelGym): {len(self.tasks)} tasks, "
                        f"{self.config.turns} turns; reset(task=KEY or seed=S), then step(KernelAction(answer))")

    def _messages(self) -> list[dict[str, str]]:
        assert self._task is not None
        messages, _ = build_messages(first_turn_prompt(self._task.code, self.config.templates), self._shown,
                                     self.config.context)
        return messages


OPENENV_PATH = "/openenv"  # where create_service serves the environment


async def _refused_episode(request: Request, exc: Exception) -> JSONResponse:
    """An episode error is the client's (409: nothing was judged, the episode is as it was), not a server fault."""
    return JSONResponse({"detail": str(exc)}, status_code=409)


def _environment_app(tasks: Sequence[Task], evaluator: Evaluator, config: EpisodeConfig | None,
                     max_episodes: int) -> Any:
    app = create_app(lambda: KernelEnvironment(tasks, evaluator, config), KernelAction, KernelObservation,
                     env_name=ENV_NAME, max_concurrent_envs=max_episodes)
    app.add_exception_handler(EpisodeError, _refused_episode)
    return app


def create_server(tasks: Sequence[Task], evaluator: Evaluator, config: EpisodeConfig | None = None,
                  max_episodes: int = 64, token: str | None = None) -> Any:
    """The OpenEnv app (FastAPI) serving episodes over `tasks`; one environment per client connection. With `token`,
    every request and WebSocket must carry `Authorization: Bearer <token>`, as `drkernel serve` asks (openenv-core's
    own client sends no headers: behind a token, use a client that does, or keep the server on a private network)."""
    from drkernel.service.app import MAX_BODY_BYTES, Guard

    app = _environment_app(tasks, evaluator, config, max_episodes)
    app.add_middleware(Guard, token=token, max_body=MAX_BODY_BYTES)
    return app


class DispatcherEvaluator:
    """Judges through a `drkernel serve` dispatcher in this process: each answer is committed to the service's store
    before it runs (so a restart of the server still runs it, though the episode that asked is gone with its
    WebSocket), an answer judged before gets the stored verdict, and /v1/evaluations lists it."""

    def __init__(self, dispatcher: Any, options: EvalOptions) -> None:  # dispatcher: service.dispatcher.Dispatcher
        if options.device not in ("auto", dispatcher.device):
            raise ValueError(f"the service evaluates on {dispatcher.device}, not on {options.device}")
        self.dispatcher, self.options = dispatcher, options

    async def evaluate(self, task: Task, code: str) -> EvalResult:
        request = EvalRequest(task.code, code, self.options, task_name=task.key)
        (id,) = await asyncio.to_thread(self.dispatcher.submit, [request])
        record = await self.dispatcher.wait(id, timeout=None)
        return EvalResult.from_dict(record.result)


def create_service(dispatcher: Any, tasks: Sequence[Task], config: EpisodeConfig | None = None,
                   options: EvalOptions | None = None, max_episodes: int = 64, token: str | None = None) -> Any:
    """`drkernel serve`'s app around `dispatcher` (/v1/evaluations, KernelGYM's /evaluate, /metrics; its store, its
    backend's confinement, its token on every path) with the environment at OPENENV_PATH, judging through the
    dispatcher (`DispatcherEvaluator`) with `options`. The app starts and closes the dispatcher."""
    from drkernel.service.app import create_app as create_service_app

    evaluator = DispatcherEvaluator(dispatcher, options or EvalOptions())
    app = create_service_app(dispatcher, token)
    app.mount(OPENENV_PATH, _environment_app(tasks, evaluator, config, max_episodes))
    return app


class KernelEnvClient(EnvClient[KernelAction, KernelObservation, KernelState]):
    """openenv-core's client for this environment (a WebSocket connection per client: one episode at a time), waiting
    CLIENT_TIMEOUT_S for a reply unless told otherwise."""

    def __init__(self, base_url: str, message_timeout_s: float = CLIENT_TIMEOUT_S, **kwargs: Any) -> None:
        super().__init__(base_url, message_timeout_s=message_timeout_s, **kwargs)

    def _step_payload(self, action: KernelAction) -> dict[str, Any]:
        return {"answer": action.answer}

    def _parse_result(self, payload: dict[str, Any]) -> StepResult[KernelObservation]:
        observation = KernelObservation(**{**payload.get("observation", {}), "reward": payload.get("reward"),
                                           "done": payload.get("done", False)})
        return StepResult(observation=observation, reward=payload.get("reward"), done=payload.get("done", False))

    def _parse_state(self, payload: dict[str, Any]) -> KernelState:
        return KernelState(**payload)
