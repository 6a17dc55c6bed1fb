"""benchmarks/generation_speed.py on the CPU with a tiny random model: every figure of every variant (weight dtype,
dynamic or static cache) is measured and positive."""

from __future__ import annotations

import json

from tests.scripts import load_script
from tests.test_agent_hf import tiny_model


def test_generation_speed_times_each_sampler(tmp_path):
    tiny_model(tmp_path / "model")
    figures = load_script("benchmarks/generation_speed.py").main([str(tmp_path / "model"), "--rows", "3", "--tokens", "4", "--device", "cpu",
                           "--out", str(tmp_path / "speed.json"), "--dtypes", "float32", "bfloat16", "--static-cache"])
    assert json.loads((tmp_path / "speed.json").read_text()) == figures
    assert (figures["rows"], figures["tokens"], figures["device"]) == (3, 4, "cpu")
    assert [(run["dtype"], run["cache"]) for run in figures["runs"]] == [
        ("float32", "dynamic"), ("float32", "static"), ("bfloat16", "dynamic"), ("bfloat16", "static")]
    for run in figures["runs"]:
        for key in ("first_call_ms_per_step", "transformers_sampling_ms_per_step", "row_sampler_ms_per_step"):
            assert run[key] > 0
