"""`drkernel serve` for real: a server subprocess on loopback, real evaluations in the sandbox (CPU, interpreter).

kill -9 of the server with hundreds of submissions queued, kill -9 of a worker mid-evaluation, 2,000 submissions,
and KernelGYM's /evaluate crediting a Triton kernel and refusing a PyTorch-only one.
"""

from __future__ import annotations

import contextlib
import itertools
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator

import httpx
import pytest

from drkernel.schema import EvalRequest
from drkernel.service.client import Client
from drkernel.service.store import Store
from tests.test_scheduler import MIX, assert_verdicts, example, stalled, started, wait_for  # shared helpers
from tests.test_service_api import TOKEN, free_port

pytestmark = pytest.mark.slow
STOP_TIMEOUT_S = 30.0


@dataclass
class Server:
    url: str
    process: subprocess.Popen[bytes]


@contextlib.contextmanager
def server(store: Path, workers: int = 2) -> Iterator[Server]:
    """`python -m drkernel.cli.main serve` on a free loopback port; stopped (or killed) on exit.

    Its sandboxes keep their job folders next to the store (TMPDIR), where `started` finds them.
    """
    port = free_port()
    command = [sys.executable, "-m", "drkernel.cli.main", "serve", "--port", str(port), "--store", str(store),
               "--device", "cpu", "--workers", str(workers)]
    env = {**os.environ, "DRKERNEL_TOKEN": TOKEN, "TMPDIR": str(store.parent)}
    with open(store.with_suffix(".log"), "ab") as log:
        process = subprocess.Popen(command, env=env, stdout=log, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    try:
        wait_for(lambda: _healthy(url, process), 60, "the server to answer /v1/health")
        yield Server(url, process)
    finally:
        if process.poll() is None:
            process.terminate()
            try:
                process.wait(STOP_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()


def _healthy(url: str, process: subprocess.Popen[bytes]) -> bool:
    assert process.poll() is None, f"the server exited with code {process.returncode}"
    try:
        return httpx.get(url + "/v1/health", timeout=2).status_code == 200
    except httpx.TransportError:
        return False


def body(request: EvalRequest) -> dict[str, Any]:
    return {"reference": request.reference, "candidate": request.candidate, "options": request.options.to_dict()}


def workload(count: int, distinct: int) -> tuple[list[dict[str, Any]], list[str]]:
    """`count` submissions cycling through MIX, `distinct` of them different (by seed); the rest duplicates."""
    items, expected = [], []
    for n, pair in zip(range(count), itertools.cycle(MIX)):
        request, status = example(*pair, seed=n % distinct)
        items.append(body(request))
        expected.append(status)
    return items, expected


def submit_all(client: Client, items: list[dict[str, Any]], batch: int = 1000) -> list[str]:
    return [id for start in range(0, len(items), batch) for id in client.submit_batch(items[start:start + batch])]


def test_a_killed_server_resumes_all_work_exactly_once(tmp_path: Path) -> None:
    store = tmp_path / "service.db"
    items, expected = workload(300, distinct=60)
    with server(store) as first, Client(first.url, TOKEN) as client:
        ids = submit_all(client, items)
        wait_for(lambda: sum(client.get(id)["state"] == "done" for id in ids[:40]) >= 10, 120, "ten results")
        first.process.send_signal(signal.SIGKILL)
        first.process.wait(10)
        before = done_results(store, ids)
    assert 10 <= len(before) < len(ids)  # hundreds were still queued
    with server(store) as second, Client(second.url, TOKEN) as client:
        results = client.wait(ids, timeout=180)
        after = {id: client.get(id)["result"] for id in before}
        metrics = httpx.get(second.url + "/metrics", headers={"Authorization": f"Bearer {TOKEN}"}).text
    assert_verdicts(results, expected)
    assert after == before  # results written before the kill are never rerun nor rewritten
    ran = int(next(line.split()[1] for line in metrics.splitlines()
                   if line.startswith("drkernel_evaluation_duration_seconds_count")))
    assert ran <= 60  # the restarted server ran no more than the distinct requests


def done_results(path: Path, ids: list[str]) -> dict[str, Any]:
    """The results already in the store file, read straight from it (the server is dead)."""
    store = Store(path)
    try:
        records = [store.get(id) for id in ids]
    finally:
        store.close()
    assert all(records)
    return {r.id: r.result for r in records if r is not None and r.state == "done"}


def test_a_worker_killed_mid_evaluation_through_the_server(tmp_path: Path) -> None:
    slow, slow_expected = example("2_relu", "2_relu__triton", prefix=stalled(2))
    others = [example(*pair) for pair in MIX]
    with server(tmp_path / "service.db", workers=1) as running, Client(running.url, TOKEN) as client:
        ids = client.submit_batch([body(slow)] + [body(r) for r, _ in others])
        wait_for(lambda: started(tmp_path), 60, "the slow evaluation to start")
        os.kill(client.workers()[0]["pid"], signal.SIGKILL)
        results = client.wait(ids, timeout=120)
        (worker,) = client.workers()
    assert_verdicts(results, [slow_expected] + [e for _, e in others])
    assert worker["restarts"] == 1 and worker["completed"] == len(ids)  # one result per submission


def test_two_thousand_submissions(tmp_path: Path) -> None:
    count, distinct = 2000, 400  # 400 real evaluations; the other 1,600 are cache hits (or wait for their twin)
    items, expected = workload(count, distinct)
    with server(tmp_path / "service.db") as running, Client(running.url, TOKEN) as client:
        started = time.monotonic()
        ids = submit_all(client, items)
        submitted = time.monotonic() - started
        results = client.wait(ids, timeout=240)
        elapsed = time.monotonic() - started
    assert_verdicts(results, expected)
    print(f"\n{count} submissions ({distinct} distinct): stored in {submitted:.1f} s, all done in {elapsed:.1f} s "
          f"({count / elapsed:.1f}/s overall, {distinct / elapsed:.1f} evaluations/s)")


def test_kernelgym_credits_a_triton_kernel_and_refuses_pytorch_only(tmp_path: Path) -> None:
    reference = (Path(__file__).resolve().parents[1] / "examples" / "tasks" / "2_relu.py").read_text()
    triton_kernel, _ = example("2_relu", "2_relu__triton")
    pytorch_only, _ = example("2_relu", "2_relu__pytorch_only")
    with server(tmp_path / "service.db") as running:
        with httpx.Client(base_url=running.url, headers={"Authorization": f"Bearer {TOKEN}"}, timeout=120) as http:
            credited = http.post("/evaluate", json={
                "task_id": "relu-triton", "reference_code": reference, "kernel_code": triton_kernel.candidate,
                "backend": "triton", "num_correct_trials": 1, "num_perf_trials": 3, "num_warmup": 1, "timeout": 60,
            }).json()
            refused = http.post("/evaluate", json={
                "task_id": "relu-torch", "reference_code": reference, "kernel_code": pytorch_only.candidate,
                "num_correct_trials": 1, "measure_performance": False, "timeout": 60,
            }).json()
    assert (credited["status"], credited["compiled"], credited["correctness"], credited["decoy_kernel"]) == (
        "completed", True, True, False)
    assert credited["kernel_runtime"] > 0 and credited["reference_runtime"] > 0 and credited["speedup"] > 0
    assert credited["metadata"]["drkernel"]["status"] == "correct"
    assert (refused["status"], refused["correctness"], refused["decoy_kernel"]) == ("completed", False, True)
    assert "no_triton_kernel" in refused["metadata"]["hack_reasons"] and refused["speedup"] == 0.0
