"""benchmarks/driver_contention.py: what it computes from its samples, and its refusal where there is no GPU."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

SPEC = importlib.util.spec_from_file_location(
    "driver_contention", Path(__file__).resolve().parents[1] / "benchmarks" / "driver_contention.py")
driver_contention = importlib.util.module_from_spec(SPEC)
SPEC.loader.exec_module(driver_contention)


def test_each_scenario_places_its_processes():
    where = driver_contention.placements(["0", "1", "2"])
    assert where == {"alone": ["0"], "spread": ["0", "1", "2"], "same": ["0", "0", "0"],
                     "starting": ["0", "1", "2"]}


def test_the_summary_sets_each_scenario_against_the_process_alone():
    samples = {
        "alone": {"ipc": [[1.0, 2.0, 3.0]], "kernel": [[0.1, 0.1, 0.1]]},
        "spread": {"ipc": [[3.0, 4.0, 5.0], [7.0, 8.0, 9.0], [4.0, 6.0, 8.0]], "kernel": [[0.1] * 3] * 3},
    }
    summary = driver_contention.summarize(samples)
    assert summary["alone"]["ipc"]["median_ms"] == [2.0]
    assert summary["alone"]["ipc"]["over_alone"] == 1.0
    assert summary["spread"]["ipc"]["median_ms"] == [4.0, 8.0, 6.0]
    assert summary["spread"]["ipc"]["over_alone"] == 3.0  # the median process (6.0) over 2.0
    assert summary["spread"]["kernel"]["over_alone"] == 1.0
    assert summary["spread"]["ipc"]["p90_ms"] == [4.0, 8.0, 6.0]


def test_without_a_gpu_it_says_so_and_writes_nothing(tmp_path, monkeypatch):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    with pytest.raises(SystemExit, match="no CUDA GPU 0 here"):
        driver_contention.main(["--gpus", "0", "--out", str(tmp_path / "out")])
    assert not (tmp_path / "out").exists()


def test_an_unknown_scenario_is_a_usage_error(tmp_path, capsys):
    with pytest.raises(SystemExit):
        driver_contention.main(["--gpus", "0", "--scenarios", "alone,crowded", "--out", str(tmp_path)])
    assert "not crowded" in capsys.readouterr().err


def test_the_starting_loops_count_their_starts_and_stop_when_told(monkeypatch):
    """`starting`'s loops, here with a probe that needs no GPU: they run until told to stop and count each start."""
    import multiprocessing
    import time

    monkeypatch.setattr(driver_contention, "CONTEXT_PROBE", "pass")
    spawn = multiprocessing.get_context("fork")
    stop, started = spawn.Event(), spawn.Value("i", 0)
    loop = spawn.Process(target=driver_contention._start_contexts, args=("0", stop, started))
    loop.start()
    time.sleep(1.0)
    stop.set()
    loop.join(timeout=30)
    assert loop.exitcode == 0 and started.value >= 2
