"""The service's durable state: submissions, their results and the result cache, in one SQLite file.

Why SQLite in WAL mode with `synchronous=FULL`: a submission is acknowledged only after its row is committed and
fsynced (about 0.3 ms here), so neither a `kill -9` of the server nor a power cut loses work the client was told
about, and other processes may read the file while the server writes it. One connection guarded by a lock keeps
every method thread-safe; each call is one short transaction.

Rows move `queued -> running -> done`. `running` only says the row was handed to a backend: after a restart both
`queued` and `running` rows are evaluated (again), while a `done` row is never written twice (`finish` skips it).

The dashboard reads through a second, read-only connection with its own lock (`latest`, `finished_since`,
`states`): WAL lets it read while the server writes, so a poller never holds the lock submissions and results take.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import sqlite3
import threading
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable, Iterator

from drkernel.scheduling.cache import as_cached, cacheable
from drkernel.schema import EvalRequest, EvalResult

SCHEMA = """
CREATE TABLE IF NOT EXISTS evaluations (
    seq INTEGER PRIMARY KEY AUTOINCREMENT,
    id TEXT NOT NULL UNIQUE,
    state TEXT NOT NULL CHECK (state IN ('queued', 'running', 'done')),
    key TEXT NOT NULL,
    request TEXT NOT NULL,
    result TEXT,
    status TEXT,
    reusable INTEGER NOT NULL DEFAULT 0,
    cached INTEGER NOT NULL DEFAULT 0,
    submitted_at REAL NOT NULL,
    finished_at REAL
);
CREATE INDEX IF NOT EXISTS evaluations_state ON evaluations (state);
CREATE INDEX IF NOT EXISTS evaluations_finished ON evaluations (finished_at);
CREATE INDEX IF NOT EXISTS evaluations_reusable ON evaluations (key) WHERE reusable = 1;
CREATE TABLE IF NOT EXISTS aliases (
    name TEXT PRIMARY KEY,
    id TEXT NOT NULL REFERENCES evaluations (id) ON DELETE CASCADE
);
"""
# Columns the dashboard lists and filters by, added to a store written before them (ALTER TABLE ... ADD COLUMN)
LISTED_COLUMNS = {
    "task_name": "TEXT NOT NULL DEFAULT ''",
    "client": "TEXT NOT NULL DEFAULT ''",  # the name of the token that submitted it ('' without named clients)
    "hack_reasons": "TEXT NOT NULL DEFAULT ''",  # space-separated, as in the result
    "speedup": "REAL",  # the result's, so a listing parses no result's JSON
}
LATEST_COLUMNS = ("id", "state", "status", "task_name", "client", "hack_reasons", "cached", "submitted_at",
                  "finished_at", "speedup")


@dataclass
class Record:
    id: str
    state: str
    result: dict[str, Any] | None
    cached: bool
    submitted_at: float
    finished_at: float | None
    client: str = ""


@dataclass(frozen=True)
class RowFilter:
    """What the dashboard's table shows: empty fields do not filter; `task` matches a part of the task's name."""

    status: str = ""  # a verdict status, or the state "queued" or "running"
    reason: str = ""
    task: str = ""
    client: str = ""

    def where(self) -> tuple[str, list[Any]]:
        clauses, params = [], []
        if self.status in ("queued", "running"):
            clauses.append("state = ?")
            params.append(self.status)
        elif self.status:
            clauses.append("status = ?")
            params.append(self.status)
        if self.reason:
            clauses.append("instr(' ' || hack_reasons || ' ', ?) > 0")
            params.append(f" {self.reason} ")
        if self.task:
            clauses.append("instr(task_name, ?) > 0")
            params.append(self.task)
        if self.client:
            clauses.append("client = ?")
            params.append(self.client)
        return ("WHERE " + " AND ".join(clauses)) if clauses else "", params


@dataclass
class Submitted:
    """One stored submission; `result` is set when a cached verdict answered it, else it needs a backend."""

    id: str
    key: str
    result: EvalResult | None = None


class Store:
    def __init__(self, path: str | Path) -> None:
        Path(path).parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        # Submissions and results are the server's alone: the file is 0600, and SQLite gives its -wal and -shm
        # files the database file's mode.
        os.close(os.open(path, os.O_RDWR | os.O_CREAT, 0o600))
        os.chmod(path, 0o600)
        self._db = sqlite3.connect(str(path), isolation_level=None, check_same_thread=False)
        self._lock = threading.Lock()
        with self._lock:
            self._db.execute("PRAGMA journal_mode=WAL")
            self._db.execute("PRAGMA synchronous=FULL")
            self._db.execute("PRAGMA foreign_keys=ON")
            self._db.executescript(SCHEMA)
            have = {row[1] for row in self._db.execute("PRAGMA table_info(evaluations)")}
            for column, declaration in LISTED_COLUMNS.items():
                if column not in have:
                    self._db.execute(f"ALTER TABLE evaluations ADD COLUMN {column} {declaration}")
        self._reads = sqlite3.connect(f"{Path(path).resolve().as_uri()}?mode=ro", uri=True, check_same_thread=False)
        self._reads_lock = threading.Lock()

    # Writes ------------------------------------------------------------------------------------------------

    def add(self, requests: Iterable[tuple[EvalRequest, str]], client: str = "") -> list[Submitted]:
        """Store (request, cache key) pairs of `client` in one committed transaction; cached verdicts answer at
        once."""
        now, out = time.time(), []
        with self._transaction() as db:
            for request, key in requests:
                row = Submitted(uuid.uuid4().hex, key)
                db.execute(
                    "INSERT INTO evaluations (id, state, key, request, submitted_at, task_name, client) "
                    "VALUES (?, 'queued', ?, ?, ?, ?, ?)",
                    (row.id, key, json.dumps(request.to_dict()), now, request.task_name, client),
                )
                hit = self._cached(db, key)
                if hit is not None:
                    row.result = as_cached(EvalResult.from_json(hit))
                    self._write(db, row.id, row.result, cached=True)
                out.append(row)
        return out

    def mark_running(self, id: str) -> None:
        with self._transaction() as db:
            db.execute("UPDATE evaluations SET state = 'running' WHERE id = ? AND state = 'queued'", (id,))

    def finish(self, ids: list[str], result: EvalResult) -> list[str]:
        """Write one result to `ids` (the first ran it, the others share it as cache hits); never overwrite.

        Returns the ids that were written: a row already done keeps its first result.
        """
        shared = as_cached(result)
        with self._transaction() as db:
            return [id for position, id in enumerate(ids)
                    if self._write(db, id, shared if position else result, cached=bool(position) or result.cached)]

    def alias(self, name: str, id: str) -> None:
        """Let a client's own name (KernelGYM's task_id) point at an evaluation."""
        with self._transaction() as db:
            db.execute("INSERT OR REPLACE INTO aliases (name, id) VALUES (?, ?)", (name, id))

    def purge(self, older_than_s: float) -> int:
        """Delete done rows finished more than `older_than_s` ago (their aliases go with them)."""
        with self._transaction() as db:
            cursor = db.execute(
                "DELETE FROM evaluations WHERE state = 'done' AND finished_at < ?", (time.time() - older_than_s,)
            )
            return cursor.rowcount

    # Reads -------------------------------------------------------------------------------------------------

    def cached(self, key: str) -> EvalResult | None:
        with self._lock:
            hit = self._cached(self._db, key)
        return None if hit is None else as_cached(EvalResult.from_json(hit))

    def get(self, id: str) -> Record | None:
        with self._lock:
            row = self._db.execute(
                "SELECT id, state, result, cached, submitted_at, finished_at, client FROM evaluations WHERE id = ?",
                (id,),
            ).fetchone()
        if row is None:
            return None
        return Record(row[0], row[1], None if row[2] is None else json.loads(row[2]), bool(row[3]), row[4], row[5],
                      row[6])

    def request(self, id: str) -> EvalRequest:
        with self._lock:
            (text,) = self._db.execute("SELECT request FROM evaluations WHERE id = ?", (id,)).fetchone()
        return EvalRequest.from_dict(json.loads(text))

    def resolve(self, name: str) -> str | None:
        with self._lock:
            row = self._db.execute("SELECT id FROM aliases WHERE name = ?", (name,)).fetchone()
        return None if row is None else row[0]

    def unfinished(self) -> list[tuple[str, str]]:
        """(id, key) of every queued or running row, oldest first: the work a restart must finish."""
        with self._lock:
            return self._db.execute(
                "SELECT id, key FROM evaluations WHERE state != 'done' ORDER BY seq"
            ).fetchall()

    def counts(self) -> dict[str, int]:
        """Rows per state (queued, running, done)."""
        with self._lock:
            rows = self._db.execute("SELECT state, COUNT(*) FROM evaluations GROUP BY state").fetchall()
        return {"queued": 0, "running": 0, "done": 0, **dict(rows)}

    # Dashboard reads (the read-only connection) ------------------------------------------------------------

    def states(self, client: str | None = None) -> dict[str, int]:
        """Rows per state, of one client's submissions or (None) of all."""
        rows = self._read("SELECT state, COUNT(*) FROM evaluations WHERE ?1 IS NULL OR client = ?1 GROUP BY state",
                          (client,))
        return {"queued": 0, "running": 0, "done": 0, **dict(rows)}

    def latest(self, filters: RowFilter, limit: int) -> list[dict[str, Any]]:
        """The newest rows that pass `filters` (LATEST_COLUMNS), newest first."""
        where, params = filters.where()
        rows = self._read(f"SELECT {', '.join(LATEST_COLUMNS)} FROM evaluations {where} ORDER BY seq DESC LIMIT ?",
                          (*params, limit))
        return [dict(zip(LATEST_COLUMNS, row)) for row in rows]

    def finished_since(self, since: float, bucket_s: float, client: str | None = None) -> list[tuple[Any, ...]]:
        """(bucket, status, hack_reasons, rows, cached rows) of the rows finished since `since`, `bucket` counting
        `bucket_s` seconds from `since`: one short aggregate however many rows there are."""
        return self._read(
            "SELECT CAST((finished_at - ?1) / ?2 AS INTEGER), status, hack_reasons, COUNT(*), SUM(cached) "
            "FROM evaluations WHERE finished_at >= ?1 AND (?3 IS NULL OR client = ?3) GROUP BY 1, 2, 3",
            (since, bucket_s, client))

    def close(self) -> None:
        with self._reads_lock:
            self._reads.close()
        with self._lock:
            self._db.close()

    # Helpers -----------------------------------------------------------------------------------------------

    @staticmethod
    def _cached(db: sqlite3.Connection, key: str) -> str | None:
        """The result JSON of a reproducible verdict stored under `key`, if any."""
        row = db.execute("SELECT result FROM evaluations WHERE key = ? AND reusable = 1 LIMIT 1", (key,)).fetchone()
        return None if row is None else row[0]

    def _read(self, sql: str, params: tuple[Any, ...]) -> list[tuple[Any, ...]]:
        with self._reads_lock:
            return self._reads.execute(sql, params).fetchall()

    @staticmethod
    def _write(db: sqlite3.Connection, id: str, result: EvalResult, cached: bool) -> bool:
        """Mark one row done with a result; False when it was done already."""
        cursor = db.execute(
            "UPDATE evaluations SET state = 'done', result = ?, status = ?, reusable = ?, cached = ?, "
            "finished_at = ?, hack_reasons = ?, speedup = ? WHERE id = ? AND state != 'done'",
            (result.to_json(), result.status, cacheable(result), cached, time.time(), " ".join(result.hack_reasons),
             _finite(result.speedup), id),
        )
        return cursor.rowcount > 0

    @contextlib.contextmanager
    def _transaction(self) -> Iterator[sqlite3.Connection]:
        """Hold the lock for one BEGIN IMMEDIATE ... COMMIT, rolled back on any error."""
        with self._lock:
            self._db.execute("BEGIN IMMEDIATE")
            try:
                yield self._db
            except BaseException:
                self._db.execute("ROLLBACK")
                raise
            self._db.execute("COMMIT")


def _finite(value: float | None) -> float | None:
    """A number for a column the dashboard sends as JSON, which has no NaN or infinity."""
    return value if value is not None and math.isfinite(value) else None
