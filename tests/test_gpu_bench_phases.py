"""The `phases` section of benchmarks/gpu_bench.py, on the CPU with two example tasks and their candidates."""

from __future__ import annotations

import importlib
from pathlib import Path

import pytest

from drkernel.schema import EvalOptions, EvalRequest

REPO = Path(__file__).resolve().parents[1]


@pytest.mark.slow
def test_phases_section_breaks_an_evaluation_down_by_step(monkeypatch):
    monkeypatch.syspath_prepend(str(REPO / "benchmarks"))  # importable by name: the spawned processes unpickle it
    gpu_bench = importlib.import_module("gpu_bench")
    options = EvalOptions(device="cpu", perf_trials=5, warmup_trials=1)
    pairs = [(name, EvalRequest((REPO / "examples" / "tasks" / f"{name}.py").read_text(),
                                (REPO / "examples" / "candidates" / f"{name}__triton.py").read_text(), options))
             for name in ("1_vector_add", "2_relu")]
    data = gpu_bench.phase_breakdown(pairs)
    for name, _ in pairs:
        row = data[name]
        assert row["status"] == "correct", row
        assert row["input_bytes"] == {"1_vector_add": 2 * 5003 * 4, "2_relu": 16 * 300 * 4}[name]
        correctness, timing = row["correctness"], row["timing"]
        for steps in (correctness["steps_s"], correctness["steps_first_s"]):
            assert set(steps) == set(gpu_bench.CORRECTNESS_STEPS)
            assert all(isinstance(v, float) and v >= 0 for v in steps.values()), steps
        assert correctness["steps_s"]["candidate_call"] > 0 and correctness["steps_s"]["mutation_check"] > 0
        assert sum(correctness["steps_s"].values()) <= correctness["other_trials_s"] + 1e-3
        assert correctness["first_trial_s"] > 0 and correctness["rest_s"] >= -1e-3
        steps = timing.pop("steps_s")
        assert set(steps) == set(gpu_bench.TIMING_STEPS)
        assert steps["warmup_call"] > 0 and steps["timed_call"] > 0  # no synced calls or honesty check on the CPU
        assert all(isinstance(v, float) and v >= 0 for v in [*steps.values(), *timing.values()]), timing
        assert 0 < timing["inputs_s"] <= timing["total_s"] and timing["verify_s"] > 0 and timing["rest_s"] >= -1e-3
        assert timing["total_s"] <= row["phases_s"]["timing"] + 1e-3
    assert data["median"]["correctness.steps_s.compare"] > 0
    assert data["median"]["timing.total_s"] > 0
    print(data["median"])
