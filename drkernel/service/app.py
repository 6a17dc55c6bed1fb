"""The FastAPI application: /v1 evaluations, health, workers, Prometheus metrics, and KernelGYM's /evaluate.

`create_app(dispatcher, token)` builds it around a `Dispatcher` (which owns the store and the backend); the app's
lifespan starts the dispatcher (resuming unfinished work) and closes it. Every path but /v1/health needs
`Authorization: Bearer <token>` when a token is given; request bodies are capped before they are read.
"""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import json
from typing import Any, AsyncIterator, Union

from fastapi import APIRouter, FastAPI, HTTPException, Query, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, PlainTextResponse
from starlette.types import ASGIApp, Receive, Scope, Send

from drkernel.schema import EvalRequest
from drkernel.service import MAX_WAIT_S, kernelgym
from drkernel.service.dispatcher import Dispatcher
from drkernel.service.models import (
    SUBMISSION_TAGS,
    BatchIn,
    BatchSubmittedOut,
    EvaluationOut,
    HealthOut,
    SubmissionIn,
    SubmittedOut,
)

HEALTH_PATH = "/v1/health"
# Open without the token: the health probe, and the API's description, which a browser cannot send a bearer token to
OPEN_PATHS = frozenset({HEALTH_PATH, "/docs", "/docs/oauth2-redirect", "/redoc", "/openapi.json"})
MAX_BODY_BYTES = 64 << 20  # a batch of 1000 items fits unless its sources are large
PROMETHEUS_TEXT = "text/plain; version=0.0.4; charset=utf-8"


def create_app(dispatcher: Dispatcher, token: str | None = None) -> FastAPI:
    """The app around `dispatcher`, which it starts and closes; `token` None leaves every path open."""

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        dispatcher.start()
        yield
        await asyncio.to_thread(dispatcher.close)

    app = FastAPI(
        title="KernelGym",
        summary="Evaluate LLM-written Triton kernels: correctness, speed, and reward-hacking verdicts.",
        version="1.0",
        lifespan=lifespan,
    )
    app.add_middleware(Guard, token=token, max_body=MAX_BODY_BYTES)
    app.add_exception_handler(RequestValidationError, _validation_error)  # type: ignore[arg-type]
    app.include_router(_v1(dispatcher))
    app.include_router(_metrics(dispatcher))
    app.include_router(kernelgym.router(dispatcher))
    return app


def _v1(dispatcher: Dispatcher) -> APIRouter:
    api = APIRouter(prefix="/v1", tags=["evaluations"])

    @api.post("/evaluations", response_model=Union[SubmittedOut, BatchSubmittedOut])
    async def submit(body: SubmissionIn) -> dict[str, Any]:
        """Store one evaluation (or a batch under "items"); the answer comes once it is durably stored."""
        items = body.items if isinstance(body, BatchIn) else [body]
        requests = [item.to_request() for item in items]
        for request in requests:
            _check_device(request, dispatcher.device)
        ids = await asyncio.to_thread(dispatcher.submit, requests)
        return {"ids": ids} if isinstance(body, BatchIn) else {"id": ids[0]}

    @api.get("/evaluations/{id}", response_model=EvaluationOut)
    async def get(id: str, wait: float = Query(0.0, ge=0.0, le=MAX_WAIT_S)) -> EvaluationOut:
        """The evaluation's state and, once done, its result; `wait` long-polls up to that many seconds."""
        record = await dispatcher.wait(id, timeout=wait)
        if record is None:
            raise HTTPException(404, f"no evaluation with id {id!r}")
        return EvaluationOut(id=record.id, state=record.state, result=record.result)  # type: ignore[arg-type]

    @api.get("/health", response_model=HealthOut)
    async def health() -> HealthOut:
        """Liveness, without authentication."""
        return HealthOut(device=dispatcher.device)

    @api.get("/workers")
    async def workers() -> list[dict[str, Any]]:
        """The backend's workers (processes or Ray actors) and what each is doing."""
        return await asyncio.to_thread(dispatcher.backend.workers)

    return api


def _metrics(dispatcher: Dispatcher) -> APIRouter:
    api = APIRouter(tags=["monitoring"])

    @api.get("/metrics", response_class=PlainTextResponse)
    async def metrics() -> PlainTextResponse:
        """Prometheus text format: rows per state, verdicts, durations, cache hits, worker restarts."""
        counts = await asyncio.to_thread(dispatcher.store.counts)
        workers = await asyncio.to_thread(dispatcher.backend.workers)
        return PlainTextResponse(prometheus_text(dispatcher, counts, workers), media_type=PROMETHEUS_TEXT)

    return api


