"""The dashboard: the judge at work (queue, workers, rates, verdicts, reasons, cache) and any verdict in full.

`router(source)` serves the pages of any `Evaluations`: the service's store (`ServiceEvaluations`, in `drkernel
serve`) or bench run folders (`drkernel.report.browse`, in `drkernel report --serve`):

- GET /dashboard: the page, server-rendered; its script polls
- GET /dashboard/data?status=&reason=&task=&client=: the live figures and the latest rows that pass the filters;
- GET /dashboard/evaluations/{id} (and .../reference): one evaluation's page (drkernel.service.pages);
- GET /dashboard/static/{name}: the script and the style sheet, ours (no CDN, nothing from the network).

Why it costs the service nothing measurable: a poll reads through the store's read-only connection (never the lock
that submissions and results take), its answer is computed at most once a second for any number of pollers
(CACHE_S), encoded once, and the figures over the last hour are one aggregate query, however many rows finished in
it. A page in a hidden tab does not poll.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import threading
import time
from importlib import resources
from typing import Any, Callable, Protocol

from fastapi import APIRouter, HTTPException, Query, Request
from fastapi.responses import HTMLResponse, Response

from drkernel.schema import EvalRequest, EvalResult, HackReason, Status
from drkernel.service import viewer, visible
from drkernel.service.dispatcher import Dispatcher
from drkernel.service.pages import PREFIX, EvaluationPage, evaluation_html, render, source_html
from drkernel.service.store import RowFilter

__all__ = ["PREFIX", "Evaluations", "ServiceEvaluations", "router"]

CACHE_S = 2.0  # an answer serves every poll with the same viewer and filters for this long (the pages poll every 2 s)
ROWS = 200  # the latest rows the table shows
HOUR_S, MINUTE_S, REASON_BUCKET_S = 3600, 60, 300
STATES = ("queued", "running")  # a row's state, for the status filter beside the verdicts
STATIC_TYPES = {".js": "text/javascript", ".css": "text/css"}
SECURITY_HEADERS = {  # nothing but our own script runs on these pages, whatever a candidate's source holds
    "content-security-policy": "default-src 'none'; script-src 'self'; style-src 'self' 'unsafe-inline'; "
                               "img-src 'self' data:; connect-src 'self'; frame-ancestors 'none'; base-uri 'none'",
    "x-content-type-options": "nosniff",
    "referrer-policy": "no-referrer",
    "cache-control": "no-store",
}


class Evaluations(Protocol):
    """What the dashboard shows, for a viewer (a named client, or None for who sees everything)."""

    title: str
    group: str  # what the table's group column holds: "client" (the service) or "run" (bench runs)
    live: bool  # a live service: queue, workers, rates (bench runs have rows only)

    def data(self, filters: RowFilter, to: str | None) -> dict[str, Any]: ...

    def page(self, id: str, to: str | None) -> EvaluationPage | None: ...

    def reference(self, id: str, to: str | None) -> tuple[str, str] | None: ...


def router(source: Evaluations) -> APIRouter:
    api = APIRouter(prefix=PREFIX, tags=["dashboard"], include_in_schema=False)
    answers = Memo()  # encoded answers, shared by every poller with the same viewer and filters
    static = {entry.name: entry.read_bytes() for entry in resources.files("drkernel.service").joinpath(
        "static").iterdir() if entry.name[entry.name.rfind("."):] in STATIC_TYPES}

    @api.get("", response_class=HTMLResponse)
    async def index() -> Response:
        return _page(render("dashboard.html.j2", source=source, group=source.group,
                            statuses=[*STATES, *(s.value for s in Status)], reasons=[r.value for r in HackReason]))

    @api.get("/data")
    async def data(http: Request, status: str = Query("", max_length=64), reason: str = Query("", max_length=64),
                   task: str = Query("", max_length=1000), client: str = Query("", max_length=200)) -> Response:
        if status and status not in STATES and status not in Status.__members__.values():
            raise HTTPException(422, f"status must be a state ({', '.join(STATES)}) or a verdict status, not "
                                     f"{status!r}")
        if reason and reason not in HackReason.__members__.values():
            raise HTTPException(422, f"reason must be a hack reason, not {reason!r}")
        filters, who = RowFilter(status, reason, task, client), viewer(http)
        body = await asyncio.to_thread(answers.get, (filters, who), lambda: _json(source.data(filters, who)))
        return Response(body, media_type="application/json", headers=SECURITY_HEADERS)

    @api.get("/evaluations/{id}", response_class=HTMLResponse)
    async def evaluation(id: str, http: Request) -> Response:
        page = await asyncio.to_thread(source.page, id, viewer(http))
        if page is None:
            raise HTTPException(404, f"no evaluation with id {id!r}")
        return _page(evaluation_html(page))

    @api.get("/evaluations/{id}/reference", response_class=HTMLResponse)
    async def reference(id: str, http: Request) -> Response:
        found = await asyncio.to_thread(source.reference, id, viewer(http))
        if found is None:
            raise HTTPException(404, f"no reference for the evaluation {id!r}")
        title, code = found
        return _page(source_html(title, code, f"{PREFIX}/evaluations/{id}"))

    @api.get("/static/{name}")
    async def asset(name: str) -> Response:
        if name not in static:
            raise HTTPException(404, f"no file {name!r}")
        return Response(static[name], media_type=STATIC_TYPES[name[name.rfind("."):]],
                        headers={"cache-control": "max-age=300", "x-content-type-options": "nosniff"})

    return api


def _json(value: Any) -> bytes:
    return json.dumps(value, separators=(",", ":")).encode()


def _page(text: str) -> HTMLResponse:
    return HTMLResponse(text, headers=SECURITY_HEADERS)


class Memo:
    """Answers kept CACHE_S seconds by key: many pollers, one computation a second (a few keys: viewer, filters)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._answers: dict[Any, tuple[float, Any]] = {}

    def get(self, key: Any, compute: Callable[[], Any]) -> Any:
        now = time.monotonic()
        with self._lock:
            kept = self._answers.get(key)
        if kept is not None and now - kept[0] < CACHE_S:
            return kept[1]
        value = compute()
        with self._lock:
            if len(self._answers) > 256:
                self._answers = {k: v for k, v in self._answers.items() if now - v[0] < CACHE_S}
            self._answers[key] = (now, value)
        return value


