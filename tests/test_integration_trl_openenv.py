"""examples/trl_openenv_grpo.py with TRL 1.16: GRPOTrainer takes an optimizer step on drkernel's OpenEnv environment,
through openenv-core's client, on the CPU, with a tiny random policy carrying Qwen3's bundled chat template, on both
routes (`environment_factory` tools and `rollout_func` turns); its rewards are the environment's verdicts."""

from __future__ import annotations

from pathlib import Path

import pytest

pytest.importorskip("trl")
pytest.importorskip("openenv")
torch = pytest.importorskip("torch")
pytest.importorskip("uvicorn")

from drkernel.agent.replay import fenced  # noqa: E402
from drkernel.integrations.openenv import EpisodeConfig, KernelObservation, create_server  # noqa: E402
from drkernel.tasks import load_task_dir  # noqa: E402
from tests.scripts import load_script  # noqa: E402

REPO = Path(__file__).resolve().parent.parent
CANDIDATES = REPO / "examples" / "candidates"
TURNS = 2
CORRECT = fenced((CANDIDATES / "2_relu__triton.py").read_text())


@pytest.fixture(scope="module")
def example():
    return load_script("examples/trl_openenv_grpo.py")


@pytest.fixture(scope="module")
def policy(tmp_path_factory) -> Path:
    """A tiny random policy whose tokenizer, built here, carries Qwen3's bundled chat template (TRL's copy, which
    TRL recognises Qwen3 tokenizers by): it renders an earlier turn differently once a user message follows it, and
    it supports tool calls."""
    from transformers import AutoTokenizer
    from trl.chat_template_utils import qwen3_chat_template

    from drkernel.train.policy import PolicyShape, build_policy

    texts = [p.read_text() for p in sorted(CANDIDATES.glob("*.py"))]
    path = build_policy(tmp_path_factory.mktemp("policy"), texts, PolicyShape(hidden_size=32, intermediate_size=64))
    tokenizer = AutoTokenizer.from_pretrained(path)
    tokenizer.chat_template = qwen3_chat_template
    tokenizer.save_pretrained(path)
    return path


def _args(policy: Path, out: Path, *more: str) -> list[str]:
    return [
        "--model", str(policy), "--task", "2_relu", "--device", "cpu", "--max-steps", "1", "--output-dir", str(out),
        "--num-generations", "2", "--max-completion-length", "8", *more,
    ]


class Spy:
    """A connection that records every step. `scripted` replaces the model's last answer by a correct kernel, so that
    the group's rewards differ and GRPO has a gradient (the earlier turns stay the model's, as the next turn's chat
    must extend them)."""

    def __init__(self, connection, scripted: bool) -> None:
        self.connection, self.scripted = connection, scripted
        self.steps: list[tuple[str, str, KernelObservation]] = []  # (model's answer, answer judged, observation)
        self.turn = 0

    async def reset(self, task: str) -> KernelObservation:
        self.turn = 0
        return await self.connection.reset(task)

    async def step(self, answer: str) -> KernelObservation:
        self.turn += 1
        sent = CORRECT if self.scripted and self.turn == TURNS else answer
        observation = await self.connection.step(sent)
        self.steps.append((answer, sent, observation))
        return observation

    async def close(self) -> None:
        await self.connection.close()


