"""The verl plugin on the CPU: the registered `trloo` estimator against drkernel.rl on verl's data structures, the
kernel agent loop with a scripted rollout server (verl's generate interface) and drkernel's evaluators, PRS and the
void-turn rule as masks, and the MRS mapping against verl's own rejection sampling."""

from __future__ import annotations

import ast
import asyncio
import random
from pathlib import Path

import numpy as np
import pytest
import torch

pytest.importorskip("verl")
pytest.importorskip("transformers")

from omegaconf import OmegaConf  # noqa: E402
from verl.experimental.agent_loop.agent_loop import AgentLoopOutput, DictConfigWrap, _agent_loop_registry  # noqa: E402
from verl.protocol import DataProto  # noqa: E402
from verl.trainer.config import AlgoConfig, RolloutCorrectionConfig  # noqa: E402
from verl.trainer.ppo.core_algos import get_adv_estimator_fn  # noqa: E402
from verl.trainer.ppo.rollout_corr_helper import compute_rollout_rejection_mask  # noqa: E402
from verl.workers.rollout.replica import TokenOutput  # noqa: E402

import drkernel.integrations.verl as plugin  # noqa: E402
from drkernel.agent.context import ContextPolicy, ShownTurn, build_messages  # noqa: E402
from drkernel.agent.loop import judge_answer  # noqa: E402
from drkernel.agent.prompts import PromptTemplates, first_turn_prompt  # noqa: E402
from drkernel.rl import RewardConfig, mismatch_keep_mask, reward_to_go, trloo_advantages  # noqa: E402
from drkernel.schema import EvalResult, Profile  # noqa: E402
from drkernel.tasks import load_task_dir  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
CANDIDATES = REPO / "examples" / "candidates"
RELU = (CANDIDATES / "2_relu__triton.py").read_text()
CORRECT_ANSWER = f"Here is the kernel:\n```python\n{RELU}```"
NO_CODE_ANSWER = "I would rather not write code."


# --- the estimator --------------------------------------------------------------------------------------------------

def _episode_row(rng: random.Random, rewards: list[float], prs_dropped: set[int], width: int) -> tuple:
    """One episode row laid out as the agent loop lays it out: answers (mask 1, or 0 when PRS dropped the turn) with
    each turn's reward on the answer's last token, environment tokens (mask 0) between them, padding after."""
    token_rewards, mask, spans, position = [0.0] * width, [0] * width, [], 0
    for turn, value in enumerate(rewards):
        if turn:
            position += rng.randint(1, 5)  # the feedback and the chat template's tokens
        length = rng.randint(1, 6)
        spans.append((position, position + length))
        for p in range(position, position + length):
            mask[p] = 0 if turn in prs_dropped else 1
        token_rewards[position + length - 1] = value
        position += length
    assert position <= width
    return token_rewards, mask, spans


def test_trloo_estimator_equals_drkernel_rl_on_a_multi_turn_batch():
    rng = random.Random(7)
    uids, rows, episodes = [], [], []
    for prompt in range(3):
        for sample in range(4):
            turns = rng.choice([2, 3])
            rewards = [rng.choice([0.0, 0.5, 1.0, 1.7]) for _ in range(turns)]
            dropped = {t for t, r in enumerate(rewards) if r > 0 and rng.random() < 0.25}  # PRS drops correct turns
            rows.append(_episode_row(rng, rewards, dropped, 40))
            episodes.append((rewards, dropped))
            uids.append(f"uid-{prompt}")
    data = DataProto.from_dict(
        tensors={"token_level_rewards": torch.tensor([r[0] for r in rows], dtype=torch.float32),
                 "response_mask": torch.tensor([r[1] for r in rows], dtype=torch.int64)},
        non_tensors={"uid": np.array(uids, dtype=object)})
    # the call verl's compute_advantage makes for a registered estimator
    advantages, returns = get_adv_estimator_fn("trloo")(
        token_level_rewards=data.batch["token_level_rewards"], response_mask=data.batch["response_mask"],
        config=AlgoConfig(adv_estimator="trloo"), index=data.non_tensor_batch["uid"])

    flat = [(b, t) for b, (rewards, _) in enumerate(episodes) for t in range(len(rewards))]
    per_row_returns = [reward_to_go(torch.tensor(rewards, dtype=torch.float64)) for rewards, _ in episodes]
    flat_returns = torch.stack([per_row_returns[b][t] for b, t in flat])
    expected = trloo_advantages(flat_returns, [uids[b] for b, _ in flat], [t for _, t in flat])
    want_adv, want_ret = torch.zeros_like(advantages), torch.zeros_like(returns)
    voids = 0
    for n, (b, t) in enumerate(flat):
        rewards, dropped = episodes[b]
        start, end = rows[b][2][t]
        if t in dropped:
            continue  # out of the loss, but its return is in its group's baseline above
        want_ret[b, start:end] = float(flat_returns[n])
        void = rewards[t] <= 0 and max(rewards[:t], default=0.0) > 0
        voids += void
        want_adv[b, start:end] = 0.0 if void else float(expected[n])
    assert voids and any(dropped for _, dropped in episodes)  # the batch exercises both rules
    torch.testing.assert_close(advantages, want_adv)
    torch.testing.assert_close(returns, want_ret)


