"""The `rl_batch` section of benchmarks/gpu_bench.py, on the CPU with tiny synthetic tasks and one example task."""

from __future__ import annotations

import importlib
from pathlib import Path

import pytest

from drkernel.schema import EvalOptions, EvalRequest
from drkernel.tasks.synthetic import generate

REPO = Path(__file__).resolve().parents[1]
OPTIONS = EvalOptions(device="cpu", correctness_trials=1, measure_performance=False, profile=False, timeout_s=120)


@pytest.fixture
def gpu_bench(monkeypatch: pytest.MonkeyPatch):
    monkeypatch.syspath_prepend(str(REPO / "benchmarks"))
    monkeypatch.setenv("DRKERNEL_TRITON_CACHE", "")  # run_batch points it at fresh folders; restored afterwards
    return importlib.import_module("gpu_bench")


def test_the_batch_has_a_training_steps_shape(gpu_bench) -> None:
    tasks = generate("test", 4, seed=0, shape_scale=1 / 256)
    batch = gpu_bench.rl_shaped(tasks, OPTIONS, samples=8, identical=4)
    assert len(batch) == 32 and len({name for name, _ in batch}) == 32
    for task in tasks:
        requests = [r for _, r in batch if r.task_name == task.name]
        assert len(requests) == 8 and len({r.candidate for r in requests}) == 5  # 4 copies of one answer, 4 others
    variants = {name.split(":")[1] for name, _ in batch}
    assert variants >= {"fused", "unfused", "lazy", "wrong_mask", "wrong_op"}
    with pytest.raises(ValueError, match="rl-identical"):
        gpu_bench.rl_shaped(tasks, OPTIONS, samples=8, identical=0)


def test_a_phase_s_footprint_is_both_processes_most_at_its_largest_over_the_run(gpu_bench) -> None:
    rows = [{"memory_gib": {"correctness_judge": 12.5, "correctness_subject": 19.25, "timing_judge": 13.0}},
            {"memory_gib": {"correctness_judge": 20.0, "correctness_subject": 1.0, "ablation_subject": 30.0}},
            {"memory_gib": {}}, {"memory_gib": None}]
    assert gpu_bench.footprint_max_gib(rows) == {"correctness": 31.75, "timing": 13.0, "ablation": 30.0}


@pytest.mark.slow
def test_rl_batch_section_runs_tiny_on_the_cpu(gpu_bench) -> None:
    tasks = generate("test", 2, seed=0, shape_scale=1 / 256)
    level1 = [("1_vector_add", EvalRequest((REPO / "examples" / "tasks" / "1_vector_add.py").read_text(),
                                           (REPO / "examples" / "candidates" / "1_vector_add__triton.py").read_text(),
                                           OPTIONS, task_name="1_vector_add"))]
    data = gpu_bench.rl_batch(tasks, level1, OPTIONS, samples=3, identical=2, workers=1)
    assert (data["samples"], data["distinct"], data["duplicates"]) == (6, 4, 2)
    assert (data["ran"], data["cached"]) == (4, 2)  # each distinct candidate judged once
    rows = data["runs"]["batch"]["problems"]
    for name, row in rows.items():
        twin = rows[name.split("/")[0] + "/0:fused"]
        if row["cached"]:
            assert {k: v for k, v in row.items() if k not in ("cached", "span_s")} == \
                   {k: v for k, v in twin.items() if k not in ("cached", "span_s")}
    assert data["statuses"]["correct"] >= 4  # the fused copies and the other good variant of each task
    assert data["distinct_per_minute_running"] > 0 and data["distinct_per_minute_cold"] > 0
    assert data["distinct_per_minute_cold"] < data["distinct_per_minute_running"]  # the cold one pays start-up
    assert isinstance(data["duplicates_cost_s"], float)
    assert data["phase_median_s"] and all(v >= 0 for v in data["phase_median_s"].values())
    assert data["runs"]["distinct"]["cached"] == 0 and data["runs"]["level1"]["ran"] == 1
    assert data["level1_per_minute_running"] > 0 and data["level1_phase_median_s"]


def test_a_row_keeps_every_timed_call_and_its_host_time(gpu_bench) -> None:
    """What tells a host that stalled from a GPU that was busy, when a median is a slow call (docs/performance.md)."""
    from drkernel.schema import EvalResult, Timing, TimingStats

    def side(calls: list[float], host: list[float]) -> TimingStats:
        return TimingStats(sorted(calls)[len(calls) // 2], 0.0, sum(calls) / len(calls), min(calls), len(calls),
                           "cuda_event", samples_ms=calls, host_ms=host,
                           host_interruptions=[[int(h > 1), 0, 0] for h in host],
                           driver_allocations=[int(h > 4) for h in host])

    result = EvalResult(timing=Timing(reference=side([0.1, 0.1, 0.1], [0.01] * 3),
                                      candidate=side([0.05, 3.0, 4.0], [0.02, 5.0, 0.03]), measurements=2))
    row = gpu_bench.summary(result)
    assert row["calls_ms"] == {"reference": [0.1, 0.1, 0.1], "candidate": [0.05, 3.0, 4.0]}
    assert row["host_ms"] == {"reference": [0.01] * 3, "candidate": [0.02, 5.0, 0.03]}
    assert row["host_interruptions"] == {"reference": [[0, 0, 0]] * 3, "candidate": [[0, 0, 0], [1, 0, 0], [0, 0, 0]]}
    assert row["driver_allocations"] == {"reference": [0] * 3, "candidate": [0, 1, 0]}
    assert row["measurements"] == 2 and gpu_bench.summary(EvalResult())["measurements"] == 0