@pytest.mark.slow
def test_grpo_takes_a_step_on_environment_rewards(example, policy: Path, tmp_path: Path, monkeypatch) -> None:
    """The script's own server (the embedded scheduler judging on the CPU), the connections and the rollout watched."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    spies: list[Spy] = []
    rollouts: list[dict] = []
    play = example.EnvironmentRollout.__call__
    monkeypatch.setattr(example.EnvironmentRollout, "__call__",
                        lambda self, prompts, trainer: rollouts.append(play(self, prompts, trainer)) or rollouts[-1])

    def new_connection(url: str) -> Spy:
        spies.append(Spy(example.EnvConnection(url, 300), scripted=not spies))  # the first connection's last answer
        return spies[-1]

    args = example.parse_args(_args(policy, tmp_path / "run", "--turns", str(TURNS), "--route", "turns"))
    trainer = example.train(args, new_connection)

    assert trainer.state.global_step == 1
    # one connection per episode of the group
    episodes = [s for s in spies if s.steps]
    assert len(spies) == 2 and len(episodes) == 2 and all(len(s.steps) == TURNS for s in episodes)
    for spy in episodes:
        for answer, sent, observation in spy.steps:
            if sent == answer:  # the tiny model's text holds no code: the environment calls it a format error
                assert "```" not in answer
                assert (observation.status, observation.reward) == ("format_error", 0.0)
        first_answer, _, first = spy.steps[0]
        # the next turn's chat shows the model's answer verbatim: the turns were one sequence
        assert first.messages[1] == {"role": "assistant", "content": first_answer} and not first.done
        assert spy.steps[-1][2].done
    # each completion: the model's answers under env_mask 1, the environment's feedback under env_mask 0
    tokenizer = AutoTokenizer.from_pretrained(policy)
    (rollout,) = rollouts
    for spy, ids, mask in zip(episodes, rollout["completion_ids"], rollout["env_mask"]):
        runs = torch.tensor(mask).diff(prepend=torch.tensor([0]), append=torch.tensor([0])).nonzero().flatten()
        spans = runs.view(-1, 2).tolist()
        answers = [ids[a:b - 1] if ids[b - 1] == tokenizer.eos_token_id else ids[a:b] for a, b in spans]
        assert [example._decode(tokenizer, a) for a in answers] == [answer for answer, _, _ in spy.steps]
        environment = tokenizer.decode([i for i, m in zip(ids, mask) if not m])
        assert spy.steps[0][2].feedback in environment
    judged = spies[0].steps[-1][2]
    assert (judged.status, judged.reward) == ("correct", 0.5)  # a verdict of the real evaluator
    returns = [sum(o.reward for _, _, o in s.steps) for s in episodes]
    logged = trainer.state.log_history[0]
    assert logged["rewards/environment_return/mean"] == pytest.approx(sum(returns) / len(returns)) == 0.25
    assert torch.isfinite(torch.tensor(logged["loss"]))
    before = AutoModelForCausalLM.from_pretrained(policy)
    after = dict(trainer.model.named_parameters())
    assert any(not torch.equal(p.detach(), after[n].detach()) for n, p in before.named_parameters())


class NoEvaluator:
    async def evaluate(self, task, code):
        raise AssertionError("an answer without code is judged without the evaluator")


@pytest.mark.slow
def test_the_command_line_trains_on_the_tool_route_behind_a_server(example, policy: Path, tmp_path: Path) -> None:
    """TRL's `environment_factory` route: the trainer takes KernelTools (TRL checks its reset, tools and reward, and
    the chat template's tool support) and runs a step; the tiny model calls no tool, so every return is 0."""
    tasks = [t for t in load_task_dir(REPO / "examples" / "tasks") if t.key == "2_relu"]
    opened = []

    def new_tools(url):
        opened.append(example.KernelTools(url))
        return opened[-1]

    with example.local_server(create_server(tasks, NoEvaluator(), EpisodeConfig(turns=TURNS))) as url:
        out = tmp_path / "run"
        trainer = example.train(example.parse_args(_args(policy, out, "--env-url", url)), new_tools=new_tools)
        trainer.save_model(str(out))
    assert trainer.state.global_step == 1 and len(opened) == 2  # one environment per rollout of the group
    assert trainer.state.log_history[0]["rewards/KernelTools/mean"] == 0.0
    assert (out / "config.json").is_file() and list(out.glob("*.safetensors"))  # the trained policy, saved


