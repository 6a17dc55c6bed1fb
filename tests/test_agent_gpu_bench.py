"""The `agent` section of benchmarks/gpu_bench.py, on the CPU with two example tasks."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from drkernel.schema import EvalOptions
from drkernel.tasks import load_task_dir, select_tasks
from tests.scripts import load_script

REPO = Path(__file__).resolve().parents[1]


@pytest.mark.slow
def test_agent_section_compares_bench_with_the_scheduler(tmp_path, monkeypatch):
    gpu_bench = load_script("benchmarks/gpu_bench.py")
    monkeypatch.setenv("DRKERNEL_TRITON_CACHE", str(tmp_path / "cache"))  # restored afterwards: the section sets fresh caches in os.environ
    tasks = select_tasks(load_task_dir(REPO / "examples" / "tasks"), names=["1_vector_add", "2_relu"])
    candidates = tmp_path / "candidates"
    candidates.mkdir()
    for name in ("1_vector_add__triton", "2_relu__triton"):
        (candidates / f"{name}.py").write_text((REPO / "examples" / "candidates" / f"{name}.py").read_text())
    options = EvalOptions(device="cpu", correctness_trials=1, measure_performance=False)
    data = gpu_bench.agent_vs_scheduler(tasks, candidates, options, tmp_path / "run", workers=1)
    assert data["evaluations"] == 2 and data["bench_turns"] == 2 and data["model_requests"] == 2
    assert data["disagreements"] == {}
    assert data["scheduler"]["per_minute"] == pytest.approx(120 / data["scheduler"]["wall_s"])
    assert data["ratio"] == pytest.approx(data["bench"]["per_minute"] / data["scheduler"]["per_minute"])
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["per_turn"]["correct"] == [1.0]
    print(data)
