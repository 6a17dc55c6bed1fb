"""The `phases` section of benchmarks/gpu_bench.py, on the CPU with two example tasks and their candidates."""

from __future__ import annotations

import importlib
from pathlib import Path

import pytest

from drkernel.sandbox.timing_phase import TIMING_PARTS
from drkernel.schema import EvalOptions, EvalRequest

REPO = Path(__file__).resolve().parents[1]


@pytest.mark.slow
def test_phases_section_breaks_an_evaluation_down_by_phase(monkeypatch):
    monkeypatch.syspath_prepend(str(REPO / "benchmarks"))
    gpu_bench = importlib.import_module("gpu_bench")
    options = EvalOptions(device="cpu", perf_trials=5, warmup_trials=1)
    pairs = [(name, EvalRequest((REPO / "examples" / "tasks" / f"{name}.py").read_text(),
                                (REPO / "examples" / "candidates" / f"{name}__triton.py").read_text(), options))
             for name in ("1_vector_add", "2_relu")]
    data = gpu_bench.phase_breakdown(pairs)
    for name, _ in pairs:
        row = data[name]
        assert row["status"] == "correct", row
        phases = row["phases_s"]
        # a judge host confines itself and its subject before the hand-over: no `confine` phase (a judge per
        # evaluation has one)
        for phase in ("reference", "load", "correctness", "correctness_first_trial", "timing", "ablation",
                      "start_latency", "exit"):
            assert isinstance(phases[phase], float) and phases[phase] >= 0, (phase, phases)
        assert "confine" not in phases
        assert phases["correctness_first_trial"] <= phases["correctness"]
        parts = [phases[f"timing_{part}"] for part in TIMING_PARTS]  # where the timing phase went
        assert all(p >= 0 for p in parts) and 0 < sum(parts) <= phases["timing"] + 1e-3, phases
        assert phases["timing_reference"] > 0 and phases["timing_candidate"] > 0 and phases["timing_null"] > 0
        assert row["precision"]["rule"] == "matched"
    assert data["median"]["correctness"] > 0 and data["median"]["timing"] > 0
