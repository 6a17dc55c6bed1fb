"""examples/trl_openenv_grpo.py: TRL's GRPOTrainer takes an optimizer step on drkernel's OpenEnv environment, on the
CPU, with a tiny random policy, and its rewards are the environment's verdicts."""

from __future__ import annotations

import importlib.util
import socket
import sys
import threading
import time
from pathlib import Path

import pytest

pytest.importorskip("trl")
pytest.importorskip("openenv")
torch = pytest.importorskip("torch")
uvicorn = pytest.importorskip("uvicorn")

from drkernel.agent.evaluate import BackendEvaluator  # noqa: E402
from drkernel.agent.replay import fenced  # noqa: E402
from drkernel.integrations.openenv import (  # noqa: E402
    EpisodeConfig, KernelEnvironment, KernelObservation, create_server)
from drkernel.scheduling.scheduler import Scheduler  # noqa: E402
from drkernel.schema import EvalOptions  # noqa: E402
from drkernel.tasks import load_task_dir  # noqa: E402

REPO = Path(__file__).resolve().parent.parent
CANDIDATES = REPO / "examples" / "candidates"
OPTIONS = EvalOptions(device="cpu", measure_performance=False, correctness_trials=1, timeout_s=120)
TURNS = 2
CORRECT = fenced((CANDIDATES / "2_relu__triton.py").read_text())


def _example():
    spec = importlib.util.spec_from_file_location("trl_openenv_grpo", REPO / "examples" / "trl_openenv_grpo.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up
    spec.loader.exec_module(module)
    return module


class Spy:
    """A session of the example's in-process environment that records every step. `scripted` replaces the model's
    last answer by a correct kernel, so that the group's rewards differ and GRPO has a gradient (the earlier turns
    stay the model's, as the next turn's chat must extend them)."""

    def __init__(self, session, scripted: bool) -> None:
        self.session, self.scripted = session, scripted
        self.steps: list[tuple[str, str, KernelObservation]] = []  # (model's answer, answer judged, observation)
        self.turn = 0

    async def reset(self, task: str) -> KernelObservation:
        self.turn = 0
        return await self.session.reset(task)

    async def step(self, answer: str) -> KernelObservation:
        self.turn += 1
        sent = CORRECT if self.scripted and self.turn == TURNS else answer
        observation = await self.session.step(sent)
        self.steps.append((answer, sent, observation))
        return observation

    async def close(self) -> None:
        await self.session.close()


@pytest.mark.slow
def test_grpo_takes_a_step_on_environment_rewards(tmp_path: Path) -> None:
    from transformers import AutoModelForCausalLM

    from drkernel.train.policy import PolicyShape, build_policy

    example = _example()
    texts = [p.read_text() for p in sorted(CANDIDATES.glob("*.py"))]
    policy = build_policy(tmp_path / "policy", texts, PolicyShape(hidden_size=32, intermediate_size=64))
    tasks = [t for t in load_task_dir(REPO / "examples" / "tasks") if t.key == "2_relu"]
    scheduler = Scheduler(device="cpu", workers=1, cache_entries=0)
    evaluator = BackendEvaluator(scheduler, OPTIONS)
    spies: list[Spy] = []

    def new_session() -> Spy:
        env = KernelEnvironment(tasks, evaluator, EpisodeConfig(turns=TURNS))
        spies.append(Spy(example.LocalSession(env), scripted=not spies))  # the first session's last answer
        return spies[-1]

    args = example.parse_args([
        "--model", str(policy), "--task", "2_relu", "--device", "cpu", "--max-steps", "1", "--output-dir",
        str(tmp_path / "run"), "--num-generations", "2", "--max-completion-length", "8", "--turns", str(TURNS),
    ])
    try:
        trainer = example.train(args, new_session)
    finally:
        scheduler.close()

    assert trainer.state.global_step == 1
    assert len(spies) == 2 and all(len(s.steps) == TURNS for s in spies)
    for spy in spies:
        for answer, sent, observation in spy.steps:
            if sent == answer:  # the tiny model's text holds no code: the environment calls it a format error
                assert "```" not in answer
                assert (observation.status, observation.reward) == ("format_error", 0.0)
        first_answer, _, first = spy.steps[0]
        # the next turn's chat shows the model's answer verbatim: the turns were one sequence
        assert first.messages[1] == {"role": "assistant", "content": first_answer} and not first.done
        assert spy.steps[-1][2].done
    judged = spies[0].steps[-1][2]
    assert (judged.status, judged.reward) == ("correct", 0.5)  # verdicts of the real evaluator
    returns = [sum(o.reward for _, _, o in s.steps) for s in spies]
    logged = trainer.state.log_history[0]
    assert logged["rewards/environment_return/mean"] == pytest.approx(sum(returns) / len(returns)) == 0.25
    assert torch.isfinite(torch.tensor(logged["loss"]))
    before = AutoModelForCausalLM.from_pretrained(policy)
    after = dict(trainer.model.named_parameters())
    assert any(not torch.equal(p.detach(), after[n].detach()) for n, p in before.named_parameters())


class NoEvaluator:
    async def evaluate(self, task, code):
        raise AssertionError("an answer without code is judged without the evaluator")


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


@pytest.mark.slow
def test_the_command_line_trains_behind_a_server(tmp_path: Path) -> None:
    from drkernel.train.policy import PolicyShape, build_policy

    example = _example()
    texts = [p.read_text() for p in sorted(CANDIDATES.glob("*.py"))]
    policy = build_policy(tmp_path / "policy", texts, PolicyShape(hidden_size=32, intermediate_size=64))
    tasks = [t for t in load_task_dir(REPO / "examples" / "tasks") if t.key == "2_relu"]
    port = _free_port()
    server = uvicorn.Server(uvicorn.Config(create_server(tasks, NoEvaluator(), EpisodeConfig(turns=TURNS)),
                                           host="127.0.0.1", port=port, log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    try:
        deadline = time.monotonic() + 30
        while not server.started and time.monotonic() < deadline:
            time.sleep(0.05)
        out = tmp_path / "run"
        assert example.main([
            "--model", str(policy), "--task", "2_relu", "--device", "cpu", "--max-steps", "1", "--output-dir",
            str(out), "--num-generations", "2", "--max-completion-length", "8", "--env-url", f"http://127.0.0.1:{port}",
        ]) == 0
    finally:
        server.should_exit = True
        thread.join(10)
    assert (out / "config.json").is_file() and list(out.glob("*.safetensors"))  # the trained policy, saved


def test_bad_arguments_are_refused(tmp_path: Path) -> None:
    example = _example()
    with pytest.raises(SystemExit):
        example.parse_args(["--model", "m", "--num-generations", "1"])
    with pytest.raises(ValueError, match="no task nope in"):
        example.select_tasks(REPO / "examples" / "tasks", ["nope"])
