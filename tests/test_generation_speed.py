"""benchmarks/generation_speed.py on the CPU with a tiny random model: every figure is measured and positive."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

from tests.test_agent_hf import tiny_model

REPO = Path(__file__).resolve().parents[1]


def test_generation_speed_times_each_sampler(tmp_path):
    tiny_model(tmp_path / "model")
    spec = importlib.util.spec_from_file_location("generation_speed", REPO / "benchmarks" / "generation_speed.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    figures = module.main([str(tmp_path / "model"), "--rows", "3", "--tokens", "4", "--device", "cpu",
                           "--out", str(tmp_path / "speed.json")])
    assert json.loads((tmp_path / "speed.json").read_text()) == figures
    assert (figures["rows"], figures["tokens"], figures["device"]) == (3, 4, "cpu")
    for key in ("first_call_ms_per_step", "transformers_sampling_ms_per_step", "row_sampler_ms_per_step"):
        assert figures[key] > 0
