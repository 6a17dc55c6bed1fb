"""The FastAPI application: /v1 evaluations, health, workers, Prometheus metrics, and KernelGYM's /evaluate.

`create_app(dispatcher, token, clients)` builds it around a `Dispatcher` (which owns the store and the backend); the
app's lifespan starts the dispatcher (resuming unfinished work) and closes it. Every path but /v1/health needs
`Authorization: Bearer <token>` when a token is given; request bodies are capped before they are read.

Named clients (`clients`: name -> token) are kept apart: each sees only its own submissions, while `token` is the
operator's, who sees them all. A browser, which cannot send a bearer token, gets the dashboard (/dashboard, read-only
GETs) by opening it once with `?token=...`: the answer is a redirect that sets an HttpOnly, SameSite=Strict cookie
holding an HMAC of the token (never the token itself, so the cookie opens nothing but the dashboard).
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import hmac
import http.cookies
import json
import urllib.parse
from typing import Any, AsyncIterator, Mapping, Union

from fastapi import APIRouter, FastAPI, HTTPException, Query, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, PlainTextResponse
from starlette.types import ASGIApp, Receive, Scope, Send

from drkernel.schema import EvalRequest
from drkernel.service import MAX_WAIT_S, dashboard, kernelgym, viewer, visible
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
DASHBOARD_COOKIE = "drkernel_dashboard"
TOKEN_PARAMETER = "token"  # /dashboard?token=...: the browser's way in, once


def create_app(dispatcher: Dispatcher, token: str | None = None, clients: Mapping[str, str] | None = None) -> FastAPI:
    """The app around `dispatcher`, which it starts and closes; `token` (the operator's) and `clients` (name ->
    token) None leave every path open."""

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
    app.add_middleware(Guard, token=token, max_body=MAX_BODY_BYTES, clients=clients)
    app.add_exception_handler(RequestValidationError, _validation_error)  # type: ignore[arg-type]
    app.include_router(_v1(dispatcher))
    app.include_router(_metrics(dispatcher))
    app.include_router(kernelgym.router(dispatcher))
    app.include_router(dashboard.router(dashboard.ServiceEvaluations(dispatcher, separated=bool(clients))))
    return app



def _v1(dispatcher: Dispatcher) -> APIRouter:
    api = APIRouter(prefix="/v1", tags=["evaluations"])

    @api.post("/evaluations", response_model=Union[SubmittedOut, BatchSubmittedOut])
    async def submit(body: SubmissionIn, http: Request) -> dict[str, Any]:
        """Store one evaluation (or a batch under "items"); the answer comes once it is durably stored."""
        items = body.items if isinstance(body, BatchIn) else [body]
        requests = [item.to_request() for item in items]
        for request in requests:
            _check_device(request, dispatcher.device)
        ids = await asyncio.to_thread(dispatcher.submit, requests, viewer(http) or "")
        return {"ids": ids} if isinstance(body, BatchIn) else {"id": ids[0]}

    @api.get("/evaluations/{id}", response_model=EvaluationOut)
    async def get(id: str, http: Request, wait: float = Query(0.0, ge=0.0, le=MAX_WAIT_S)) -> EvaluationOut:
        """The evaluation's state and, once done, its result; `wait` long-polls up to that many seconds."""
        record = await dispatcher.wait(id, timeout=wait)
        if record is None or not visible(record.client, viewer(http)):
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
    """ASGI middleware: who asks (a bearer token; on the dashboard's GETs, its cookie) for all paths but OPEN_PATHS,
    and the body size cap, checked before any work. The named client asking goes to `scope["state"]["client"]`."""

    def __init__(self, app: ASGIApp, token: str | None, max_body: int, clients: Mapping[str, str] | None = None
                 ) -> None:
        self.app, self.max_body = app, max_body
        self.principals: list[tuple[str, str | None]] = [(t, name) for name, t in (clients or {}).items()]
        if token:
            self.principals.append((token, None))
        self.cookies = [(cookie_value(t), who) for t, who in self.principals]

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] in ("http", "websocket"):
            headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope["headers"]}
            found, who = self._principal(scope, headers)
            scope.setdefault("state", {})["client"] = who
            if scope["type"] == "websocket" and not found:  # a WebSocket connection (the OpenEnv server's)
                await send({"type": "websocket.close", "code": 1008, "reason": "missing or wrong bearer token"})
                return
            if scope["type"] == "http":
                refusal = self._refusal(scope, headers, found) or self._cookie_login(scope)
                if refusal is not None:
                    status, body, extra = refusal
                    await _send_json(send, status, body, extra)
                    return
        await self.app(scope, receive, send)

    def _principal(self, scope: Scope, headers: dict[str, str]) -> tuple[bool, str | None]:
        """(authorized, the named client or None); everyone is authorized on a server without tokens."""
        if not self.principals:
            return True, None
        scheme, _, given = headers.get("authorization", "").partition(" ")
        if scheme.lower() == "bearer":
            who = _match(given.strip(), self.principals)
            if who is not None:
                return True, who[0]
        if _dashboard_read(scope):
            cookies: http.cookies.SimpleCookie = http.cookies.SimpleCookie()
            with contextlib.suppress(http.cookies.CookieError):  # a malformed Cookie header is no cookie
                cookies.load(headers.get("cookie", ""))
            cookie = cookies.get(DASHBOARD_COOKIE)
            who = None if cookie is None else _match(cookie.value, self.cookies)
            if who is not None:
                return True, who[0]
        return False, None

    def _refusal(self, scope: Scope, headers: dict[str, str], found: bool) -> tuple[int, dict, dict] | None:
        if not found and scope["path"] not in OPEN_PATHS and not self._token_login(scope):
            message = "missing or wrong bearer token (Authorization: Bearer <token>)"
            if _dashboard_read(scope):
                message += f"; in a browser, open {dashboard.PREFIX}?{TOKEN_PARAMETER}=<token> once"
            return 401, {"detail": message}, {"www-authenticate": "Bearer"}
        if scope["method"] in ("POST", "PUT", "PATCH"):
            length = headers.get("content-length")
            if length is None or not length.isdigit():
                return 411, {"detail": "a Content-Length header is required"}, {}
            if int(length) > self.max_body:
                return 413, {"detail": f"request body of {int(length)} bytes exceeds the {self.max_body} byte limit"}, {}
        return None

    def _token_login(self, scope: Scope) -> bool:
        """A dashboard GET with a right ?token=: answered by `_cookie_login`."""
        return _dashboard_read(scope) and _match(_query_token(scope), self.principals) is not None

    def _cookie_login(self, scope: Scope) -> tuple[int, dict, dict] | None:
        """Trade ?token= for the cookie, and drop the token from the address (history, logs, the Referer)."""
        token = _query_token(scope) if _dashboard_read(scope) else ""
        if not token or not self.principals:
            return None
        if _match(token, self.principals) is None:
            return None  # a wrong ?token= beside a right header or cookie: serve the page
        rest = [(k, v) for k, v in urllib.parse.parse_qsl(scope["query_string"].decode("latin-1"))
                if k != TOKEN_PARAMETER]
        location = scope["path"] + (f"?{urllib.parse.urlencode(rest)}" if rest else "")
        cookie = (f"{DASHBOARD_COOKIE}={cookie_value(token)}; Path={dashboard.PREFIX}; HttpOnly; SameSite=Strict; "
                  f"Max-Age={7 * 86400}")
        return 303, {"detail": "signed in"}, {"location": location, "set-cookie": cookie, "cache-control": "no-store"}