def prometheus_text(dispatcher: Dispatcher, counts: dict[str, int], workers: list[dict[str, Any]]) -> str:
    m = dispatcher.metrics.snapshot()
    restarts = sum(int(w.get("restarts") or 0) for w in workers)  # type: ignore[call-overload]
    families = [
        ("drkernel_evaluations", "gauge", "Evaluations in the store, by state.",
         [(f'{{state="{s}"}}', n) for s, n in sorted(counts.items())]),
        ("drkernel_evaluations_finished_total", "counter", "Evaluations finished since start, by verdict status.",
         [(f'{{status="{s}"}}', n) for s, n in sorted(m.by_status.items())]),
        ("drkernel_evaluation_duration_seconds", "summary", "Wall time of evaluations that ran (no cache hits).",
         [("_sum", round(m.duration_sum_s, 6)), ("_count", m.duration_count)]),
        ("drkernel_cache_hits_total", "counter", "Submissions answered by the result cache since start.",
         [("", m.cache_hits)]),
        ("drkernel_worker_restarts_total", "counter", "Worker processes (or actors) restarted by the backend.",
         [("", restarts)]),
        ("drkernel_workers", "gauge", "Workers of the backend.", [("", len(workers))]),
    ]
    lines = []
    for name, kind, help, samples in families:
        lines += [f"# HELP {name} {help}", f"# TYPE {name} {kind}"]
        lines += [f"{name}{suffix} {value}" for suffix, value in samples]
    return "\n".join(lines) + "\n"


def _check_device(request: EvalRequest, device: str) -> None:
    """A request for another device than the server's would silently run on the wrong one: refuse it."""
    if request.options.device not in ("auto", device):
        raise HTTPException(422, f"this server evaluates on {device}: options.device must be 'auto' or '{device}', "
                                 f"not {request.options.device!r}")


async def _validation_error(request: Request, exc: RequestValidationError) -> JSONResponse:
    """422 with each error's location and message, and without echoing the (possibly megabyte) input back."""
    errors = [{"loc": [p for p in e["loc"] if p not in SUBMISSION_TAGS], "msg": e["msg"], "type": e["type"]}
              for e in exc.errors()]
    message = "; ".join(f"{'.'.join(str(p) for p in e['loc'][1:]) or 'body'}: {e['msg']}" for e in errors)
    return JSONResponse({"detail": errors, "message": message}, status_code=422)


class Guard:
    """ASGI middleware: the bearer token (all paths but OPEN_PATHS) and the body size cap, checked before any work."""

    def __init__(self, app: ASGIApp, token: str | None, max_body: int) -> None:
        self.app, self.token, self.max_body = app, token, max_body

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope["headers"]}
            refusal = self._refusal(scope, headers)
            if refusal is not None:
                status, message, extra = refusal
                await _send_json(send, status, {"detail": message}, extra)
                return
        elif scope["type"] == "websocket" and self.token:  # a WebSocket connection (the OpenEnv server's) is refused
            headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope["headers"]}
            if not self._authorized(headers):
                await send({"type": "websocket.close", "code": 1008, "reason": "missing or wrong bearer token"})
                return
        await self.app(scope, receive, send)

    def _refusal(self, scope: Scope, headers: dict[str, str]) -> tuple[int, str, dict[str, str]] | None:
        if self.token and scope["path"] not in OPEN_PATHS and not self._authorized(headers):
            return 401, "missing or wrong bearer token (Authorization: Bearer <token>)", {"www-authenticate": "Bearer"}
        if scope["method"] in ("POST", "PUT", "PATCH"):
            length = headers.get("content-length")
            if length is None or not length.isdigit():
                return 411, "a Content-Length header is required", {}
            if int(length) > self.max_body:
                return 413, f"request body of {int(length)} bytes exceeds the {self.max_body} byte limit", {}
        return None

    def _authorized(self, headers: dict[str, str]) -> bool:
        scheme, _, given = headers.get("authorization", "").partition(" ")
        assert self.token is not None
        return scheme.lower() == "bearer" and hmac.compare_digest(given.strip().encode(), self.token.encode())


async def _send_json(send: Send, status: int, body: dict[str, Any], headers: dict[str, str]) -> None:
    payload = json.dumps(body).encode()
    raw = [(b"content-type", b"application/json"), (b"content-length", str(len(payload)).encode())]
    raw += [(k.encode(), v.encode()) for k, v in headers.items()]
    await send({"type": "http.response.start", "status": status, "headers": raw})
    await send({"type": "http.response.body", "body": payload})
