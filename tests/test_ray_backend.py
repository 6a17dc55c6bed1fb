"""The Ray backend on a local Ray instance: one actor per (fake) GPU, CPU evaluations, a lost actor retried.

The instance declares two GPUs that do not exist: enough to check that each cuda actor gets its own GPU, never to
run on one. Evaluations run with device=cpu, under the Triton interpreter.
"""

from __future__ import annotations

import contextlib
import os
import signal
import tempfile
import time
import uuid
from pathlib import Path
from typing import Iterator

import pytest

ray = pytest.importorskip("ray")

from drkernel.errors import UsageError  # noqa: E402
from drkernel.scheduling.ray_backend import RayBackend, _harness_failed, _resolve  # noqa: E402
from drkernel.service.client import Client  # noqa: E402
from drkernel.service.dispatcher import Dispatcher  # noqa: E402
from drkernel.service.store import Store  # noqa: E402
from tests.test_scheduler import MIX, example, stalled  # noqa: E402
from tests.test_service_api import TOKEN, serving  # noqa: E402

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module", autouse=True)
def local_ray() -> Iterator[None]:
    ray.init(num_cpus=2, num_gpus=2, include_dashboard=False, log_to_driver=False)
    yield
    ray.shutdown()


def test_each_cuda_actor_owns_one_gpu() -> None:
    backend = RayBackend(device="cuda")
    try:
        workers = backend.workers()
    finally:
        backend.close()
    assert backend.device == "cuda"
    assert sorted(w["gpu"] for w in workers) == ["0", "1"]  # Ray's CUDA_VISIBLE_DEVICES, handed to the supervisor
    assert {w["device"] for w in workers} == {"cuda"}


def test_cpu_evaluations_and_a_lost_actor() -> None:
    slow, slow_expected = example("1_vector_add", "1_vector_add__triton", prefix=stalled(2))
    others = [example(*pair) for pair in MIX]
    backend = RayBackend(device="cpu", num_cpus_per_eval=1)
    try:
        assert [w["device"] for w in backend.workers()] == ["cpu", "cpu"]
        futures = [backend.submit(slow)] + [backend.submit(r) for r, _ in others]
        holder = backend.workers()[0]  # the first job went to the first of the idle actors
        assert holder["busy"]
        time.sleep(1.5)  # starting its fork server or evaluating: either way holding the slow job
        os.kill(holder["pid"], signal.SIGKILL)  # as if its node died: Ray restarts it and retries the evaluation
        results = [f.result(timeout=60) for f in futures]
        workers = backend.workers()
    finally:
        backend.close()
    assert [r.status for r in results] == [slow_expected] + [e for _, e in others]
    assert [w["restarts"] for w in workers] == [1, 0]
    assert sum(w["completed"] for w in workers) == len(futures)  # one result each, none lost nor doubled


def test_an_actor_runs_one_candidate_at_a_time_through_its_judge_host() -> None:
    """An actor's evaluations are handed to its judge host one at a time (the next subject forked ahead while the
    judge waits): never two candidates running at once on one actor."""
    marker = f"drkernel-ray-turns-{uuid.uuid4().hex}"
    prefix = f"import time\nprint({marker!r}, flush=True)\ntime.sleep(1.0)\n"
    requests = [example("1_vector_add", "1_vector_add__triton", prefix=prefix) for _ in range(3)]
    root = Path(tempfile.gettempdir())  # the actors' too: they inherit this process's environment

    def running() -> int:
        count = 0
        for path in root.glob("drkernel-*/judge-*/subject-*/subject/stdout.txt"):  # the candidate's output
            with contextlib.suppress(OSError):  # a finished evaluation's folder vanishes
                count += marker in path.read_text(errors="replace")
        return count

    backend = RayBackend(device="cpu", num_cpus_per_eval=2)  # one actor takes both CPUs
    most_running = 0
    try:
        futures = [backend.submit(r) for r, _ in requests]
        while not all(f.done() for f in futures):
            most_running = max(most_running, running())
            time.sleep(0.05)
        results = [f.result() for f in futures]
    finally:
        backend.close()
    assert [r.status for r in results] == [expected for _, expected in requests]
    assert most_running == 1


def test_the_service_on_ray(tmp_path: Path) -> None:
    requests = [example(*pair) for pair in MIX]
    backend = RayBackend(device="cpu")
    with serving(Dispatcher(Store(tmp_path / "s.db"), backend, backend.device)) as url, Client(url, TOKEN) as client:
        ids = client.submit_batch([(r.reference, r.candidate, r.options.to_dict()) for r, _ in requests])
        results = client.wait(ids, timeout=60)
        assert [w["name"] for w in client.workers()] == ["ray-cpu0", "ray-cpu1"]
    assert [r.status for r in results] == [expected for _, expected in requests]


def test_devices_resolve_against_the_cluster() -> None:
    assert _resolve("auto", {"CPU": 4, "GPU": 2}) == "cuda"
    assert _resolve("auto", {"CPU": 4}) == "cpu"
    with pytest.raises(UsageError, match="no GPU"):  # the arguments do not fit the cluster: exit 2, as before
        _resolve("cuda", {"CPU": 4})
    with pytest.raises(ValueError):
        _resolve("tpu", {"CPU": 4})


def test_unfinished_evaluations_are_harness_failures() -> None:
    lost = _harness_failed(ray.exceptions.ActorDiedError())
    raised = _harness_failed(ray.exceptions.RayTaskError("evaluate", "Traceback ...", OSError("disk full")))
    assert (lost.status, lost.error.kind) == ("crashed", "WorkerLost")
    assert (raised.status, raised.error.kind) == ("crashed", "SandboxError")
    assert "disk full" in raised.error.message
