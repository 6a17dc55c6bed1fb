"""The agent loop's pure pieces: parsing, context policies, prompts, records."""

from __future__ import annotations

import json

import pytest

from drkernel.agent.context import ContextPolicy, ShownTurn, build_messages, select_context
from drkernel.agent.parsing import extract_code
from drkernel.agent.prompts import PromptTemplates, feedback_prompt, first_turn_prompt
from drkernel.agent.records import TrajectoryWriter, TurnRecord, read_trajectories
from drkernel.schema import ErrorInfo, EvalResult, Status

GOOD = "import torch\n\nclass ModelNew(torch.nn.Module):\n    pass\n"

# ---------------------------------------------------------------- parsing


def test_extract_code_takes_the_last_block_that_defines_modelnew():
    response = (
        "First try:\n```python\nclass ModelNew:\n    a = 1\n```\n"
        "Better:\n```python\nclass ModelNew:\n    a = 2\n```\n"
        "Use it like this:\n```python\nmodel = ModelNew()\n```\n"
    )
    assert extract_code(response) == "class ModelNew:\n    a = 2\n"


def test_extract_code_fences_and_misses():
    assert extract_code(f"~~~py\n{GOOD}~~~") == GOOD
    assert extract_code(f"````\n{GOOD}```\ninner\n````\n") == f"{GOOD}```\ninner\n"
    assert extract_code("class ModelNew: pass") is None  # not fenced
    assert extract_code("```python\nclass Model:\n    pass\n```") is None  # no ModelNew
    assert extract_code("```python\nclass ModelNewer:\n    pass\n```") is None
    assert extract_code(f"```python\n{GOOD}") is None  # never closed (a cut-off answer)
    assert extract_code("") is None


# ---------------------------------------------------------------- context policies


@pytest.mark.parametrize(
    ("policy", "rewards", "expected"),
    [
        ("full", [0, 1, 0.5], [0, 1, 2]),
        ("last:2", [0, 1, 0.5, 0.2], [2, 3]),
        ("last:5", [0, 1], [0, 1]),
        ("topk:2", [0.5, 1.0, 0.5, 0.0], [1, 2]),  # the tie 0.5/0.5 goes to the later turn
        ("topk:2", [1.0, 0.0, 1.0, 1.0], [2, 3]),
        ("topk:3", [0.2, 0.9, 0.1, 0.8, 0.3], [1, 3, 4]),
        ("window:2", [0.0, 1.0, 1.0, 0.0, 2.0], [1, 2]),  # sums 1, 2, 1, 2: the earliest of the ties
        ("window:2", [0.0, 0.0, 0.0, 1.0, 1.5], [3, 4]),
        ("window:3", [0, 0], [0, 1]),
        ("topk:1", [], []),
    ],
)
def test_select_context(policy, rewards, expected):
    assert select_context(rewards, ContextPolicy.parse(policy)) == expected


def test_policy_parse_errors():
    assert ContextPolicy.parse("window:4") == ContextPolicy("window", 4)
    assert str(ContextPolicy.parse(" topk:3 ")) == "topk:3"
    with pytest.raises(ValueError, match="must be one of full, last, topk, window, not 'best'"):
        ContextPolicy.parse("best:2")
    with pytest.raises(ValueError, match="needs K >= 1"):
        ContextPolicy.parse("last")
    with pytest.raises(ValueError, match="needs K >= 1"):
        ContextPolicy.parse("topk:0")
    with pytest.raises(ValueError, match="must be a whole number"):
        ContextPolicy.parse("window:x")
    with pytest.raises(ValueError, match="takes no K"):
        ContextPolicy.parse("full:3")


def test_build_messages_shows_each_chosen_turn_as_answer_then_feedback():
    earlier = [ShownTurn(f"answer {i}", f"feedback {i}", r) for i, r in enumerate([0.0, 1.2, 0.5], 1)]
    messages, shown = build_messages("the task", earlier, ContextPolicy.parse("topk:2"))
    assert shown == [2, 3]
    assert messages == [
        {"role": "user", "content": "the task"},
        {"role": "assistant", "content": "answer 2"},
        {"role": "user", "content": "feedback 2"},
        {"role": "assistant", "content": "answer 3"},
        {"role": "user", "content": "feedback 3"},
    ]
    assert build_messages("the task", [], ContextPolicy()) == ([{"role": "user", "content": "the task"}], [])


# ---------------------------------------------------------------- prompts


def test_first_turn_prompt_embeds_the_reference_verbatim():
    reference = "class Model:\n    def f(self): return {'a': 1}\n"
    prompt = first_turn_prompt(reference)
    assert "```python\nclass Model:\n    def f(self): return {'a': 1}\n```" in prompt
    assert "ModelNew" in prompt