class ServiceEvaluations:
    """The service's store and backend, as the dashboard shows them; with named clients (`separated`), a client
    sees only its own submissions, while the figures of the workers (no submission's content) are everyone's."""

    title = "drkernel serve"
    group = "client"
    live = True

    def __init__(self, dispatcher: Dispatcher, separated: bool) -> None:
        self.dispatcher, self.store, self.separated = dispatcher, dispatcher.store, separated

    def data(self, filters: RowFilter, to: str | None) -> dict[str, Any]:
        if to is not None:
            filters = dataclasses.replace(filters, client=to)
        return {"live": self._live(to), "rows": self._rows(filters)}

    def page(self, id: str, to: str | None) -> EvaluationPage | None:
        record = self.store.get(id)
        if record is None or not visible(record.client, to):
            return None
        request = self.store.request(id)
        facts = [("id", id), ("submitted", _clock(record.submitted_at)),
                 ("finished", _clock(record.finished_at)), ("cached", "yes" if record.cached else "no")]
        if self.separated:
            facts.insert(1, ("client", record.client or "(operator)"))
        return EvaluationPage(
            title=f"evaluation {id}", task=request.task_name or "(no task name)",
            reference_url=f"{PREFIX}/evaluations/{id}/reference", source=request.candidate,
            result=None if record.result is None else EvalResult.from_dict(record.result), facts=facts,
            state=record.state)

    def reference(self, id: str, to: str | None) -> tuple[str, str] | None:
        record = self.store.get(id)
        if record is None or not visible(record.client, to):
            return None
        request: EvalRequest = self.store.request(id)
        return f"reference of {request.task_name or id}", request.reference

    def _rows(self, filters: RowFilter) -> list[dict[str, Any]]:
        return [{
            "id": row["id"], "state": row["state"], "status": row["status"] or row["state"],
            "task": row["task_name"], "group": row["client"], "reasons": row["hack_reasons"].split(),
            "cached": bool(row["cached"]), "speedup": row["speedup"], "finished_at": row["finished_at"],
            "url": f"{PREFIX}/evaluations/{row['id']}",
        } for row in self.store.latest(filters, ROWS)]

    def _live(self, to: str | None) -> dict[str, Any]:
        now = time.time()
        start = (now // MINUTE_S + 1) * MINUTE_S - HOUR_S  # the last 60 whole minutes, the current one last
        minutes = [{"total": 0, "cached": 0, "by_status": {}} for _ in range(HOUR_S // MINUTE_S)]
        reasons: dict[str, list[int]] = {}
        for minute, status, hack_reasons, rows, cached in self.store.finished_since(start, MINUTE_S, to):
            if not 0 <= minute < len(minutes):
                continue
            bucket = minutes[minute]
            bucket["total"] += rows
            bucket["cached"] += cached or 0
            bucket["by_status"][status] = bucket["by_status"].get(status, 0) + rows
            for reason in hack_reasons.split():
                counts = reasons.setdefault(reason, [0] * (HOUR_S // REASON_BUCKET_S))
                counts[minute * MINUTE_S // REASON_BUCKET_S] += rows
        finished = sum(b["total"] for b in minutes)
        return {
            "now": now, "minute_start": start, "states": self.store.states(to),
            "workers": self.dispatcher.backend.workers(), "minutes": minutes,
            "reasons": sorted(({"reason": r, "total": sum(c), "buckets": c} for r, c in reasons.items()),
                              key=lambda r: -r["total"]),
            "cache_hit_rate": sum(b["cached"] for b in minutes) / finished if finished else None,
            "finished_last_hour": finished,
        }


def _clock(at: float | None) -> str:
    return "-" if at is None else time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(at))
