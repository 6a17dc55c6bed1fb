"""benchmarks/process_starts.py: its lanes on the CPU, what it computes from their times, its refusal without a GPU."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

SPEC = importlib.util.spec_from_file_location(
    "process_starts", Path(__file__).resolve().parents[1] / "benchmarks" / "process_starts.py")
process_starts = importlib.util.module_from_spec(SPEC)
SPEC.loader.exec_module(process_starts)


def test_the_summary_counts_processes_over_the_whole_span():
    records = [(0.0, 0.1, 0.5, 1.0), (1.0, 1.1, 1.2, 2.0), (0.2, 0.3, 0.4, 4.0)]  # (fork, initialised, ready, reaped)
    assert process_starts.summarize(records, 2) == {
        "lanes": 2, "processes": 3, "per_s": 0.75, "start_s": 0.2, "init_s": 0.1, "end_s": 0.8}
    assert process_starts.summarize([], 1) == {"lanes": 1, "processes": 0}


@pytest.mark.parametrize("warm", ["profiler", "kernel"])
def test_lanes_start_processes_one_after_another_and_the_file_holds_each_count(tmp_path, capsys, warm):
    assert process_starts.main(["--device", "cpu", "--warm", warm, "--lanes", "1,2", "--seconds", "0.3",
                                "--gpus", "2", "--out", str(tmp_path)]) == 0
    data = json.loads((tmp_path / "process_starts.json").read_text())
    rows = data["rows"]
    assert data["warm"] == warm and data["gpus"] == 2
    assert [row["lanes"] for row in rows] == [1, 2]
    assert all(row["processes"] >= row["lanes"] and row["per_s"] > 0 and row["start_s"] >= 0 for row in rows)
    assert "lanes 2:" in capsys.readouterr().out


def test_bad_counts_are_refused_and_without_a_gpu_it_says_so(tmp_path, monkeypatch):
    with pytest.raises(SystemExit):
        process_starts.main(["--lanes", "0", "--out", str(tmp_path)])
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    with pytest.raises(SystemExit, match="no CUDA GPU here"):
        process_starts.main(["--out", str(tmp_path / "out")])
    assert not (tmp_path / "out").exists()


def test_a_process_that_cannot_start_fails_the_run_with_its_reason(tmp_path, monkeypatch, capfd):
    def broken(device):
        raise RuntimeError("no context for you")

    monkeypatch.setitem(process_starts.WARM, "kernel", broken)
    with pytest.raises(SystemExit, match="1 of 1 lanes failed"):
        process_starts.main(["--device", "cpu", "--warm", "kernel", "--lanes", "1", "--seconds", "0.2",
                             "--out", str(tmp_path)])
    assert "no context for you" in capfd.readouterr().err
