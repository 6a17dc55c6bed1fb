"""How the agent loop, the trainer, `drkernel eval`'s batches and the integrations judge code: one `Evaluator`
protocol over every evaluation engine, opened by `open_evaluator` from the engine's name (drkernel.scheduling.engine,
whose `open_backend` it uses for the embedded scheduler and Ray).

The embedded `Scheduler` and the Ray backend hand back concurrent futures that `asyncio.wrap_future` awaits without
a thread per evaluation; the service has an async client. Either way, many trajectories wait on the evaluator at
once and the evaluator's own queue decides what runs, so the loop adds no serialization of its own.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Callable
from typing import Any, Protocol

from drkernel.errors import EngineError
from drkernel.scheduling.engine import EngineConfig, open_backend
from drkernel.scheduling.scheduler import Backend
from drkernel.schema import EvalOptions, EvalRequest, EvalResult
from drkernel.tasks import Task


class Evaluator(Protocol):
    async def evaluate(self, task: Task, code: str) -> EvalResult: ...


class BackendEvaluator:
    """Evaluations on an embedded `Scheduler` or a `RayBackend` (anything with `submit -> Future[EvalResult]`)."""

    def __init__(self, backend: Backend, options: EvalOptions) -> None:
        self.backend, self.options = backend, options

    async def evaluate(self, task: Task, code: str) -> EvalResult:
        future = self.backend.submit(EvalRequest(task.code, code, self.options, task_name=task.key))
        return await asyncio.wrap_future(future)


class ServiceEvaluator:
    """Evaluations on a `drkernel serve` service, through its async client (long-polling, no busy waiting)."""

    def __init__(self, client: Any, options: EvalOptions, timeout_s: float = 3600.0) -> None:
        self.client, self.options, self.timeout_s = client, options, timeout_s  # client: service.client.AsyncClient

    async def evaluate(self, task: Task, code: str) -> EvalResult:
        import httpx

        try:
            return await self.client.evaluate(task.code, code, self.options.to_dict(), timeout=self.timeout_s)
        except httpx.HTTPError as exc:  # the service is down or unreachable: no verdict can be had
            raise EngineError(f"the evaluation service failed: {type(exc).__name__}: {exc}") from exc


def open_evaluator(engine: EngineConfig, options: EvalOptions) -> tuple[Evaluator, Callable[[], Any]]:
    """The evaluator of `engine`, judging with `options`, and how to close it: a call whose result, for the
    service's client, is a coroutine to await in the event loop that used it."""
    if engine.kind == "service":
        from drkernel.service.client import AsyncClient

        client = AsyncClient(engine.name, token=os.environ.get(engine.token_env))
        return ServiceEvaluator(client, options), client.close
    backend = open_backend(engine, options.device)
    return BackendEvaluator(backend, options), backend.close