def test_trloo_estimator_refuses_settings_that_hide_the_turns():
    estimator = get_adv_estimator_fn("trloo")
    rewards, mask = torch.zeros(2, 4), torch.ones(2, 4, dtype=torch.int64)
    uids = np.array(["a", "a"], dtype=object)
    with pytest.raises(ValueError, match="use_kl_in_reward"):
        estimator(token_level_rewards=rewards, response_mask=mask, index=uids,
                  config=AlgoConfig(adv_estimator="trloo", use_kl_in_reward=True))
    with pytest.raises(ValueError, match="bypass mode"):
        estimator(token_level_rewards=rewards, response_mask=mask, index=uids,
                  config=AlgoConfig(adv_estimator="trloo",
                                    rollout_correction=RolloutCorrectionConfig.decoupled_geo_rs()))
    with pytest.raises(ValueError, match="uid"):
        estimator(token_level_rewards=rewards, response_mask=mask, config=AlgoConfig(adv_estimator="trloo"))


def test_mrs_settings_reject_what_mrs_rejects():
    settings = plugin.mrs_rollout_correction()
    RolloutCorrectionConfig(**settings)  # verl accepts them
    gen = torch.Generator().manual_seed(0)
    batch, length = 64, 50
    rollout = -torch.rand(batch, length, generator=gen, dtype=torch.float64) * 3
    drift = torch.linspace(-0.003, 0.003, batch, dtype=torch.float64).unsqueeze(1)  # means in and out of bounds
    trainer = rollout + drift + torch.randn(batch, length, generator=gen, dtype=torch.float64) * 1e-4
    mask = (torch.rand(batch, length, generator=gen) < 0.9).long()
    kept_mask, _ = compute_rollout_rejection_mask(trainer - rollout, mask, settings["rollout_rs"],
                                                  settings["rollout_rs_threshold"])
    verl_kept = (kept_mask == mask).all(dim=-1)
    drkernel_kept = mismatch_keep_mask(trainer, rollout, mask)
    assert 0 < int(drkernel_kept.sum()) < batch
    assert torch.equal(verl_kept, drkernel_kept)


# --- the agent loop -------------------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def tokenizer(tmp_path_factory):
    from transformers import AutoTokenizer

    from drkernel.train.policy import PolicyShape, build_policy

    texts = [p.read_text() for p in sorted(CANDIDATES.glob("*.py"))]
    path = build_policy(tmp_path_factory.mktemp("policy"), texts, PolicyShape(hidden_size=32, intermediate_size=64))
    return AutoTokenizer.from_pretrained(path)


@pytest.fixture(scope="module")
def tasks():
    return load_task_dir(REPO / "examples" / "tasks")


class ScriptedServer:
    """verl's rollout server interface (`generate(request_id, *, prompt_ids, sampling_params, ...) -> TokenOutput`),
    answering each call with the next scripted text and the end-of-turn token; it keeps what it was asked."""

    def __init__(self, tokenizer, answers: list[str]) -> None:
        self.tokenizer, self.answers = tokenizer, list(answers)
        self.prompts: list[list[int]] = []
        self.answered: list[list[int]] = []

    async def generate(self, request_id, *, prompt_ids, sampling_params, **kwargs) -> TokenOutput:
        assert sampling_params["max_tokens"] >= 1
        ids = self.tokenizer(self.answers.pop(0), add_special_tokens=False)["input_ids"] + [self.tokenizer.eos_token_id]
        self.prompts.append(list(prompt_ids))
        self.answered.append(ids)
        return TokenOutput(token_ids=ids)


class ScriptedEvaluator:
    """Hands out the given results in order (for the loop's masking logic, not KernelGym's verdicts)."""

    def __init__(self, results: list[EvalResult]) -> None:
        self.results = list(results)

    async def evaluate(self, task, code):
        return self.results.pop(0)