def cookie_value(token: str) -> str:
    """What the dashboard's cookie holds for `token`: an HMAC of it, useless as a bearer token."""
    return hmac.new(token.encode(), b"drkernel dashboard cookie", hashlib.sha256).hexdigest()


def _match(given: str, secrets: list[tuple[str, str | None]]) -> tuple[str | None] | None:
    """(who,) of the secret equal to `given`, compared in constant time against every one; None when none is."""
    found = None
    for secret, who in secrets:
        if hmac.compare_digest(given.encode(), secret.encode()):
            found = (who,)
    return found


def _dashboard_read(scope: Scope) -> bool:
    path = scope["path"]
    return scope.get("method") in ("GET", "HEAD") and (path == dashboard.PREFIX or
                                                   path.startswith(dashboard.PREFIX + "/"))


def _query_token(scope: Scope) -> str:
    query = urllib.parse.parse_qs(scope["query_string"].decode("latin-1"))
    return (query.get(TOKEN_PARAMETER) or [""])[0]


async def _send_json(send: Send, status: int, body: dict[str, Any], headers: dict[str, str]) -> None:
    payload = json.dumps(body).encode()
    raw = [(b"content-type", b"application/json"), (b"content-length", str(len(payload)).encode())]
    raw += [(k.encode(), v.encode()) for k, v in headers.items()]
    await send({"type": "http.response.start", "status": status, "headers": raw})
    await send({"type": "http.response.body", "body": payload})
