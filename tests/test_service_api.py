"""The HTTP API and its clients, served for real (uvicorn on loopback) over a scripted backend.

The backend answers from the candidate's text ("verdict <status>"), at once or when its gate opens, so these tests
check the service itself: auth, validation, limits, long-polls, the cache, restarts, metrics, KernelGYM's shape.
Real evaluations through the server are in test_service_e2e.py.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import threading
import time
from concurrent.futures import Future
from pathlib import Path
from typing import Iterator

import httpx
import pytest
import uvicorn

from drkernel.schema import ErrorInfo, EvalRequest, EvalResult, Timing, TimingStats
from drkernel.service import app as app_module
from drkernel.service.app import create_app
from drkernel.service.client import AsyncClient, Client, ServiceError
from drkernel.service.dispatcher import Dispatcher
from drkernel.service.kernelgym import response
from drkernel.service.store import Record, Store

TOKEN = "test-token"
AUTH = {"Authorization": f"Bearer {TOKEN}"}
REFERENCE = "class Model: pass  # a reference"


def scripted(candidate: str) -> EvalResult:
    """The verdict a candidate 'verdict <status>' asks for."""
    status = candidate.split()[1]
    error = None if status == "correct" else ErrorInfo(kind="Scripted", message=f"scripted {status}")
    return EvalResult(status=status, correct=status == "correct", error=error, duration_s=0.25)


class ScriptedBackend:
    """A Backend whose evaluations take no time, or wait for `gate`; it remembers what it was given."""

    device = "cpu"

    def __init__(self, gated: bool = False) -> None:
        self.gate = threading.Event()
        if not gated:
            self.gate.set()
        self.submitted: list[EvalRequest] = []
        self.futures: list[Future[EvalResult]] = []

    def submit(self, request: EvalRequest) -> Future[EvalResult]:
        future: Future[EvalResult] = Future()
        self.submitted.append(request)
        self.futures.append(future)
        threading.Thread(target=self._answer, args=(request, future), daemon=True).start()
        return future

    def _answer(self, request: EvalRequest, future: Future[EvalResult]) -> None:
        if self.gate.wait(30) and future.set_running_or_notify_cancel():
            try:
                future.set_result(scripted(request.candidate))
            except Exception as exc:  # a script asking for no real status fails its test instead of hanging it
                future.set_exception(exc)

    def workers(self) -> list[dict[str, object]]:
        return [{"name": "scripted0", "busy": False, "restarts": 2}]

    def close(self) -> None:
        for future in self.futures:
            future.cancel()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextlib.contextmanager
def serving_app(app: object) -> Iterator[str]:
    """Run an ASGI app (its lifespan included) on a free loopback port in a thread; yields its URL, stops it on
    exit."""
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=0, log_level="warning",
                                           timeout_graceful_shutdown=2))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 20
    while not server.started:
        assert thread.is_alive() and time.monotonic() < deadline, "the server did not start"
        time.sleep(0.02)
    try:
        yield f"http://127.0.0.1:{server.servers[0].sockets[0].getsockname()[1]}"
    finally:
        server.should_exit = True
        thread.join(timeout=20)
        assert not thread.is_alive(), "the server did not stop"


@contextlib.contextmanager
def serving(dispatcher: Dispatcher, token: str | None = TOKEN) -> Iterator[str]:
    """Run the app on a free loopback port in a thread; stop it (and close the dispatcher) on exit."""
    with serving_app(create_app(dispatcher, token)) as url:
        yield url


@pytest.fixture
def backend() -> ScriptedBackend:
    return ScriptedBackend()


@pytest.fixture
def url(tmp_path: Path, backend: ScriptedBackend) -> Iterator[str]:
    with serving(Dispatcher(Store(tmp_path / "store.db"), backend, "cpu")) as base:
        yield base


@pytest.fixture
def http(url: str) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=url, headers=AUTH, timeout=30) as client:
        yield client


def item(status: str = "correct", **options: object) -> dict[str, object]:
    return {"reference": REFERENCE, "candidate": f"verdict {status}", "options": options}


# Auth --------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("headers", [{}, {"Authorization": "Bearer wrong"}, {"Authorization": TOKEN}])
def test_every_path_but_health_and_docs_needs_the_token(url: str, headers: dict[str, str]) -> None:
    for path in ("/v1/workers", "/metrics", "/v1/evaluations/x", "/status/x"):
        answer = httpx.get(url + path, headers=headers)
        assert answer.status_code == 401, path
        assert answer.headers["www-authenticate"] == "Bearer"
        assert "bearer token" in answer.json()["detail"]
        assert httpx.get(url + path, headers=AUTH).status_code in (200, 404)
    for path in ("/v1/evaluations", "/evaluate"):
        assert httpx.post(url + path, json=item(), headers=headers).status_code == 401
    assert httpx.get(url + "/v1/health").json() == {"status": "ok", "device": "cpu"}
    for path in ("/docs", "/openapi.json"):  # a browser sends no bearer token (friction 8)
        assert httpx.get(url + path, headers=headers).status_code == 200, path


def test_without_a_token_the_api_is_open(tmp_path: Path) -> None:
    with serving(Dispatcher(Store(tmp_path / "s.db"), ScriptedBackend(), "cpu"), token=None) as base:
        assert httpx.get(base + "/v1/workers").status_code == 200


# Submissions and validation ------------------------------------------------------------------------------------


def test_one_and_a_batch_are_stored_then_evaluated(http: httpx.Client, backend: ScriptedBackend) -> None:
    one = http.post("/v1/evaluations", json=item("incorrect", seed=1)).json()["id"]
    many = http.post("/v1/evaluations", json={"items": [item(s) for s in ("correct", "hacked")]}).json()["ids"]
    bodies = [http.get(f"/v1/evaluations/{id}", params={"wait": 10}).json() for id in [one, *many]]
    assert [(b["state"], b["result"]["status"]) for b in bodies] == [
        ("done", "incorrect"), ("done", "correct"), ("done", "hacked")]
    assert bodies[0]["result"] == scripted("verdict incorrect").to_dict()  # exactly EvalResult.to_dict()
    assert backend.submitted[0].options.seed == 1


@pytest.mark.parametrize(
    ("body", "status", "words"),
    [
        (item(bogus=1, also_bogus=2), 422, ["options.bogus", "options.also_bogus"]),
        (item(timeout_s="soon"), 422, ["options.timeout_s"]),
        (item(timeout_s=-1), 422, ["timeout_s must be positive"]),
        (item(device="cuda"), 422, ["evaluates on cpu"]),
        ({"reference": REFERENCE}, 422, ["candidate: Field required"]),
        ({**item(), "surprise": 1}, 422, ["surprise"]),
        ({"items": []}, 422, ["items"]),
        ({"items": [item()] * 1001}, 422, ["items", "1000"]),
        ({**item(), "candidate": "x" * 1_000_001}, 422, ["candidate", "1000000"]),
    ],
)
def test_bad_submissions_get_clear_4xx(http: httpx.Client, body: dict, status: int, words: list[str]) -> None:
    answer = http.post("/v1/evaluations", json=body)
    assert answer.status_code == status
    text = answer.text
    assert all(word in text for word in words), text
    assert len(text) < 5000  # the input is not echoed back


def test_bodies_over_the_limit_are_refused_unread(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(app_module, "MAX_BODY_BYTES", 10_000)
    with serving(Dispatcher(Store(tmp_path / "s.db"), ScriptedBackend(), "cpu")) as base:
        answer = httpx.post(base + "/v1/evaluations", json=item(seed=1) | {"task_name": "x" * 20_000}, headers=AUTH)
        assert answer.status_code == 413 and "10000 byte limit" in answer.json()["detail"]
        chunked = httpx.post(base + "/v1/evaluations", content=iter([b"{}"]), headers=AUTH)
        assert chunked.status_code == 411


def test_unknown_ids_are_404_and_waits_are_bounded(http: httpx.Client) -> None:
    assert http.get("/v1/evaluations/nope").status_code == 404
    assert http.get("/v1/evaluations/nope", params={"wait": 61}).status_code == 422


# Long-polls, the cache, restarts -------------------------------------------------------------------------------


def test_long_polls_wait_for_the_result_and_no_longer(tmp_path: Path) -> None:
    backend = ScriptedBackend(gated=True)
    with serving(Dispatcher(Store(tmp_path / "s.db"), backend, "cpu")) as base, Client(base, TOKEN) as client:
        id = client.submit(REFERENCE, "verdict correct")
        started = time.monotonic()
        assert client.get(id, wait=0.5)["state"] == "running"
        assert 0.4 < time.monotonic() - started < 5
        threading.Timer(0.5, backend.gate.set).start()
        started = time.monotonic()
        assert client.get(id, wait=30)["state"] == "done"
        assert time.monotonic() - started < 5  # woken by the result, not by the timeout


def test_duplicates_run_once_and_only_reproducible_verdicts_are_shared(tmp_path: Path) -> None:
    backend = ScriptedBackend(gated=True)
    with serving(Dispatcher(Store(tmp_path / "s.db"), backend, "cpu")) as base, Client(base, TOKEN) as client:
        twins = client.submit_batch([(REFERENCE, "verdict correct")] * 3)  # the later two park behind the first
        timeouts = client.submit_batch([(REFERENCE, "verdict timeout")] * 2)  # not reproducible: each runs
        backend.gate.set()
        results = client.wait(twins + timeouts, timeout=30)
        assert [r.status for r in results] == ["correct"] * 3 + ["timeout"] * 2
        late = client.submit(REFERENCE, "verdict correct")
        assert client.get(late)["state"] == "done"  # answered from the cache at submission
        assert [r.candidate for r in backend.submitted] == ["verdict correct"] + ["verdict timeout"] * 2
        metrics = httpx.get(base + "/metrics", headers=AUTH).text
        assert "drkernel_cache_hits_total 3" in metrics


def test_a_restart_finishes_unfinished_work_and_reruns_nothing_done(tmp_path: Path) -> None:
    store_path = tmp_path / "s.db"
    stuck = ScriptedBackend(gated=True)
    with serving(Dispatcher(Store(store_path), stuck, "cpu")) as base, Client(base, TOKEN) as client:
        ids = client.submit_batch([(REFERENCE, "verdict correct", {"seed": n}) for n in range(5)])
        assert client.get(ids[0], wait=0.2)["state"] == "running"
    store = Store(store_path)
    store.finish([ids[0]], scripted("verdict incorrect"))  # as if it had finished before the crash
    store.close()
    fresh = ScriptedBackend()
    with serving(Dispatcher(Store(store_path), fresh, "cpu")) as base, Client(base, TOKEN) as client:
        results = client.wait(ids, timeout=30)
    assert [r.status for r in results] == ["incorrect"] + ["correct"] * 4
    assert sorted(r.options.seed for r in fresh.submitted) == [1, 2, 3, 4]


def test_metrics_are_prometheus_text(http: httpx.Client) -> None:
    ids = http.post("/v1/evaluations", json={"items": [item("correct"), item("hacked"), item("correct")]}).json()
    for id in ids["ids"]:
        http.get(f"/v1/evaluations/{id}", params={"wait": 10})
    answer = http.get("/metrics")
    assert answer.headers["content-type"].startswith("text/plain; version=0.0.4")
    samples = dict(line.rsplit(" ", 1) for line in answer.text.splitlines() if not line.startswith("#"))
    assert samples['drkernel_evaluations{state="done"}'] == "3"
    assert samples['drkernel_evaluations{state="queued"}'] == "0"
    assert samples['drkernel_evaluations_finished_total{status="correct"}'] == "2"
    assert samples['drkernel_evaluations_finished_total{status="hacked"}'] == "1"
    assert samples["drkernel_evaluation_duration_seconds_count"] == "2"  # the cache hit did not run
    assert float(samples["drkernel_evaluation_duration_seconds_sum"]) == pytest.approx(0.5)
    assert samples["drkernel_cache_hits_total"] == "1"
    assert samples["drkernel_worker_restarts_total"] == "2"
    assert "# TYPE drkernel_evaluation_duration_seconds summary" in answer.text


# KernelGYM compatibility ---------------------------------------------------------------------------------------


def gym(task_id: str, status: str = "correct", **fields: object) -> dict[str, object]:
    return {"task_id": task_id, "reference_code": REFERENCE, "kernel_code": f"verdict {status} # kernel", **fields}


def test_kernelgym_evaluate_answers_synchronously_and_keeps_task_ids(http: httpx.Client,
                                                                      backend: ScriptedBackend) -> None:
    body = http.post("/evaluate", json=gym("t1", num_correct_trials=3, timeout=60, priority="high",
                                           device="cuda:0", toolkit="kernelbench", entry_point="Model")).json()
    assert (body["task_id"], body["status"], body["compiled"], body["correctness"], body["decoy_kernel"]) == (
        "t1", "completed", True, True, False)
    assert body["metadata"]["drkernel"]["status"] == "correct"
    options = backend.submitted[0].options
    assert (options.correctness_trials, options.timeout_s, options.check_hacks) == (3, 60.0, True)
    again = http.post("/evaluate", json=gym("t1", "incorrect")).json()  # a known task_id: its earlier answer
    assert again["correctness"] is True and len(backend.submitted) == 1
    refreshed = http.post("/evaluate", json=gym("t1", "incorrect", force_refresh=True)).json()
    assert refreshed["correctness"] is False
    assert http.get("/status/t1").json() == {"task_id": "t1", "status": "completed"}
    assert http.get("/results/t1").json()["correctness"] is False
    assert http.get("/status/nope").status_code == 404 and http.get("/results/nope").status_code == 404


@pytest.mark.parametrize(("field", "value"), [("backend", "cuda"), ("entry_point", "Net"), ("timeout", 5),
                                              ("reference_backend", "tensorrt")])
def test_kernelgym_refuses_what_it_cannot_honour(http: httpx.Client, field: str, value: object) -> None:
    answer = http.post("/evaluate", json=gym("t2", **{field: value}))
    assert answer.status_code == 422 and field in answer.json()["message"]


def kernelgym_of(result: EvalResult) -> dict[str, object]:
    record = Record("id", "done", result.to_dict(), False, 0.0, 1.0)
    return response("t", record).model_dump()


def test_kernelgym_fields_follow_its_conventions() -> None:
    fast = EvalResult(status="correct", correct=True, speedup=2.0, timing=Timing(
        reference=TimingStats(4.0, 0, 4.0, 4.0, 5, "cuda_event"),
        candidate=TimingStats(2.0, 0, 2.0, 2.0, 5, "cuda_event")))
    assert {k: kernelgym_of(fast)[k] for k in ("status", "reference_runtime", "kernel_runtime", "speedup")} == {
        "status": "completed", "reference_runtime": 4.0, "kernel_runtime": 2.0, "speedup": 2.0}
    table = {  # our status (error kind) -> KernelGYM's status, compiled, correctness, decoy_kernel
        ("hacked", None): ("completed", True, False, True),
        ("incorrect", None): ("completed", True, False, False),
        ("compile_error", "SyntaxError"): ("completed", False, False, False),
        ("runtime_error", "ValueError"): ("completed", True, False, False),
        ("timeout", "Timeout"): ("timeout", True, False, False),
        ("crashed", "WorkerLost"): ("failed", False, False, False),
        ("invalid", "NoModelNew"): ("failed", False, False, False),
    }
    for (status, kind), expected in table.items():
        error = ErrorInfo(kind=kind, message="m") if kind else None
        body = kernelgym_of(EvalResult(status=status, error=error, hack_reasons=["x"] * (status == "hacked")))
        assert (body["status"], body["compiled"], body["correctness"], body["decoy_kernel"]) == expected, status
        assert (body["speedup"], body["reference_runtime"]) == (0.0, -1.0)


# Clients -------------------------------------------------------------------------------------------------------


def test_the_sync_client(url: str) -> None:
    with Client(url, TOKEN) as client:
        assert client.health()["status"] == "ok"
        assert client.workers()[0]["name"] == "scripted0"
        assert client.evaluate(REFERENCE, "verdict hacked", {"seed": 3}).status == "hacked"
        ids = client.submit_batch([(REFERENCE, "verdict correct"), item("incorrect")])
        assert [r.status for r in client.wait(ids, timeout=30)] == ["correct", "incorrect"]
        with pytest.raises(ServiceError) as error:
            client.submit(REFERENCE, "verdict correct", {"nonsense": True})
        assert error.value.status_code == 422 and "nonsense" in error.value.message
        with pytest.raises(ServiceError) as error:
            client.get("missing")
        assert error.value.status_code == 404
    with Client(url, "wrong") as client, pytest.raises(ServiceError) as error:
        client.workers()
    assert error.value.status_code == 401


def test_client_waits_are_bounded(tmp_path: Path) -> None:
    with serving(Dispatcher(Store(tmp_path / "s.db"), ScriptedBackend(gated=True), "cpu")) as base:
        with Client(base, TOKEN) as client, pytest.raises(TimeoutError):
            client.wait([client.submit(REFERENCE, "verdict correct")], timeout=0.5)


def test_the_async_client(url: str) -> None:
    async def scenario() -> None:
        async with AsyncClient(url, TOKEN) as client:
            assert (await client.health())["device"] == "cpu"
            assert len(await client.workers()) == 1
            assert (await client.evaluate(REFERENCE, "verdict runtime_error")).status == "runtime_error"
            ids = await client.submit_batch([(REFERENCE, "verdict correct", {"seed": n}) for n in range(20)])
            assert [r.status for r in await client.wait(ids, timeout=30)] == ["correct"] * 20
            assert (await client.get(await client.submit(REFERENCE, "verdict correct"), wait=10))["state"] == "done"
            with pytest.raises(ServiceError) as error:
                await client.get("missing")
            assert error.value.status_code == 404

    asyncio.run(asyncio.wait_for(scenario(), timeout=60))