def _run_episode(tokenizer, tasks, server, evaluator, **settings) -> AgentLoopOutput:
    trainer = OmegaConf.create({"actor_rollout_ref": {"rollout": {"prompt_length": 4096, "response_length": 8192}},
                                "trainer": {"use_v1": True}})

    async def episode():  # verl builds each agent loop inside its worker's running event loop
        loop = plugin.KernelAgentLoop(DictConfigWrap(trainer), server, tokenizer, None, None,
                                      DictConfigWrap(OmegaConf.create({})), "qwen2", evaluator=evaluator, tasks=tasks,
                                      evaluator_retries=0, **settings)
        return await loop.run({"temperature": 1.0, "logprobs": False}, raw_prompt=[], extra_info={"task": "2_relu"})

    return asyncio.run(episode())


def test_registration():
    assert _agent_loop_registry[plugin.AGENT_LOOP] == {"_target_": "drkernel.integrations.verl.KernelAgentLoop"}
    assert get_adv_estimator_fn(plugin.ESTIMATOR) is plugin.compute_trloo_advantage


@pytest.mark.slow
def test_agent_loop_episode_matches_the_judged_answers(tokenizer, tasks):
    from drkernel.agent.evaluate import BackendEvaluator
    from drkernel.scheduling.scheduler import Scheduler
    from drkernel.schema import EvalOptions

    evaluator = BackendEvaluator(Scheduler(device="cpu", workers=1, cache_entries=0),
                                 EvalOptions(device="cpu", measure_performance=False, correctness_trials=1,
                                             timeout_s=120))
    try:
        server = ScriptedServer(tokenizer, [CORRECT_ANSWER, NO_CODE_ANSWER])
        out = _run_episode(tokenizer, tasks, server, evaluator, turns=2, prs=False)
        task = {t.key: t for t in tasks}["2_relu"]
        texts = [tokenizer.decode(ids, skip_special_tokens=True) for ids in server.answered]
        judged = [asyncio.run(judge_answer(task, text, evaluator, RewardConfig(profiling_reward=True),
                                           PromptTemplates())) for text in texts]
    finally:
        evaluator.backend.close()

    assert isinstance(out, AgentLoopOutput)
    assert out.extra_fields[plugin.TURN_STATUS] == [j.status for j in judged] == ["correct", "format_error"]
    assert out.extra_fields[plugin.TURN_SCORES] == [j.reward for j in judged] == [0.5, 0.0]
    assert out.reward_score == 0.5 and out.num_turns == 4
    # the mask marks exactly the model's tokens, in each answer's span
    (s1, e1), (s2, e2) = out.extra_fields[plugin.TURN_SPANS]
    assert out.response_mask == [1] * e1 + [0] * (s2 - e1) + [1] * (e2 - s2) and e2 == len(out.response_ids)
    assert [out.response_ids[s1:e1], out.response_ids[s2:e2]] == server.answered
    assert judged[0].feedback in tokenizer.decode(out.response_ids[e1:s2])
    # what the server saw at each turn is the chat template's rendering of drkernel's messages
    first = first_turn_prompt(task.code)
    messages, _ = build_messages(first, [ShownTurn(texts[0], judged[0].feedback, 0.5)], ContextPolicy("full"))
    assert server.prompts[0] == out.prompt_ids
    assert tokenizer.decode(server.prompts[1]) == tokenizer.apply_chat_template(messages, tokenize=False,
                                                                              add_generation_prompt=True)
    assert server.prompts[1] == out.prompt_ids + out.response_ids[:s2]
    # verl's v1 trainer stores as_dict(): each turn's reward on its answer's last token
    scores = out.as_dict()["rm_scores"]
    assert scores[e1 - 1] == 0.5 and float(scores.sum()) == 0.5


