"""The Ray backend across two nodes: two raylets on this machine, each with resources of its own (one CPU and one
fake GPU each), as a cluster of two hosts would have. Each node gets its own actors, a GPU actor is handed its node's
GPU, and evaluations spread over both nodes with the verdicts they get on one."""

from __future__ import annotations

from typing import Iterator

import pytest

ray = pytest.importorskip("ray")
cluster_utils = pytest.importorskip("ray.cluster_utils")

from drkernel.scheduling.ray_backend import RayBackend  # noqa: E402
from tests.test_scheduler import MIX, example  # noqa: E402

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def two_nodes() -> Iterator[list[str]]:
    """A head and a second node, joined; yields their node ids."""
    cluster = cluster_utils.Cluster(initialize_head=True, connect=True,
                                    head_node_args={"num_cpus": 1, "num_gpus": 1, "include_dashboard": False})
    try:
        cluster.add_node(num_cpus=1, num_gpus=1)
        cluster.wait_for_nodes()
        nodes = [node["NodeID"] for node in ray.nodes() if node["Alive"]]
        assert len(nodes) == 2
        yield nodes
    finally:
        ray.shutdown()
        cluster.shutdown()


def test_each_node_holds_its_own_gpu_actor(two_nodes: list[str]) -> None:
    backend = RayBackend(device="cuda")
    try:
        workers = backend.workers()
    finally:
        backend.close()
    assert sorted(w["node"] for w in workers) == sorted(two_nodes)  # one actor on each node
    assert [w["gpu"] for w in workers] == ["0", "0"]  # each node's own GPU, as Ray numbers it there


def test_evaluations_spread_over_both_nodes_with_their_verdicts(two_nodes: list[str]) -> None:
    cases = [example(*pair) for pair in MIX] * 2
    backend = RayBackend(device="cpu", num_cpus_per_eval=1)
    try:
        assert sorted(w["node"] for w in backend.workers()) == sorted(two_nodes)
        results = [future.result(timeout=180) for future in [backend.submit(r) for r, _ in cases]]
        workers = backend.workers()
    finally:
        backend.close()
    assert [r.status for r in results] == [expected for _, expected in cases]
    assert all(w["completed"] >= 1 for w in workers), workers  # both nodes judged
    assert sum(w["completed"] for w in workers) == len(cases)