def test_feedback_prompt_renders_errors_and_stays_under_the_limit():
    result = EvalResult.failed(Status.RUNTIME_ERROR, "ValueError", "shapes differ x" * 3)
    text = feedback_prompt(result, GOOD)
    assert "Verdict: RUNTIME_ERROR" in text and "Error (ValueError): shapes differ x" in text
    assert not text.lstrip().startswith("{")  # rendered, not a JSON dump
    huge = EvalResult(status="runtime_error", error=ErrorInfo("RuntimeError", "boom " * 5000))
    templates = PromptTemplates(max_feedback_chars=600)
    cut = feedback_prompt(huge, GOOD, templates)
    assert len(cut) <= 600 and "Improve it" in cut  # the instruction survives: the result is cut, not the template
    assert feedback_prompt(None, None).count("no ```python code block that defines `class ModelNew`") == 1
    with pytest.raises(ValueError, match="must have a result"):
        feedback_prompt(None, GOOD)


def test_templates_from_file(tmp_path):
    toml = tmp_path / "t.toml"
    toml.write_text('feedback = """Result:\n{feedback}\nAgain."""\nformat_error = "No code."\n'
                    'max_feedback_chars = 300\n')
    templates = PromptTemplates.from_file(toml)
    assert templates.first_turn == PromptTemplates().first_turn
    assert feedback_prompt(None, None, templates) == "No code."
    result = EvalResult.failed(Status.TIMEOUT, "Timeout", "took too long")
    assert feedback_prompt(result, GOOD, templates) == "Result:\nVerdict: TIMEOUT\nError (Timeout): took too long\nAgain."
    (tmp_path / "t.json").write_text(json.dumps({"first_turn": "Do it: {reference}"}))
    assert first_turn_prompt("X", PromptTemplates.from_file(tmp_path / "t.json")) == "Do it: X"
    (tmp_path / "bad.json").write_text(json.dumps({"first": "x"}))
    with pytest.raises(ValueError, match="unknown template key\\(s\\) first"):
        PromptTemplates.from_file(tmp_path / "bad.json")
    (tmp_path / "nohole.json").write_text(json.dumps({"feedback": "no placeholder"}))
    with pytest.raises(ValueError, match="must contain \\{feedback\\}"):
        PromptTemplates.from_file(tmp_path / "nohole.json")


# ---------------------------------------------------------------- records


def _record(turn: int) -> TurnRecord:
    return TurnRecord(task="t", level=None, sample=0, turn=turn, messages=[{"role": "user", "content": "x"}],
                      response="r", code=None, result=None, reward=0.0, feedback="f", context_turns=[])


def test_records_round_trip_and_survive_a_cut_write(tmp_path):
    with TrajectoryWriter(tmp_path) as writer:
        writer.append(_record(1))
        writer.append(_record(2))
    path = tmp_path / "trajectories.jsonl"
    with path.open("a") as f:
        f.write('{"task": "t", "sam')  # a kill in the middle of a write
    assert [r.turn for r in read_trajectories(tmp_path)] == [1, 2]
    with TrajectoryWriter(tmp_path) as writer:  # the next writer cuts the partial line off
        writer.append(_record(3))
    assert [r.turn for r in read_trajectories(tmp_path)] == [1, 2, 3]
    assert read_trajectories(tmp_path)[0] == _record(1)
    with path.open("a") as f:
        f.write(json.dumps(_record(4).to_dict()))  # complete, but killed before its newline
    assert [r.turn for r in read_trajectories(tmp_path)] == [1, 2, 3, 4]
    with TrajectoryWriter(tmp_path) as writer:  # kept: the reader counted it
        writer.append(_record(5))
    assert [r.turn for r in read_trajectories(tmp_path)] == [1, 2, 3, 4, 5]
    path.write_text(path.read_text().replace('"turn": 2', '"turn": 2,,', 1))
    with pytest.raises(ValueError, match="trajectories.jsonl:2: not a turn record"):
        read_trajectories(tmp_path)
    assert read_trajectories(tmp_path / "absent") == []


def test_retry_after_header_values():
    from email.utils import format_datetime
    from datetime import datetime, timedelta, timezone

    from drkernel.agent.backends import MAX_RETRY_AFTER_S, _retry_after

    assert _retry_after(None) == 0.0 and _retry_after("  ") == 0.0
    assert _retry_after("2.5") == 2.5 and _retry_after("-3") == 0.0
    assert _retry_after("100000") == MAX_RETRY_AFTER_S
    assert 5 < _retry_after(format_datetime(datetime.now(timezone.utc) + timedelta(seconds=10), usegmt=True)) <= 10
    assert _retry_after("not a date, nor a number") == 0.0  # a malformed header waits the backoff, never raises