def test_prs_and_void_turns_leave_the_loss_but_not_the_baseline(tokenizer, tasks):
    def correct(coverage):
        return EvalResult(status="correct", correct=True, profile=Profile(coverage=coverage, meaningful=True))

    # turn 1 correct but lazy (coverage 0: PRS always drops it), turn 2 without code after it (void), turn 3 correct
    lazy = _run_episode(tokenizer, tasks, ScriptedServer(tokenizer, [CORRECT_ANSWER, NO_CODE_ANSWER, CORRECT_ANSWER]),
                        ScriptedEvaluator([correct(0.0), correct(1.0)]), turns=3, prs=True)
    plain = _run_episode(tokenizer, tasks, ScriptedServer(tokenizer, [NO_CODE_ANSWER, CORRECT_ANSWER, CORRECT_ANSWER]),
                         ScriptedEvaluator([correct(1.0), correct(0.5)]), turns=3, prs=True)
    assert lazy.extra_fields[plugin.TURN_SCORES] == [0.5, 0.0, 1.0]
    assert lazy.extra_fields[plugin.TURN_PRS_KEPT] == [False, True, True]
    assert plain.extra_fields[plugin.TURN_SCORES] == [0.0, 1.0, 0.75]
    spans = lazy.extra_fields[plugin.TURN_SPANS]
    mask = torch.tensor(lazy.response_mask)
    assert not mask[spans[0][0]:spans[0][1]].any()  # PRS: the lazy turn's answer is out of the loss
    assert mask[spans[1][0]:spans[1][1]].all() and mask[spans[2][0]:spans[2][1]].all()

    rows = [o.as_dict() for o in (lazy, plain)]
    width = max(len(r["responses"]) for r in rows)

    def pad(t: torch.Tensor) -> torch.Tensor:
        return torch.nn.functional.pad(t, (0, width - len(t)))

    advantages, _ = get_adv_estimator_fn("trloo")(
        token_level_rewards=torch.stack([pad(r["rm_scores"]) for r in rows]),
        response_mask=torch.stack([pad(r["response_mask"]) for r in rows]),
        index=np.array(["uid", "uid"], dtype=object), config=AlgoConfig(adv_estimator="trloo"))
    # both episodes' returns per turn: the lazy turn is found by its reward and stays in turn 1's baseline
    expected = trloo_advantages([1.5, 1.0, 1.0, 1.75, 1.75, 0.75], ["uid"] * 6, [0, 1, 2, 0, 1, 2])
    (_, _), (s2, e2), (s3, e3) = spans
    assert torch.all(advantages[0, s2:e2] == 0)  # void: reward 0 after a rewarded turn
    torch.testing.assert_close(advantages[0, s3:e3], torch.full((e3 - s3,), float(expected[2]), dtype=torch.float32))
    (p1, q1), _, _ = plain.extra_fields[plugin.TURN_SPANS]
    torch.testing.assert_close(advantages[1, p1:q1], torch.full((q1 - p1,), float(expected[3]), dtype=torch.float32))
    assert float(expected[3]) == pytest.approx(1.75 - 1.5)  # the baseline of turn 1 is the dropped turn's return


def test_agent_loop_refuses_bad_settings(tokenizer, tasks):
    with pytest.raises(ValueError, match="unknown drkernel agent loop setting"):
        _run_episode(tokenizer, tasks, ScriptedServer(tokenizer, []), ScriptedEvaluator([]), turn=3)
    with pytest.raises(ValueError, match="hides earlier turns"):
        _run_episode(tokenizer, tasks, ScriptedServer(tokenizer, []), ScriptedEvaluator([]), turns=3, context="last:1")


def test_dataset_rows_name_the_agent_loop_and_the_task(tasks, tmp_path):
    import pyarrow.parquet as pq

    path = plugin.write_dataset(tasks, tmp_path / "train.parquet")
    rows = pq.read_table(path).to_pylist()
    assert [r["extra_info"]["task"] for r in rows] == [t.key for t in tasks]
    assert {r["agent_name"] for r in rows} == {plugin.AGENT_LOOP}
    assert rows[0]["prompt"] == [{"role": "user", "content": first_turn_prompt(tasks[0].code)}]


def test_only_the_plugin_imports_verl():
    package = REPO / "drkernel"
    importers = set()
    for path in package.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else \
                [node.module or ""] if isinstance(node, ast.ImportFrom) else []
            if any(name == "verl" or name.startswith("verl.") for name in names):
                importers.add(path.relative_to(package).as_posix())
    assert importers == {"integrations/verl.py"}


def test_example_configuration_is_the_papers_recipe():
    from hydra import compose, initialize_config_dir

    with initialize_config_dir(config_dir=str(REPO / "examples" / "verl"), version_base=None):
        config = compose(config_name="drkernel_trloo")
    actor, rollout = config.actor_rollout_ref.actor, config.actor_rollout_ref.rollout
    assert (config.data.train_batch_size, rollout.n) == (16, 16)
    assert (actor.optim.lr, actor.clip_ratio_low, actor.clip_ratio_high) == (1e-6, 0.2, 0.28)
    assert not actor.use_kl_loss and not config.algorithm.use_kl_in_reward and actor.kl_loss_coef == 0
    assert config.algorithm.adv_estimator == plugin.ESTIMATOR and rollout.agent.default_agent_loop == plugin.AGENT_LOOP
    mrs = plugin.mrs_rollout_correction()
    assert {key: config.algorithm.rollout_correction[key] for key in mrs} == mrs
    assert plugin._check_trainer(config.algorithm) == 1.0
    (loop,) = OmegaConf.to_container(OmegaConf.load(REPO / rollout.agent.agent_loop_config_path))
    assert (loop.pop("name"), loop.pop("_target_")) == (plugin.AGENT_LOOP, "drkernel.integrations.verl.KernelAgentLoop")
    assert plugin.KernelEpisodeConfig.from_settings(loop).turns == 3