@pytest.mark.slow
def test_kernel_tools_judge_submissions_as_trl_calls_them(example, tmp_path: Path) -> None:
    """What TRL's tool loop does with an environment: reset with the dataset row, call the tool with the parsed
    arguments, read the reward at the end (here with the real evaluator on the CPU)."""
    from drkernel.scheduling.evaluator import BackendEvaluator
    from drkernel.scheduling.scheduler import Scheduler
    from drkernel.schema import EvalOptions

    tasks = [t for t in load_task_dir(REPO / "examples" / "tasks") if t.key == "2_relu"]
    scheduler = Scheduler(device="cpu", workers=1, cache_entries=0)
    options = EvalOptions(device="cpu", measure_performance=False, correctness_trials=1, timeout_s=120)
    try:
        with example.local_server(create_server(tasks, BackendEvaluator(scheduler, options), EpisodeConfig(turns=2))
                                  ) as url:
            (row,) = example.task_dataset(url, ["2_relu"], 300)
            tools = example.KernelTools(url)
            assert "submit_kernel" in tools.reset(**row)
            tools.submit_kernel((CANDIDATES / "2_relu__triton.py").read_text())
            assert tools.rewards == [0.5] and not tools.done  # judged correct by the real evaluator
            tools.submit_kernel("def not_a_kernel(): pass")
            assert tools.rewards == [0.5, 0.0] and tools.done
            assert tools.submit_kernel("one too many") == "The episode is over: no more submissions are judged."
            assert tools.get_reward() == 0.5
            tools.reset(**row)
            assert tools.get_reward() == 0.0
            tools.client.close()
    finally:
        scheduler.close()


def test_qwen3s_template_rewrites_earlier_turns_and_the_suffix_does_not(example, policy: Path) -> None:
    """Qwen3's template drops an earlier answer's reasoning once a user message follows it, so the next turn's chat,
    rendered whole, does not extend the prompt and the answer as sampled; the turns route appends only what the
    template writes after an answer, so the sequence stays the one the model sampled."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(policy)
    first = [{"role": "user", "content": "Write the kernel."}]
    answer = "<think>\nplan the blocks\n</think>\n\n```python\nclass ModelNew: pass\n```"
    feedback = {"role": "user", "content": "Incorrect: try again."}
    prompt = tokenizer.apply_chat_template(first, tokenize=False, add_generation_prompt=True)
    whole = tokenizer.apply_chat_template(first + [{"role": "assistant", "content": answer}, feedback],
                                          tokenize=False, add_generation_prompt=True)
    assert not whole.startswith(prompt + answer)  # what made the previous example raise at turn 2
    suffix = example.environment_suffix(tokenizer, [feedback])
    assert suffix == "<|im_end|>\n<|im_start|>user\nIncorrect: try again.<|im_end|>\n<|im_start|>assistant\n"
    # the same suffix follows an answer without reasoning in Qwen3's own rendering of the whole chat
    plain = "```python\nclass ModelNew: pass\n```"
    assert tokenizer.apply_chat_template(first + [{"role": "assistant", "content": plain}, feedback], tokenize=False,
                                         add_generation_prompt=True) == prompt + plain + suffix


def test_bad_arguments_are_refused(example) -> None:
    with pytest.raises(SystemExit):
        example.parse_args(["--model", "m", "--num-generations", "1"])
    with pytest.raises(ValueError, match="no task nope in"):
        example.select_tasks(REPO / "examples" / "tasks", ["nope"])


def test_use_vllm_is_refused_without_vllm(example, capsys) -> None:
    import importlib.util

    if importlib.util.find_spec("vllm") is not None:
        pytest.skip("vLLM is installed here")
    with pytest.raises(SystemExit):
        example.parse_args(["--model", "m", "--use-vllm"])
    assert "--use-vllm needs vLLM" in capsys.readouterr().err
    assert example.grpo_config(example.parse_args(["--model", "m", "--output-dir", "x"]), "cpu").use_vllm is False
