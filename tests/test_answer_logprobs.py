"""benchmarks/answer_logprobs.py on the CPU: a bench run of a tiny random model, scored under two policies."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
from typer.testing import CliRunner

from drkernel.agent.records import read_trajectories
from drkernel.cli.main import app
from tests.scripts import load_script
from tests.test_agent_hf import tiny_model

REPO = Path(__file__).resolve().parents[1]


def _module():
    return load_script("benchmarks/answer_logprobs.py")


def test_answers_are_scored_per_kind_under_each_policy(tmp_path):
    torch = pytest.importorskip("torch")
    tiny_model(tmp_path / "a")
    result = CliRunner().invoke(app, [
        "bench", "--tasks", str(REPO / "examples" / "tasks"), "--name", "2_relu", "--model", f"hf:{tmp_path / 'a'}",
        "--samples", "2", "--max-tokens", "6", "--seed", "3", "--device", "cpu", "--out", str(tmp_path / "run")])
    assert result.exit_code == 0, result.output
    tiny_model(tmp_path / "b")  # the same weights, then moved: another policy
    from transformers import AutoModelForCausalLM

    moved = AutoModelForCausalLM.from_pretrained(tmp_path / "b")
    with torch.no_grad():
        moved.lm_head.weight.mul_(3.0)
    moved.save_pretrained(tmp_path / "b")
    module = _module()
    figures = module.main([str(tmp_path / "run"), "--policy", f"a={tmp_path / 'a'}", "--policy", f"same={tmp_path / 'a'}",
                           "--policy", f"b={tmp_path / 'b'}", "--out", str(tmp_path / "lp.json")])
    assert json.loads((tmp_path / "lp.json").read_text()) == figures
    (kind, row), = figures["by_kind"].items()  # a random model writes no code: every answer fails
    said = [r for r in read_trajectories(tmp_path / "run") if r.response]  # an empty answer has nothing to score
    assert kind == "failed" and row["answers"] == len(said) == len(figures["answers"]) >= 1
    assert row["change_a_to_same"] == 0 and row["raised_share_same"] == 0
    assert row["mean_logprob_a"] < 0 and not math.isclose(row["change_a_to_b"], 0)
    # the answers were sampled from a: each is scored as the mean of its tokens' log-probabilities there
    assert row["mean_logprob_a"] == pytest.approx(sum(a["a"] for a in figures["answers"]) / len(said))


def test_the_family_s_reference_solutions_are_scored_by_variant(tmp_path):
    tiny_model(tmp_path / "a")
    figures = _module().main(["--synthetic", "test:2", "--policy", f"a={tmp_path / 'a'}"])
    assert figures["synthetic"] == "test:2" and len(figures["answers"]) == 8
    assert sorted(figures["by_kind"]) == ["fused", "lazy", "partial", "unfused"]
    for row in figures["by_kind"].values():
        assert row["answers"] == 2 and row["mean_answer_logprob_a"] < row["mean_logprob_a"] < 0  # many tokens each


@pytest.mark.parametrize("args", [["nameless"], ["a=x", "--synthetic", "bogus:1"], ["a=x", "--synthetic", "test"]])
def test_bad_arguments_are_refused(tmp_path, args):
    policy, *rest = args
    with pytest.raises(SystemExit):
        _module().main([*([] if rest else [str(tmp_path)]), "--policy", policy, *rest])


def test_a_run_and_the_family_at_once_are_refused(tmp_path):
    with pytest.raises(SystemExit):
        _module().main([str(tmp_path), "--synthetic", "test:1", "--policy", "a=x"])


def test_a_missing_policy_or_run_or_an_empty_run_is_a_clear_error(tmp_path, capsys):
    tiny_model(tmp_path / "a")
    cases = [([str(tmp_path), "--policy", f"a={tmp_path / 'nope'}"], "--policy a: "),
             ([str(tmp_path / "nope"), "--policy", f"a={tmp_path / 'a'}"], "no such bench run folder"),
             ([str(tmp_path), "--policy", f"a={tmp_path / 'a'}"], "holds no answer at turn 1")]
    for argv, message in cases:
        with pytest.raises(SystemExit):
            _module().main(argv)
        assert message in capsys.readouterr().err
