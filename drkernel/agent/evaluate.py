"""How the loop (and the trainer) judge code: one `Evaluator` protocol over every evaluation engine.

The embedded `Scheduler` and the Ray backend hand back concurrent futures that `asyncio.wrap_future` awaits without
a thread per evaluation; the service has an async client. Either way, many trajectories wait on the evaluator at
once and the evaluator's own queue decides what runs, so the loop adds no serialization of its own.
"""

from __future__ import annotations

import asyncio
from typing import Any, Protocol

from drkernel.errors import EngineError
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
