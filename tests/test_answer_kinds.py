"""drkernel.rl.kinds: a judged turn as lazy, partial, unfused, fused, unmeasured or failed, from its result alone,
and the shares `drkernel report` tabulates per turn."""

from __future__ import annotations

import pytest

from drkernel.rl.kinds import PARTIAL_COVERAGE, AnswerKind, answer_kind, failure_reasons


def _result(status="correct", coverage=None, launches=None, kernels=(), hack_reasons=(), meaningful=True):
    return {"status": status, "correct": status == "correct", "hack_reasons": list(hack_reasons),
            "profile": {"coverage": coverage, "meaningful": meaningful and coverage is not None,
                        "launches": dict(launches or {}),
                        "kernels": [{"name": n, "gpu_time_us": 1.0, "calls": 1, "own": own} for n, own in kernels]}}


@pytest.mark.parametrize("result, kind", [
    (None, AnswerKind.FAILED),  # no code in the answer
    (_result("incorrect"), AnswerKind.FAILED),
    (_result("hacked", 0.01, hack_reasons=["lazy_kernel"]), AnswerKind.LAZY),
    (_result("hacked", 0.9, {"k": 3}, hack_reasons=["decoy_kernel"]), AnswerKind.FAILED),
    (_result("correct", None, {"k": 3}, meaningful=False), AnswerKind.UNMEASURED),  # the CPU: no coverage
    (_result("correct", 0.17, {"add_bias_kernel": 3}), AnswerKind.PARTIAL),
    (_result("correct", PARTIAL_COVERAGE - 1e-9, {"a": 3, "b": 3}), AnswerKind.PARTIAL),
    (_result("correct", PARTIAL_COVERAGE, {"fused_kernel": 3}), AnswerKind.FUSED),
    (_result("correct", 0.95, {"relu_kernel": 3, "bias_kernel": 3, "tanh_kernel": 3}), AnswerKind.UNFUSED),
    # recorded without launch counts: the own kernels among the profile's top kernels
    (_result("correct", 0.9, kernels=[("fused_kernel", True), ("at::copy", False)]), AnswerKind.FUSED),
    (_result("correct", 0.9, kernels=[("a", True), ("b", True)]), AnswerKind.UNFUSED),
    (_result("correct", 0.9), AnswerKind.UNMEASURED),  # covering, but which kernels is not recorded
])
def test_answer_kind(result, kind) -> None:
    assert answer_kind(result) is kind
    assert str(kind) == kind.value


def test_failure_reasons_name_the_hacks_else_the_error_s_kind() -> None:
    """What a run's samples log keeps of a failed turn: a crash of the harness is told from the candidate's own."""
    assert failure_reasons(None) == [] and failure_reasons(_result("correct", 0.9)) == []
    hacked = _result("hacked", 0.9, hack_reasons=["output_caching", "decoy_kernel"])
    assert failure_reasons(hacked) == ["output_caching", "decoy_kernel"]
    crashed = {"status": "crashed", "correct": False, "hack_reasons": [],
               "error": {"kind": "SandboxError", "message": "mapping of buffer object failed", "traceback": ""}}
    assert failure_reasons(crashed) == ["SandboxError"]
    assert failure_reasons({**crashed, "error": None}) == []  # nothing said: nothing invented


def test_report_counts_answer_kinds_per_turn(tmp_path) -> None:
    """The report's kinds table holds, per run and turn, the number of trajectories of each kind."""
    import csv
    import json

    from typer.testing import CliRunner

    from drkernel.cli.main import app

    run = tmp_path / "run"
    run.mkdir()
    turns = [(0, 1, _result("hacked", 0.01, hack_reasons=["lazy_kernel"])), (0, 2, _result("correct", 0.9, {"k": 3})),
             (1, 1, _result("correct", 0.2, {"k": 3})), (1, 2, _result("correct", 0.8, {"a": 1, "b": 1})),
             (2, 1, None)]
    with (run / "trajectories.jsonl").open("w") as out:
        for sample, turn, result in turns:
            status = "format_error" if result is None else result["status"]
            out.write(json.dumps({"task": "t", "level": 1, "sample": sample, "turn": turn, "status": status,
                                  "reward": 0.0, "code": None, "result": result}) + "\n")
    outcome = CliRunner().invoke(app, ["report", str(run), "--out", str(tmp_path / "report")])
    assert outcome.exit_code == 0, outcome.output
    with (tmp_path / "report" / "tables" / "kinds.csv").open() as handle:
        rows = {int(r["turn"]): {k: int(v) for k, v in r.items() if k not in ("run", "turn") and int(v)}
                for r in csv.DictReader(handle)}
    assert rows == {1: {"lazy": 1, "partial": 1, "failed": 1}, 2: {"fused": 1, "unfused": 1}}
    html = (tmp_path / "report" / "report.html").read_text()
    assert html.index('id="kinds"') < html.index(">unmeasured<")  # the table is on the page, not only in tables/