def test_bench_help_shows_every_default_and_help():
    """rich read '[default: 1]' as markup and dropped it; --temperature, --top-p, --max-tokens had no help (friction 3)."""
    from typer.testing import CliRunner

    from drkernel.cli.main import app

    text = CliRunner().invoke(app, ["bench", "--help"], env={"COLUMNS": "400"}).output
    for option, default in (("--samples", "1"), ("--temperature", "1.0"), ("--top-p", "0.95"), ("--max-tokens", "8192"),
                            ("--concurrency", "32"), ("--timeout", "180.0"), ("--device", "auto")):
        line = next(line for line in text.splitlines() if f"{option} " in line)
        assert f"(default: {default})" in line, line
    for option in ("--temperature", "--top-p", "--max-tokens"):
        line = next(line for line in text.splitlines() if f"{option} " in line)
        assert len(line.split("]", 1)[-1].strip(" │")) > 10, line  # a sentence of help after the type and range


def test_bench_interrupted_says_resume_continues(tmp_path, monkeypatch):
    """Ctrl-C exits 130 and says that --resume continues (friction 8)."""
    from pathlib import Path

    from typer.testing import CliRunner

    from drkernel.agent import bench
    from drkernel.cli.main import app

    async def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(bench, "run_bench", interrupted)
    tasks = Path(__file__).resolve().parent.parent / "examples" / "tasks"
    out = tmp_path / "run"
    result = CliRunner().invoke(app, ["bench", "--out", str(out), "--tasks", str(tasks), "--model", "m",
                                      "--base-url", "http://127.0.0.1:9/v1"], env={"COLUMNS": "300"})
    assert result.exit_code == 130, result.output
    assert f"turns recorded so far are kept in {out}; rerun with --resume to continue" in result.output


def test_an_unreachable_model_server_fails_at_once():
    """A server that never answered and refuses connections is fatal on the first try, not after 28 s of retries
    (friction 4)."""
    import asyncio
    import socket
    import time

    import pytest

    from drkernel.agent.backends import FatalGenerationError, OpenAIChatConfig, OpenAIChatModel, SamplingParams

    with socket.socket() as probe:  # a port nothing listens on
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    model = OpenAIChatModel(OpenAIChatConfig(f"http://127.0.0.1:{port}/v1", "m", backoff_s=10.0))
    started = time.perf_counter()
    with pytest.raises(FatalGenerationError, match=f"cannot connect to http://127.0.0.1:{port}/v1"):
        asyncio.run(model.complete([{"role": "user", "content": "q"}], SamplingParams(1.0, 1.0, 8, [], None)))
    assert time.perf_counter() - started < 5.0


def test_bench_settings_nest_and_an_older_flat_config_json_still_resumes(tmp_path):
    """config.json nests `evaluation` (EvalOptions) and `engine` (EngineConfig); one written before, with flat
    device, workers, ray, ..., resumes into the same settings (issue 22)."""
    from drkernel.agent.bench import RunDirError, prepare_run_dir
    from drkernel.scheduling.engine import EngineConfig
    from drkernel.schema import EvalOptions

    older = {"tasks": "t", "model": "m", "base_url": "u", "samples": 2, "device": "cpu", "workers": 3,
             "result_cache": 0, "ray": "auto", "service": None, "service_token_env": "T", "timeout_s": 60.0,
             "correctness_trials": 2, "perf_trials": 4, "measure_performance": False, "precision": "tolerance"}
    (tmp_path / "config.json").write_text(json.dumps(older))
    config = prepare_run_dir(tmp_path, {}, resume=True)
    assert (config.tasks, config.samples) == ("t", 2)
    assert config.evaluation == EvalOptions(device="cpu", timeout_s=60.0, correctness_trials=2, perf_trials=4,
                                            measure_performance=False, precision="tolerance")
    assert config.engine == EngineConfig("ray:auto", workers=3, result_cache=0, token_env="T")
    saved = json.loads((tmp_path / "config.json").read_text())
    assert saved["evaluation"]["precision"] == "tolerance" and saved["engine"]["name"] == "ray:auto"
    assert not {"device", "workers", "ray", "service", "precision"} & set(saved)
    with pytest.raises(RunDirError, match=r"evaluation.precision \('tolerance' -> 'matched'\)"):
        prepare_run_dir(tmp_path, {"evaluation": {"precision": "matched"}}, resume=True)
    moved = prepare_run_dir(tmp_path, {"engine": {"name": "embedded"}, "evaluation": {"device": "auto"}}, resume=True)
    assert (moved.engine.name, moved.engine.workers, moved.evaluation.device) == ("embedded", 3, "auto")
