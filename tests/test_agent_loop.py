"""The agent loop against a real HTTP server that speaks the OpenAI chat API from a script of answers.

The CLI runs end to end on examples/tasks with the CPU interpreter (verdicts per turn, feedback in the next prompt,
retries, resume after a SIGKILL); the context policies run through the library with a stub evaluator whose
rewards are known, so every expected `context_turns` is exact.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import signal
import subprocess
import sys
import time
from datetime import datetime
from pathlib import Path

import pytest
from typer.testing import CliRunner

from drkernel.agent.backends import GenerationError, OpenAIChatConfig, OpenAIChatModel, SamplingParams
from drkernel.agent.context import ContextPolicy
from drkernel.agent.loop import LoopConfig, request_seed, run_loop
from drkernel.agent.records import read_generation_errors, read_trajectories
from drkernel.agent.replay import ChatScript, Reply, ScriptedChatServer, fenced
from drkernel.cli.main import app
from drkernel.schema import EvalResult
from drkernel.tasks import load_task_file

REPO = Path(__file__).resolve().parents[1]
CANDIDATES = REPO / "examples" / "candidates"


def candidate(name: str) -> str:
    return (CANDIDATES / f"{name}.py").read_text()


def bench(server_url: str, out: Path, *args: str) -> list[str]:
    return [sys.executable, "-m", "drkernel.cli.main", "bench", "--tasks", str(REPO / "examples" / "tasks"),
            "--model", "scripted", "--base-url", server_url, "--device", "cpu", "--workers", "1", "--no-perf",
            "--trials", "1", "--timeout", "120", "--out", str(out), *args]


def env() -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": str(REPO)}


def by_key(records):
    return {(r.task, r.sample, r.turn): r for r in records}


@pytest.mark.slow
def test_bench_cli_verdicts_feedback_retries_and_export(tmp_path):
    several_blocks = (
        "A first idea:\n```python\n" + candidate("5_layernorm__raises") + "```\nThe fixed version:\n```python\n"
        + candidate("5_layernorm__triton") + "```\nUse it as:\n```python\nmodel = ModelNew()\n```\n"
    )
    script = ChatScript({
        "2_relu": ["I would rather not write code today.",
                   Reply(fenced(candidate("2_relu__wrong")), fail_status=429, fail_times=1, retry_after=0)],
        "5_layernorm": [fenced(candidate("5_layernorm__raises")), several_blocks],
    })
    out = tmp_path / "run"
    with ScriptedChatServer(script) as server:
        started = time.monotonic()
        done = subprocess.run(bench(server.url, out, "--name", "2_relu", "--name", "5_layernorm", "--turns", "2",
                                    "--retries", "2"), capture_output=True, text=True, env=env(), timeout=300)
        elapsed = time.monotonic() - started
    assert done.returncode == 0, done.stderr
    records = read_trajectories(out)
    got = {(r.task, r.turn): (r.status, r.reward, r.context_turns) for r in records}
    assert got == {
        ("2_relu", 1): ("format_error", 0.0, []),
        ("2_relu", 2): ("incorrect", 0.0, [1]),
        ("5_layernorm", 1): ("runtime_error", 0.0, []),
        ("5_layernorm", 2): ("correct", 0.5, [1]),
    }
    turns = by_key(records)
    # What went wrong in a turn reaches the next prompt, rendered, after the answer it judges.
    relu2 = turns[("2_relu", 0, 2)].messages
    assert [m["role"] for m in relu2] == ["user", "assistant", "user"]
    assert relu2[1]["content"] == "I would rather not write code today."
    assert "no ```python code block that defines `class ModelNew`" in relu2[2]["content"]
    assert turns[("2_relu", 0, 1)].code is None and turns[("2_relu", 0, 1)].result is None
    norm2 = turns[("5_layernorm", 0, 2)].messages[-1]["content"]
    assert "Verdict: RUNTIME_ERROR" in norm2 and "IndexError" in norm2
    assert turns[("5_layernorm", 0, 2)].code == candidate("5_layernorm__triton")  # the last block with ModelNew
    assert "Verdict: INCORRECT" in turns[("2_relu", 0, 2)].feedback
    assert "elements differ" in turns[("2_relu", 0, 2)].feedback
    assert turns[("5_layernorm", 0, 1)].usage["completion_tokens"] > 0
    assert set(turns[("5_layernorm", 0, 1)].timings) == {"generation_s", "evaluation_s"}
    # The 429 was retried: the server saw turn 2 of 2_relu twice, every other turn once.
    tags = [tag for tag, _ in server.requests]
    assert tags.count("2_relu/0/2") == 2 and len(tags) == 5
    summary = json.loads((out / "summary.json").read_text())
    assert summary["per_turn"]["correct"] == [0.0, 0.5]
    assert summary["last_turn"]["correct"] == 0.5 and summary["best_of_history"]["correct"] == 0.5
    assert summary["statuses"] == {"correct": 1, "format_error": 1, "incorrect": 1, "runtime_error": 1}
    assert "best of history" in done.stdout and "Fast@1.2" in done.stdout
    assert json.loads((out / "config.json").read_text())["turns"] == 2
    print(f"bench CLI, 4 turns and 3 evaluations: {elapsed:.1f} s")

    # SFT export: the correct turns (speed unmeasured here, so no speed rule), as chat rows datasets can load.
    sft = tmp_path / "sft.jsonl"
    runner = CliRunner()
    result = runner.invoke(app, ["export-sft", str(out), "--out", str(sft), "--min-speedup", "0"])
    assert result.exit_code == 0, result.output
    rows = [json.loads(line) for line in sft.read_text().splitlines()]
    kept = turns[("5_layernorm", 0, 2)]
    assert rows == [{"messages": [*kept.messages, {"role": "assistant", "content": kept.response}]}]
    assert kept.messages[-1]["role"] == "user" and kept.response.startswith("A first idea:")
    assert runner.invoke(app, ["export-sft", str(out), "--out", str(sft)]).exit_code == 0
    assert sft.read_text() == ""  # the default rule wants speedup >= 1, and none was measured
    datasets = pytest.importorskip("datasets")
    runner.invoke(app, ["export-sft", str(out), "--out", str(sft), "--min-speedup", "0"])
    loaded = datasets.load_dataset("json", data_files=str(sft), split="train")
    assert loaded.num_rows == 1 and [m["role"] for m in loaded[0]["messages"]] == ["user", "assistant", "user",
                                                                                   "assistant"]


@pytest.mark.slow
def test_resume_after_sigkill_asks_only_missing_turns(tmp_path):
    # Turn 1 needs no evaluation (no code), so the killed run never starts a worker: the test stays short.
    script = ChatScript({"2_relu": ["Let me think first.", Reply("stuck", delay_s=60)]})
    out = tmp_path / "run"
    with ScriptedChatServer(script) as server:
        process = subprocess.Popen(bench(server.url, out, "--name", "2_relu", "--samples", "2", "--turns", "2",
                                         "--context", "last:1"),
                                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env(),
                                   start_new_session=True)
        path = out / "trajectories.jsonl"
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and not (path.exists() and len(path.read_text().splitlines()) == 2):
            time.sleep(0.2)
        while sum(tag.endswith("/2") for tag, _ in server.requests) < 2 and time.monotonic() < deadline:
            time.sleep(0.1)  # both turn-2 requests are waiting on the server: kill now
        os.killpg(process.pid, signal.SIGKILL)
        process.wait()
        assert [(r.sample, r.turn) for r in read_trajectories(out)] in ([(0, 1), (1, 1)], [(1, 1), (0, 1)])
        before = len(server.requests)
        script.replies["2_relu"] = ["Let me think first.", fenced(candidate("2_relu__triton"))]
        done = subprocess.run([sys.executable, "-m", "drkernel.cli.main", "bench", "--out", str(out), "--resume"],
                              capture_output=True, text=True, env=env(), timeout=300)
    assert done.returncode == 0, done.stderr
    resumed = [tag for tag, _ in server.requests[before:]]
    assert sorted(resumed) == ["2_relu/0/2", "2_relu/1/2"]  # turn 1 was never asked again
    records = read_trajectories(out)
    assert sorted((r.sample, r.turn) for r in records) == [(0, 1), (0, 2), (1, 1), (1, 2)]  # none twice
    for sample in (0, 1):
        second = by_key(records)[("2_relu", sample, 2)]
        first = by_key(records)[("2_relu", sample, 1)]
        assert second.status == "correct" and second.context_turns == [1]
        assert second.messages[1:] == [{"role": "assistant", "content": first.response},
                                       {"role": "user", "content": first.feedback}]  # rebuilt from the records


class SpeedupEvaluator:
    """Judges `# speedup=X` comments instead of running code (X < 0: incorrect), so rewards are exact."""

    async def evaluate(self, task, code):
        speedup = float(re.search(r"# speedup=(\S+)", code).group(1))
        if speedup < 0:
            return EvalResult(status="incorrect")
        return EvalResult(status="correct", correct=True, speedup=speedup)


def answer(speedup: float) -> str:
    return fenced(f"class ModelNew:\n    pass  # speedup={speedup}")


# Rewards (base 0.5 + 0.5 x speedup): turn 1: 1.0, turn 2: 0, turn 3: 1.5, turn 4: 1.0, turn 5: 0 (no code).
POLICY_SCRIPT = [answer(1.0), answer(-1), answer(2.0), answer(1.0), "no code", answer(1.0)]


@pytest.mark.parametrize(("policy", "expected"), [
    ("full", [[], [1], [1, 2], [1, 2, 3], [1, 2, 3, 4], [1, 2, 3, 4, 5]]),
    ("last:2", [[], [1], [1, 2], [2, 3], [3, 4], [4, 5]]),
    ("topk:2", [[], [1], [1, 2], [1, 3], [3, 4], [3, 4]]),  # turn 5: 1.0 ties go to turn 4, the later one
    ("window:2", [[], [1], [1, 2], [2, 3], [3, 4], [3, 4]]),  # turn 6: sums 1, 1.5, 2.5, 1: turns 3-4
])
def test_context_policies_choose_exact_turns(tmp_path, policy, expected):
    task = load_task_file(REPO / "examples" / "tasks" / "2_relu.py")
    config = LoopConfig(samples=1, turns=6, context=ContextPolicy.parse(policy))
    with ScriptedChatServer(ChatScript({"2_relu": POLICY_SCRIPT})) as server:
        model = OpenAIChatModel(OpenAIChatConfig(server.url, "scripted"))
        outcome = asyncio.run(run_loop([task], model, SpeedupEvaluator(), config, tmp_path))
    assert [r.context_turns for r in outcome.records] == expected
    assert [r.reward for r in outcome.records] == [1.0, 0.0, 1.5, 1.0, 0.0, 1.0]
    last = outcome.records[-1]
    shown = [m["content"] for m in last.messages[1::2]]
    assert shown == [outcome.records[t - 1].response for t in expected[-1]]
    assert all(m["content"] == outcome.records[t - 1].feedback for m, t in zip(last.messages[2::2], expected[-1]))


def test_retries_honour_retry_after_then_give_up(tmp_path):
    script = ChatScript({"t": [Reply("ok", fail_status=429, fail_times=2, retry_after=0.3),
                               Reply("never", fail_status=500, fail_times=99)]})
    with ScriptedChatServer(script) as server:
        model = OpenAIChatModel(OpenAIChatConfig(server.url, "m", max_retries=2, backoff_s=0.01))

        async def calls():
            started = time.monotonic()
            first = await model.complete([{"role": "user", "content": "x"}], SamplingParams(), tag="t/0/1")
            waited = time.monotonic() - started
            with pytest.raises(GenerationError, match="HTTP 500: .*scripted failure 3 of 99.*after 2 retries"):
                await model.complete([{"role": "user", "content": "x"}], SamplingParams(), tag="t/0/2")
            await model.close()
            return first, waited

        first, waited = asyncio.run(calls())
    assert first.text == "ok" and first.usage == {"prompt_tokens": 1, "completion_tokens": 1}
    assert waited >= 0.6  # two Retry-After waits of 0.3 s, not the 0.01 s backoff
    assert [tag for tag, _ in server.requests] == ["t/0/1"] * 3 + ["t/0/2"] * 3


def invoke(args: list[str], **env_vars: str):
    return CliRunner().invoke(app, ["bench", "--device", "cpu", "--workers", "1", *args], env=env_vars)


@pytest.mark.slow
def test_bad_input_clear_messages_and_exit_codes(tmp_path):
    tasks = str(REPO / "examples" / "tasks")
    no_code = ChatScript({"2_relu": ["no code"], "bad": ["no code"]})
    with ScriptedChatServer(no_code, api_key="right", model="scripted") as server:
        base = ["--tasks", tasks, "--name", "2_relu", "--base-url", server.url]
        wrong_key = invoke([*base, "--model", "scripted", "--out", str(tmp_path / "key")], OPENAI_API_KEY="wrong")
        assert wrong_key.exit_code == 2
        assert "refused the API key from $OPENAI_API_KEY (HTTP 401)" in " ".join(wrong_key.output.split())
        assert read_trajectories(tmp_path / "key") == [] and (tmp_path / "key" / "config.json").exists()
        unknown = invoke([*base, "--model", "gpt-9", "--out", str(tmp_path / "model")], OPENAI_API_KEY="right")
        assert unknown.exit_code == 2 and "model or endpoint not found (HTTP 404)" in " ".join(unknown.output.split())
        ok = invoke([*base, "--model", "scripted", "--out", str(tmp_path / "ok"), "--turns", "2"],
                    OPENAI_API_KEY="right")
        assert ok.exit_code == 0, ok.output  # answers without code are a verdict, not a failure of the run
        assert [r.status for r in read_trajectories(tmp_path / "ok")] == ["format_error", "format_error"]
        again = invoke([*base, "--model", "scripted", "--out", str(tmp_path / "ok")], OPENAI_API_KEY="right")
        assert again.exit_code == 2 and "already holds a run; pass --resume" in " ".join(again.output.split())
        changed = invoke(["--out", str(tmp_path / "ok"), "--resume", "--samples", "3"], OPENAI_API_KEY="right")
        assert changed.exit_code == 2 and "cannot change" in changed.output and "samples (1 -> 3)" in changed.output

        folder = tmp_path / "tasks"
        folder.mkdir()
        (folder / "2_relu.py").write_text((REPO / "examples" / "tasks" / "2_relu.py").read_text())
        (folder / "bad.py").write_text("class Model:\n    pass\n")
        partial = invoke(["--tasks", str(folder), "--problems", "2", "--base-url", server.url, "--model",
                          "scripted", "--out", str(tmp_path / "partial")], OPENAI_API_KEY="right")
        assert partial.exit_code == 0, partial.output
        assert "skipped a task that does not load" in partial.output and "missing get_inputs" in partial.output
        assert [r.task for r in read_trajectories(tmp_path / "partial")] == ["2_relu"]
        (folder / "2_relu.py").unlink()
        nothing = invoke(["--tasks", str(folder), "--base-url", server.url, "--model", "scripted",
                          "--out", str(tmp_path / "nothing")], OPENAI_API_KEY="right")
        assert nothing.exit_code == 2 and "no task loads" in nothing.output

    unreachable = invoke(["--tasks", tasks, "--name", "2_relu", "--base-url", server.url, "--model", "m",
                          "--retries", "1", "--out", str(tmp_path / "down")])
    assert unreachable.exit_code == 2 and "cannot connect to http://127.0.0.1:" in unreachable.output
    assert "--resume" in unreachable.output

    silent = ChatScript({"2_relu": [Reply("late", delay_s=2)]})
    with ScriptedChatServer(silent) as server:
        timed_out = invoke(["--tasks", tasks, "--name", "2_relu", "--base-url", server.url, "--model", "m",
                            "--retries", "0", "--request-timeout", "0.3", "--samples", "2",
                            "--out", str(tmp_path / "slow")])
    said = " ".join(timed_out.output.split())
    assert timed_out.exit_code == 2 and "every model request failed (2)" in said
    assert "no answer within 0.3 s" in said and "rerun with --resume once the model answers" in said
    assert read_trajectories(tmp_path / "slow") == []  # failed calls are not turns: a resume asks them again
    assert sorted((f.sample, f.turn) for f in read_generation_errors(tmp_path / "slow")) == [(0, 1), (1, 1)]


def test_bench_evaluates_through_the_service(tmp_path):
    """`--service URL`: the verdicts come from a `drkernel serve` app (over a backend that answers at once)."""
    pytest.importorskip("fastapi")
    from tests.test_service_api import TOKEN, ScriptedBackend, serving

    from drkernel.service.dispatcher import Dispatcher
    from drkernel.service.store import Store

    code = "verdict {}\nclass ModelNew:\n    pass\n"
    script = ChatScript({"2_relu": [fenced(code.format("runtime_error")), fenced(code.format("correct"))]})
    backend = ScriptedBackend()
    with ScriptedChatServer(script) as chat, serving(Dispatcher(Store(tmp_path / "s.db"), backend, "cpu")) as base:
        result = invoke(["--tasks", str(REPO / "examples" / "tasks"), "--name", "2_relu", "--model", "m",
                         "--base-url", chat.url, "--service", base, "--turns", "2", "--out", str(tmp_path / "run")],
                        DRKERNEL_TOKEN=TOKEN)
    assert result.exit_code == 0, result.output
    records = read_trajectories(tmp_path / "run")
    assert [(r.status, r.reward) for r in records] == [("runtime_error", 0.0), ("correct", 0.5)]
    assert "Error (Scripted): scripted runtime_error" in records[1].messages[-1]["content"]
    assert [r.candidate for r in backend.submitted] == [code.format("runtime_error"), code.format("correct")]
    assert backend.submitted[0].reference == load_task_file(REPO / "examples" / "tasks" / "2_relu.py").code


TASKS = str(REPO / "examples" / "tasks")


def refused(server: ScriptedChatServer, model: str, status: int, attempt: int, times: int) -> str:
    """The cause the client gives for a scripted failure that retrying did not fix."""
    body = json.dumps({"error": {"message": f"scripted failure {attempt} of {times}", "type": "server_error"}})
    return f"{server.url} (model {model!r}) answered HTTP {status}: {body} (after 0 retries)"


@pytest.mark.slow
def test_failed_generations_are_logged_not_recorded_and_resume_asks_them_again(tmp_path):
    down = Reply("never", fail_status=500, fail_times=99)
    script = ChatScript(samples={"2_relu": {0: ["Let me think first.", down], 1: [down]}})
    out = tmp_path / "run"
    with ScriptedChatServer(script) as server:
        first = invoke(["--tasks", TASKS, "--name", "2_relu", "--model", "m", "--base-url", server.url, "--samples",
                        "2", "--turns", "2", "--retries", "0", "--no-perf", "--trials", "1", "--out", str(out)])
        said = " ".join(first.output.split())
        assert first.exit_code == 0, first.output  # a turn was judged: the run proceeded
        assert "2 of 2 trajectories incomplete, 2 turns whose model call failed for good" in said
        assert "a model request failed for good (its trajectory stopped; --resume asks the turn again)" in said
        assert [(r.sample, r.turn, r.status) for r in read_trajectories(out)] == [(0, 1, "format_error")]
        failures = sorted(read_generation_errors(out), key=lambda f: f.sample)
        cause = refused(server, "m", 500, 1, 99)
        assert [(f.task, f.sample, f.turn, f.cause) for f in failures] == [("2_relu", 0, 2, cause),
                                                                          ("2_relu", 1, 1, cause)]
        assert all(datetime.fromisoformat(f.time).utcoffset().total_seconds() == 0 for f in failures)
        summary = json.loads((out / "summary.json").read_text())
        assert (summary["planned_trajectories"], summary["incomplete_trajectories"], summary["generation_errors"],
                summary["turns_judged"]) == (2, 2, 2, 1)

        before = len(server.requests)
        script.samples["2_relu"] = {0: ["Let me think first.", fenced(candidate("2_relu__triton"))], 1: ["no code"]}
        resumed = invoke(["--out", str(out), "--resume"])
        assert resumed.exit_code == 0, resumed.output
        assert "incomplete" not in resumed.output
        asked = sorted(tag for tag, _ in server.requests[before:])
    assert asked == ["2_relu/0/2", "2_relu/1/1", "2_relu/1/2"]  # the failed turns again, the completed one never
    records = read_trajectories(out)
    assert sorted((r.sample, r.turn, r.status, r.context_turns) for r in records) == [
        (0, 1, "format_error", []), (0, 2, "correct", [1]), (1, 1, "format_error", []), (1, 2, "format_error", [1])]
    first_turn, second_turn = by_key(records)[("2_relu", 0, 1)], by_key(records)[("2_relu", 0, 2)]
    assert second_turn.messages[1:] == [{"role": "assistant", "content": "Let me think first."},
                                        {"role": "user", "content": first_turn.feedback}]
    assert second_turn.reward == 0.5 and second_turn.code == candidate("2_relu__triton")
    assert len(read_generation_errors(out)) == 2  # the log keeps what happened; the summary what is missing
    summary = json.loads((out / "summary.json").read_text())
    assert (summary["planned_trajectories"], summary["incomplete_trajectories"], summary["generation_errors"],
            summary["turns_judged"]) == (2, 0, 0, 4)
    assert summary["statuses"] == {"correct": 1, "format_error": 3}


def test_request_seeds_differ_across_tasks_samples_and_turns_and_repeat():
    """With `seed + sample`, sample 0 of every task drew the same random stream: the miniature's one-sample probe
    of 32 tasks answered 27 of them with the same kind of kernel (docs/miniature.md)."""
    seeds = [request_seed(0, task, sample, turn) for task in ("1_a", "2_b") for sample in (0, 1) for turn in (1, 2)]
    assert len(set(seeds)) == 8 and all(0 <= seed < 2**31 for seed in seeds)
    assert request_seed(0, "1_a", 0, 1) == request_seed(0, "1_a", 0, 1) != request_seed(1, "1_a", 0, 1)


def test_sampling_settings_reach_the_server_as_sent(tmp_path):
    sent = {"model": "m", "temperature": 0.25, "top_p": 0.5, "max_tokens": 77, "stop": ["###", "</answer>"]}
    with ScriptedChatServer(ChatScript({"2_relu": ["no code"]})) as server:
        base = ["--tasks", TASKS, "--name", "2_relu", "--model", "m", "--base-url", server.url]
        result = invoke([*base, "--samples", "2", "--temperature", "0.25", "--top-p", "0.5", "--max-tokens", "77",
                         "--stop", "###", "--stop", "</answer>", "--seed", "41", "--out", str(tmp_path / "set")])
        assert result.exit_code == 0, result.output
        resumed = invoke(["--out", str(tmp_path / "set"), "--resume", "--turns", "2"])  # the saved settings
        assert resumed.exit_code == 0, resumed.output
        defaults = invoke([*base, "--out", str(tmp_path / "defaults")])
        assert defaults.exit_code == 0, defaults.output
    settings = [(tag, {k: v for k, v in body.items() if k != "messages"})
                for (tag, _), body in zip(server.requests, server.bodies)]
    asked = [(tag, {**sent, "seed": request_seed(41, "2_relu", int(tag.split("/")[1]), int(tag.split("/")[2]))})
             for tag in ("2_relu/0/1", "2_relu/0/2", "2_relu/1/1", "2_relu/1/2")]
    assert sorted(settings[:4], key=lambda pair: pair[0]) == asked
    assert len({body["seed"] for _, body in asked}) == 4  # each request its own stream, the same in a rerun
    assert settings[4:] == [("2_relu/0/1", {"model": "m", "temperature": 1.0, "top_p": 0.95, "max_tokens": 8192})]


def test_fatal_error_mid_run_keeps_turns_and_resume_with_a_valid_key_continues(tmp_path):
    script = ChatScript({"2_relu": ["Let me think first.", Reply("Still thinking.", fail_status=401, fail_times=1),
                                    "No code yet."]})
    out = tmp_path / "run"
    with ScriptedChatServer(script, api_key="right") as server:
        stopped = invoke(["--tasks", TASKS, "--name", "2_relu", "--model", "m", "--base-url", server.url,
                          "--turns", "3", "--out", str(out)], OPENAI_API_KEY="right")
        said = " ".join(stopped.output.split())
        assert stopped.exit_code == 2
        assert (f"the model cannot be used: {server.url} (model 'm') refused the API key from $OPENAI_API_KEY (HTTP "
                f"401)") in said
        assert f"Turns recorded so far are kept in {out}; fix the cause and rerun with --resume." in said
        assert [(r.turn, r.response) for r in read_trajectories(out)] == [(1, "Let me think first.")]
        assert read_generation_errors(out) == []  # a fatal error stops the run; it is no failed turn
        summary = json.loads((out / "summary.json").read_text())
        assert (summary["incomplete_trajectories"], summary["generation_errors"]) == (1, 0)

        wrong = invoke(["--out", str(out), "--resume"], OPENAI_API_KEY="wrong")
        assert wrong.exit_code == 2 and "refused the API key" in " ".join(wrong.output.split())
        assert len(read_trajectories(out)) == 1
        before = len(server.requests)
        resumed = invoke(["--out", str(out), "--resume"], OPENAI_API_KEY="right")
        assert resumed.exit_code == 0, resumed.output
        asked = [tag for tag, _ in server.requests[before:]]
    assert asked == ["2_relu/0/2", "2_relu/0/3"]
    records = read_trajectories(out)
    assert [(r.turn, r.response, r.context_turns) for r in records] == [
        (1, "Let me think first.", []), (2, "Still thinking.", [1]), (3, "No code yet.", [1, 2])]


@pytest.mark.slow
@pytest.mark.parametrize("cache", ["4096", "0"], ids=["cache", "no-cache"])
def test_bench_judges_identical_answers_once_and_records_it(tmp_path, cache):
    """Three samples give the same answer: with the result cache one is judged, the others' records say cached."""
    script = ChatScript({"2_relu": [fenced(candidate("2_relu__wrong"))]})
    out = tmp_path / "run"
    with ScriptedChatServer(script) as server:
        done = invoke(["--tasks", str(REPO / "examples" / "tasks"), "--name", "2_relu", "--model", "scripted",
                       "--base-url", server.url, "--samples", "3", "--no-perf", "--trials", "1", "--timeout", "120",
                       "--result-cache", cache, "--out", str(out)])
    assert done.exit_code == 0, done.output
    records = read_trajectories(out)
    assert [r.status for r in records] == ["incorrect"] * 3
    cached = sorted(r.cached for r in records)
    assert cached == ([False, True, True] if cache != "0" else [False] * 3)
    assert json.loads((out / "summary.json").read_text())["turns_cached"] == sum(cached)
    assert json.loads((out / "config.json").read_text())["engine"]["result_cache"] == int(cache)


