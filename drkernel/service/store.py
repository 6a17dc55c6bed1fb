"""The service's durable state: submissions, their results and the result cache, in one SQLite file.

Why SQLite in WAL mode with `synchronous=FULL`: a submission is acknowledged only after its row is committed and
fsynced (about 0.3 ms here), so neither a `kill -9` of the server nor a power cut loses work the client was told
about, and other processes may read the file while the server writes it. One connection guarded by a lock keeps
every method thread-safe; each call is one short transaction.

Rows move `queued -> running -> done`. `running` only says the row was handed to a backend: after a restart both
`queued` and `running` rows are evaluated (again), while a `done` row is never written twice (`finish` skips it).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import sqlite3
import threading
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable, Iterator

from drkernel.schema import EvalRequest, EvalResult, HackReason, Status

# Verdicts a rerun reproduces: they depend only on the sources, the options and the device type.
# TIMEOUT and CRASHED are left out: they mix the candidate's behaviour with the machine's state (load, memory
# caps, a killed worker), so a rerun may well end differently.
REPRODUCIBLE_STATUSES = frozenset(
    s.value
    for s in (Status.CORRECT, Status.INCORRECT, Status.HACKED, Status.COMPILE_ERROR, Status.RUNTIME_ERROR,
              Status.INVALID)
)
# Error kinds that blame the harness, not the candidate: the scheduler's lost worker, the sandbox's set-up, a
# backend that raised (drkernel.service.dispatcher).
INFRASTRUCTURE_ERRORS = frozenset({"WorkerLost", "SandboxError", "BackendError"})
# Hack reasons read from timing noise: not reproducible.
TIMING_HACK_REASONS = frozenset({HackReason.SIDE_STREAM.value, HackReason.IMPOSSIBLE_SPEED.value})

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
CREATE INDEX IF NOT EXISTS evaluations_reusable ON evaluations (key) WHERE reusable = 1;
CREATE TABLE IF NOT EXISTS aliases (
    name TEXT PRIMARY KEY,
    id TEXT NOT NULL REFERENCES evaluations (id) ON DELETE CASCADE
);
"""


def infrastructure_failure(result: EvalResult) -> bool:
    """The harness failed, not the candidate: the verdict says nothing about the kernel."""
    return result.error is not None and result.error.kind in INFRASTRUCTURE_ERRORS


def cacheable(result: EvalResult) -> bool:
    """Whether a rerun of the same request on the same device type would give the same verdict."""
    return (
        result.status in REPRODUCIBLE_STATUSES
        and not infrastructure_failure(result)
        and not TIMING_HACK_REASONS.intersection(result.hack_reasons)
    )


def cache_key(request: EvalRequest, device: str) -> str:
    """sha256 of what decides a verdict: both sources, the options, and the device type that runs them.

    The options' `device` is replaced by the resolved device, so "auto" and "cpu" on a CPU server share entries;
    the task name is left out, it changes nothing in the evaluation.
    """
    options = {**request.options.to_dict(), "device": device}
    payload = json.dumps(
        {"reference": request.reference, "candidate": request.candidate, "options": options, "device": device},
        sort_keys=True,
    )
    return hashlib.sha256(payload.encode()).hexdigest()


@dataclass
class Record:
    id: str
    state: str
    result: dict[str, Any] | None
    cached: bool
    submitted_at: float
    finished_at: float | None


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

    # Writes ------------------------------------------------------------------------------------------------

    def add(self, requests: Iterable[tuple[EvalRequest, str]]) -> list[Submitted]:
        """Store (request, cache key) pairs in one committed transaction; cached verdicts answer at once."""
        now, out = time.time(), []
        with self._transaction() as db:
            for request, key in requests:
                row = Submitted(uuid.uuid4().hex, key)
                db.execute(
                    "INSERT INTO evaluations (id, state, key, request, submitted_at) VALUES (?, 'queued', ?, ?, ?)",
                    (row.id, key, json.dumps(request.to_dict()), now),
                )
                hit = self._cached(db, key)
                if hit is not None:
                    row.result = EvalResult.from_json(hit)
                    self._write(db, row.id, row.result, hit, cached=True)
                out.append(row)
        return out

    def mark_running(self, id: str) -> None:
        with self._transaction() as db:
            db.execute("UPDATE evaluations SET state = 'running' WHERE id = ? AND state = 'queued'", (id,))

    def finish(self, ids: list[str], result: EvalResult) -> list[str]:
        """Write one result to `ids` (the first ran it, the others share it as cache hits); never overwrite.

        Returns the ids that were written: a row already done keeps its first result.
        """
        text = result.to_json()
        with self._transaction() as db:
            return [id for position, id in enumerate(ids) if self._write(db, id, result, text, cached=position > 0)]

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
        return None if hit is None else EvalResult.from_json(hit)

    def get(self, id: str) -> Record | None:
        with self._lock:
            row = self._db.execute(
                "SELECT id, state, result, cached, submitted_at, finished_at FROM evaluations WHERE id = ?", (id,)
            ).fetchone()
        if row is None:
            return None
        return Record(row[0], row[1], None if row[2] is None else json.loads(row[2]), bool(row[3]), row[4], row[5])

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

    def close(self) -> None:
        with self._lock:
            self._db.close()

    # Helpers -----------------------------------------------------------------------------------------------

    @staticmethod
    def _cached(db: sqlite3.Connection, key: str) -> str | None:
        """The result JSON of a reproducible verdict stored under `key`, if any."""
        row = db.execute("SELECT result FROM evaluations WHERE key = ? AND reusable = 1 LIMIT 1", (key,)).fetchone()
        return None if row is None else row[0]

    @staticmethod
    def _write(db: sqlite3.Connection, id: str, result: EvalResult, text: str, cached: bool) -> bool:
        """Mark one row done with a result (and its JSON text); False when it was done already."""
        cursor = db.execute(
            "UPDATE evaluations SET state = 'done', result = ?, status = ?, reusable = ?, cached = ?, "
            "finished_at = ? WHERE id = ? AND state != 'done'",
            (text, result.status, cacheable(result), cached, time.time(), id),
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
