"""benchmarks/every_gpu.py: what it reads from a run's rows, and the whole script on the CPU with tiny tasks."""

from __future__ import annotations

import importlib
import json
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture
def every_gpu(monkeypatch: pytest.MonkeyPatch):
    monkeypatch.syspath_prepend(str(REPO / "benchmarks"))
    monkeypatch.setenv("DRKERNEL_TRITON_CACHE", "")  # run_batch points it at fresh folders; restored afterwards
    return importlib.import_module("every_gpu")


def row(status: str, span: tuple[float, float], reasons: list[str] | None = None, speedup: float | None = None,
        error: str | None = None) -> dict:
    return {"status": status, "hack_reasons": reasons or [], "speedup": speedup, "span_s": list(span),
            "cached": False, "error": error, "traceback": "Traceback\n  ...\nRuntimeError: mapping failed"}


def test_a_legitimate_candidate_misjudged_is_a_harness_failure_and_names_its_problem_and_cause(every_gpu) -> None:
    rows = {"t/0:fused": row("correct", (0, 1)), "t/1:lazy": row("hacked", (0, 1), ["lazy_kernel"]),
            "t/2:partial": row("crashed", (0, 1), error="SandboxError: the judge's GPU work failed"),
            "t/3:lazy": row("correct", (0, 1)), "19_ReLU": row("runtime_error", (0, 1), error="RuntimeError: x"),
            "t/4:wrong_op": row("crashed", (0, 1), error="SandboxError: could not map")}
    failures, unexpected = every_gpu.misjudged(rows)
    assert [f["problem"] for f in failures] == ["t/2:partial", "19_ReLU", "t/4:wrong_op"]
    assert failures[0]["cause"].startswith("SandboxError") and failures[0]["last_traceback_line"].endswith("failed")
    assert [u["problem"] for u in unexpected] == ["t/3:lazy"] and unexpected[0]["expected"] == "hacked"


def test_the_underfull_share_is_the_time_with_a_free_slot(every_gpu) -> None:
    rows = {"a": row("correct", (0, 10)), "b": row("correct", (2, 8)), "c": row("correct", (8, 10))}
    assert every_gpu.underfull_share(rows, slots=2) == pytest.approx(0.2)  # one running in 0-2 s only
    assert every_gpu.underfull_share(rows, slots=1) == 0.0


def test_verdicts_and_speedups_are_compared_candidate_by_candidate(every_gpu) -> None:
    first = {"a": row("correct", (0, 1), speedup=2.0), "b": row("hacked", (0, 1), ["lazy_kernel"])}
    later = {"a": row("correct", (0, 1), speedup=2.02), "b": row("hacked", (0, 1), ["decoy_kernel"])}
    found = every_gpu.compared(first, later)
    assert found["verdicts_changed"] == ["b"] and found["speedup_ratio"]["farthest"] == pytest.approx(1.01)


def test_the_script_runs_every_count_and_writes_its_file(every_gpu, tmp_path, capsys) -> None:
    assert every_gpu.main(["--device", "cpu", "--gpus", "1,2", "--synthetic-n", "1", "--rl-samples", "2",
                           "--synthetic-scale", str(1 / 256), "--level1", "0", "--out", str(tmp_path)]) == 0
    data = json.loads((tmp_path / "every_gpu.json").read_text())
    runs = data["batches"]["rl"]
    assert sorted(runs) == ["1", "2"] and runs["1"]["efficiency"] == pytest.approx(1.0)
    assert all(run["evaluations"] == 2 and not run["harness_failures"] for run in runs.values())
    assert "rl: 2 GPU(s)" in capsys.readouterr().out


def test_bad_counts_are_refused(every_gpu, tmp_path) -> None:
    with pytest.raises(SystemExit):
        every_gpu.main(["--gpus", "0", "--level1", "0", "--out", str(tmp_path)])
    with pytest.raises(SystemExit):
        every_gpu.main(["--gpus", "1", "--level1", "2", "--kernelbench", str(tmp_path / "none.jsonl"),
                        "--out", str(tmp_path)])


def test_the_legitimate_batch_is_distinct_and_only_legitimate(every_gpu) -> None:
    from drkernel.schema import EvalOptions, Status

    batch = every_gpu.legitimate_batch(400, EvalOptions(device="cpu"), 1 / 256)
    assert len(batch) == 400 and len({name for name, _ in batch}) == 400
    assert len({(request.task_name, request.candidate) for _, request in batch}) == 400
    assert {every_gpu.expected_status(name) for name, _ in batch} == {Status.CORRECT}
    assert {name.rpartition(":")[2] for name, _ in batch} == {"fused", "unfused", "partial"}
    assert every_gpu.legitimate_batch(0, EvalOptions(device="cpu"), 1 / 256) == []


def test_the_legitimate_batch_runs_in_chunks_and_counts_its_failures(every_gpu, tmp_path, capsys) -> None:
    assert every_gpu.main(["--device", "cpu", "--gpus", "1", "--synthetic-n", "0", "--level1", "0",
                           "--synthetic-scale", str(1 / 256), "--legit", "3", "--legit-batch", "2",
                           "--out", str(tmp_path)]) == 0
    data = json.loads((tmp_path / "every_gpu.json").read_text())
    assert sorted(data["batches"]) == ["legit1", "legit2"]
    assert [data["batches"][label]["1"]["evaluations"] for label in ("legit1", "legit2")] == [2, 1]
    assert data["legit"] == {"evaluations": 3, "gpus": 1, "harness_failures": 0}
    assert "legitimate: 3 on 1 GPU(s), 0 harness failures" in capsys.readouterr().out