def test_replay_server_has_a_command_line(tmp_path):
    """`python -m drkernel.agent.replay` serves a script file and says where; bad usage exits 2 (friction 5)."""
    import os
    import subprocess
    import sys
    import urllib.request

    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parent.parent)}
    bare = subprocess.run([sys.executable, "-m", "drkernel.agent.replay"], capture_output=True, text=True, env=env)
    assert bare.returncode == 2 and "--script" in bare.stderr
    script = tmp_path / "script.json"
    script.write_text(json.dumps({"replies": {"relu": ["hello"]}}))
    server = subprocess.Popen([sys.executable, "-m", "drkernel.agent.replay", "--script", str(script), "--port", "0"],
                              stderr=subprocess.PIPE, text=True, env=env)
    try:
        line = server.stderr.readline()
        assert "scripted OpenAI-compatible server at http://127.0.0.1:" in line
        url = line.split(" at ")[1].split()[0]
        request = urllib.request.Request(f"{url}/chat/completions", data=json.dumps({"messages": []}).encode(),
                                         headers={"X-Drkernel-Request": "relu/0/1", "Content-Type": "application/json"})
        with urllib.request.urlopen(request, timeout=10) as response:
            assert json.load(response)["choices"][0]["message"]["content"] == "hello"
    finally:
        server.terminate()
        server.wait(timeout=10)


def test_export_sft_that_keeps_nothing_says_why(tmp_path):
    """On a CPU run no turn reaches the default speedup filter: the empty file comes with a hint (friction 6)."""
    from drkernel.agent.records import TRAJECTORIES, TurnRecord

    result = {"status": "correct", "correct": True, "speedup": 0.02, "environment": {"interpreter": True}}
    record = TurnRecord(task="level1/2_relu", level=1, sample=0, turn=1, messages=[{"role": "user", "content": "q"}],
                        response="a", code="c", result=result, reward=1.0, feedback="", context_turns=[])
    (tmp_path / TRAJECTORIES).write_text(json.dumps(record.to_dict()) + "\n")
    done = CliRunner().invoke(app, ["export-sft", str(tmp_path), "--out", str(tmp_path / "sft.jsonl")])
    assert done.exit_code == 0, done.output
    text = " ".join(done.output.split())
    assert "0 of 1 turns written" in text
    assert "1 correct turns measured no speedup of at least --min-speedup 1 (their timings come from Triton's " \
           "interpreter on the CPU); --min-speedup 0 keeps them" in text
