"""The service's SQLite store: durable rows, results written once, the cache policy, retention, thread safety."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest

from drkernel.schema import ErrorInfo, EvalOptions, EvalRequest, EvalResult, Status
from drkernel.scheduling.cache import cache_key, cacheable
from drkernel.service.store import RowFilter, Store


def request(candidate: str = "class ModelNew: ...", **options: object) -> EvalRequest:
    return EvalRequest("class Model: ...", candidate, EvalOptions.from_dict(options))


def verdict(status: Status, kind: str | None = None, hacks: list[str] | None = None) -> EvalResult:
    error = ErrorInfo(kind=kind, message="...") if kind else None
    return EvalResult(status=status.value, correct=status is Status.CORRECT, error=error, hack_reasons=hacks or [],
                      duration_s=0.5)


@pytest.fixture
def store(tmp_path: Path):
    store = Store(tmp_path / "store.db")
    yield store
    store.close()


def add_one(store: Store, req: EvalRequest | None = None) -> str:
    req = req or request()
    (row,) = store.add([(req, cache_key(req, "cpu"))])
    return row.id


def test_rows_move_from_queued_to_done_and_survive_a_reopen(tmp_path: Path) -> None:
    store = Store(tmp_path / "s.db")
    first, second = add_one(store, request("a")), add_one(store, request("b"))
    store.mark_running(first)
    assert [store.get(i).state for i in (first, second)] == ["running", "queued"]  # type: ignore[union-attr]
    store.close()
    store = Store(tmp_path / "s.db")  # what a restarted server sees
    assert [id for id, _ in store.unfinished()] == [first, second]
    assert store.finish([first], verdict(Status.CORRECT)) == [first]
    assert store.counts() == {"queued": 1, "running": 0, "done": 1}
    assert store.get(first).result["status"] == "correct"  # type: ignore[union-attr]
    assert store.request(second).candidate == "b"
    store.close()


def test_a_done_row_keeps_its_first_result(store: Store) -> None:
    id = add_one(store)
    assert store.finish([id], verdict(Status.INCORRECT)) == [id]
    assert store.finish([id], verdict(Status.CORRECT)) == []
    assert store.get(id).result["status"] == "incorrect"  # type: ignore[union-attr]


@pytest.mark.parametrize(
    ("result", "reusable"),
    [
        (verdict(Status.CORRECT), True),
        (verdict(Status.INCORRECT), True),
        (verdict(Status.HACKED, hacks=["no_triton_kernel"]), True),
        (verdict(Status.COMPILE_ERROR, "SyntaxError"), True),
        (verdict(Status.RUNTIME_ERROR, "ValueError"), True),
        (verdict(Status.INVALID, "NoModelNew"), True),
        (verdict(Status.TIMEOUT, "Timeout"), False),  # depends on the machine's load
        (verdict(Status.CRASHED, "Signal"), False),  # may be a memory cap, a neighbour, a killed harness
        (verdict(Status.CRASHED, "WorkerLost"), False),  # infrastructure
        (verdict(Status.INVALID, "SandboxError"), False),  # the sandbox's own set-up failed
        (verdict(Status.HACKED, hacks=["impossible_speed"]), False),  # read from timing noise
    ],
)
def test_only_reproducible_verdicts_answer_duplicates(store: Store, result: EvalResult, reusable: bool) -> None:
    assert cacheable(result) is reusable
    first = add_one(store)
    store.finish([first], result)
    (duplicate,) = store.add([(request(), cache_key(request(), "cpu"))])
    assert (duplicate.result is not None) is reusable
    record = store.get(duplicate.id)
    assert record is not None and (record.state == "done") is reusable and record.cached is reusable
    if reusable:
        assert record.result == {**result.to_dict(), "cached": True}  # the same verdict, marked as shared


def test_the_cache_key_is_what_decides_a_verdict() -> None:
    base = cache_key(request(), "cpu")
    assert cache_key(request(device="cpu"), "cpu") == base  # "auto" resolved on this server is "cpu"
    assert cache_key(EvalRequest("class Model: ...", "class ModelNew: ...", task_name="x"), "cpu") != base  # never across tasks
    assert cache_key(request(), "cuda") != base
    assert cache_key(request(seed=7), "cpu") != base
    assert cache_key(request("other"), "cpu") != base


def test_finish_shares_one_result_among_twins(store: Store) -> None:
    ids = [add_one(store) for _ in range(3)]
    assert store.finish(ids, verdict(Status.CORRECT)) == ids
    assert [store.get(i).cached for i in ids] == [False, True, True]  # type: ignore[union-attr]


def test_retention_deletes_old_done_rows_and_their_aliases(store: Store) -> None:
    old, fresh, waiting = add_one(store, request("a")), add_one(store, request("b")), add_one(store, request("c"))
    store.finish([old], verdict(Status.CORRECT))
    store.alias("task-1", old)
    time.sleep(0.2)
    store.finish([fresh], verdict(Status.CORRECT))
    assert store.purge(older_than_s=0.1) == 1
    assert store.get(old) is None and store.resolve("task-1") is None
    assert store.get(fresh) is not None and store.get(waiting) is not None  # unfinished work is never purged


def test_concurrent_writers_lose_nothing(store: Store) -> None:
    ids: list[str] = []
    lock = threading.Lock()

    def work(n: int) -> None:
        for i in range(25):
            id = add_one(store, request(f"{n}-{i}"))
            store.mark_running(id)
            store.finish([id], verdict(Status.CORRECT))
            with lock:
                ids.append(id)

    threads = [threading.Thread(target=work, args=(n,)) for n in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    assert len(set(ids)) == 200
    assert store.counts() == {"queued": 0, "running": 0, "done": 200}


def test_the_store_and_its_wal_are_readable_by_the_server_only(tmp_path: Path) -> None:
    path = tmp_path / "private" / "store.db"
    store = Store(path)
    try:
        store.add([(request(), "key")])
        modes = {p.name: p.stat().st_mode & 0o777 for p in path.parent.iterdir()}
    finally:
        store.close()
    assert modes == {"store.db": 0o600, "store.db-wal": 0o600, "store.db-shm": 0o600}
    assert path.parent.stat().st_mode & 0o777 == 0o700


def test_a_store_from_before_the_dashboard_gains_its_columns(tmp_path: Path) -> None:
    import sqlite3

    path = tmp_path / "old.db"
    with sqlite3.connect(path) as db:  # the evaluations table as it was, with one finished row
        db.execute("CREATE TABLE evaluations (seq INTEGER PRIMARY KEY AUTOINCREMENT, id TEXT NOT NULL UNIQUE, "
                   "state TEXT NOT NULL, key TEXT NOT NULL, request TEXT NOT NULL, result TEXT, status TEXT, "
                   "reusable INTEGER NOT NULL DEFAULT 0, cached INTEGER NOT NULL DEFAULT 0, submitted_at REAL NOT "
                   "NULL, finished_at REAL)")
        db.execute("INSERT INTO evaluations (id, state, key, request, status, submitted_at, finished_at) VALUES "
                   "('old', 'done', 'k', '{}', 'correct', 1.0, 2.0)")
    store = Store(path)
    add_one(store, EvalRequest("class Model: ...", "class ModelNew: ...", task_name="relu"))
    rows = store.latest(RowFilter(), 10)
    assert [(r["id"] == "old", r["task_name"], r["client"]) for r in rows] == [(False, "relu", ""), (True, "", "")]
    assert [r["id"] for r in store.latest(RowFilter(task="rel"), 10)] == [rows[0]["id"]]
    store.close()
