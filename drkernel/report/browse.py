"""`drkernel report --serve RUN_DIR ...`: bench runs browsed in the dashboard's pages, each judged turn on the page
`drkernel serve` shows for one evaluation (drkernel.service.pages).

The table lists every judged turn, newest first, filtered like the service's (status, reason, task, and the run in
place of the client); a run folder is read again whenever its trajectories.jsonl changes, so a run still going
fills in while it is browsed. Needs the `serve` extra (FastAPI, uvicorn, Jinja2).
"""

from __future__ import annotations

import json
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from fastapi import FastAPI

from drkernel.agent.records import FORMAT_ERROR, TRAJECTORIES
from drkernel.report.runs import RunReadError, read_jsonl
from drkernel.schema import EvalResult
from drkernel.service.app import MAX_BODY_BYTES, Guard
from drkernel.service.dashboard import PREFIX, ROWS, router
from drkernel.service.pages import EvaluationPage
from drkernel.service.store import RowFilter
from drkernel.tasks import load_tasks


class RunEvaluations:
    """The judged turns of bench run folders, as the dashboard shows them (everyone who may open it sees all)."""

    title = "drkernel report"
    group = "run"
    live = False

    def __init__(self, run_dirs: Sequence[str | Path]) -> None:
        self.folders = [Path(d) for d in run_dirs]
        if not self.folders:
            raise RunReadError("no run to serve: give bench run folders")
        for folder in self.folders:
            if not (folder / TRAJECTORIES).is_file():
                raise RunReadError(f"{folder}: no {TRAJECTORIES} (only bench runs can be browsed)")
        names = [f.name for f in self.folders]
        self.names = [n if names.count(n) == 1 else f"{n} #{i + 1}" for i, n in enumerate(names)]
        self._lock = threading.Lock()
        self._read: dict[int, tuple[tuple[int, int], list[tuple[int, dict[str, Any]]]]] = {}
        self._references: dict[int, dict[str, str]] = {}

    def data(self, filters: RowFilter, to: str | None) -> dict[str, Any]:
        rows = []
        for id, run, turn in reversed(self._turns()):
            row = _listed(id, self.names[run], turn)
            if _passes(row, filters):
                rows.append(row)
                if len(rows) == ROWS:
                    break
        return {"live": None, "rows": rows}

    def page(self, id: str, to: str | None) -> EvaluationPage | None:
        found = self._find(id)
        if found is None:
            return None
        run, turn = found
        result = EvalResult.from_dict(turn["result"]) if isinstance(turn.get("result"), dict) else None
        facts = [("run", self.names[run]), ("sample", str(turn.get("sample"))), ("turn", str(turn.get("turn"))),
                 ("reward", str(turn.get("reward")))]
        return EvaluationPage(title=f"{self.names[run]}: {turn.get('task')} sample {turn.get('sample')} turn "
                                    f"{turn.get('turn')}",
                              task=str(turn.get("task")), reference_url=f"{PREFIX}/evaluations/{id}/reference",
                              source=turn.get("code") or turn.get("response") or "", result=result, facts=facts,
                              state="done" if result else FORMAT_ERROR)

    def reference(self, id: str, to: str | None) -> tuple[str, str] | None:
        """The task's code from the run's task source when it is a local path, else the prompt the model saw."""
        found = self._find(id)
        if found is None:
            return None
        run, turn = found
        code = self._tasks(run).get(str(turn.get("task")))
        if code is not None:
            return f"reference of {turn.get('task')}", code
        prompt = "\n\n".join(m.get("content", "") for m in turn.get("messages") or [] if m.get("role") == "user")
        return f"the prompt of {turn.get('task')} (its task source is not on this machine)", prompt

    def _turns(self) -> list[tuple[str, int, dict[str, Any]]]:
        out = []
        for run, folder in enumerate(self.folders):
            path = folder / TRAJECTORIES
            stat = path.stat()
            stamp = (stat.st_mtime_ns, stat.st_size)
            with self._lock:
                kept = self._read.get(run)
            if kept is None or kept[0] != stamp:
                kept = (stamp, read_jsonl(path)[0])
                with self._lock:
                    self._read[run] = kept
            out += [(f"{run}-{line}", run, turn) for line, turn in kept[1]]
        return out

    def _find(self, id: str) -> tuple[int, dict[str, Any]] | None:
        return next(((run, turn) for found, run, turn in self._turns() if found == id), None)

    def _tasks(self, run: int) -> dict[str, str]:
        """Task key -> code from the run's config.json `tasks`, when that is a file or folder here."""
        if run not in self._references:
            config_path = self.folders[run] / "config.json"
            config = json.loads(config_path.read_text()) if config_path.is_file() else {}
            source = config.get("tasks")
            tasks = load_tasks(source) if isinstance(source, str) and Path(source).exists() else []
            self._references[run] = {task.key: task.code for task in tasks}
        return self._references[run]


def _listed(id: str, run: str, turn: dict[str, Any]) -> dict[str, Any]:
    result = turn.get("result") if isinstance(turn.get("result"), dict) else {}
    return {"id": id, "state": "done", "status": result.get("status") or FORMAT_ERROR, "task": str(turn.get("task")),
            "group": run, "reasons": list(result.get("hack_reasons") or []), "cached": bool(result.get("cached")),
            "speedup": result.get("speedup"), "finished_at": None, "url": f"{PREFIX}/evaluations/{id}"}


def _passes(row: dict[str, Any], filters: RowFilter) -> bool:
    return ((not filters.status or row["status"] == filters.status)
            and (not filters.reason or filters.reason in row["reasons"])
            and (not filters.task or filters.task in row["task"])
            and (not filters.client or row["group"] == filters.client))


def create_app(run_dirs: Sequence[str | Path], token: str | None = None) -> FastAPI:
    """The run browser: the dashboard's routes over `run_dirs`, behind the service's guard (token, cookie)."""
    app = FastAPI(title="drkernel report", docs_url=None, redoc_url=None, openapi_url=None)
    app.add_middleware(Guard, token=token, max_body=MAX_BODY_BYTES)
    app.include_router(router(RunEvaluations(run_dirs)))
    return app
