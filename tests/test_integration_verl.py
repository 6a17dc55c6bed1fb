"""The verl plugin against verl 0.9.1 on the CPU: the documented command's configuration through verl's own
`validate_config` and the v1 trainer's tokenizer, datasets and loaders; the plugin found through verl's `verl.plugins`
entry-point discovery; the registered `trloo` estimator against `drkernel train`'s signal on verl's data structures;
the kernel agent loop with a scripted rollout server (verl's generate interface) and drkernel's evaluators; PRS and
the void-turn rule as masks; and MRS against verl's own rejection sampling and in verl's own actor loss."""

from __future__ import annotations

import ast
import asyncio
import os
import random
import shlex
import subprocess
import sys
import tomllib
from pathlib import Path

import numpy as np
import pytest
import torch

pytest.importorskip("verl")
pytest.importorskip("transformers")

import hydra  # noqa: E402
from omegaconf import OmegaConf  # noqa: E402
from verl.experimental.agent_loop.agent_loop import AgentLoopOutput, DictConfigWrap, _agent_loop_registry  # noqa: E402
from verl.protocol import DataProto  # noqa: E402
from verl.trainer.config import AlgoConfig, RolloutCorrectionConfig  # noqa: E402
from verl.trainer.ppo.core_algos import get_adv_estimator_fn  # noqa: E402
from verl.trainer.ppo.rollout_corr_helper import compute_rollout_rejection_mask  # noqa: E402
from verl.utils.tensordict_utils import list_of_dict_to_tensordict  # noqa: E402
from verl.workers.rollout.replica import TokenOutput  # noqa: E402

import drkernel.integrations.verl as plugin  # noqa: E402
from drkernel.integrations.verl_dataset import DatasetSpec, build_dataset, parse_spec, write_dataset  # noqa: E402
from drkernel.agent.context import ContextPolicy, ShownTurn, build_messages  # noqa: E402
from drkernel.agent.loop import judge_answer  # noqa: E402
from drkernel.agent.prompts import PromptTemplates, first_turn_prompt  # noqa: E402
from drkernel.rl import RewardConfig, mismatch_keep_mask  # noqa: E402
from drkernel.schema import EvalResult, Profile  # noqa: E402
from drkernel.tasks import load_task_dir  # noqa: E402
from drkernel.train.signals import JudgedTurn, step_signals  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
CANDIDATES = REPO / "examples" / "candidates"
RELU = (CANDIDATES / "2_relu__triton.py").read_text()
CORRECT_ANSWER = f"Here is the kernel:\n```python\n{RELU}```"
NO_CODE_ANSWER = "I would rather not write code."


def _estimate(rewards: torch.Tensor, mask: torch.Tensor, uids: list[str], **algorithm) -> tuple:
    """The registered estimator called as verl's compute_advantage calls one (verl/trainer/ppo/ray_trainer.py)."""
    data = DataProto.from_dict(tensors={"token_level_rewards": rewards, "response_mask": mask},
                               non_tensors={"uid": np.array(uids, dtype=object)})
    return get_adv_estimator_fn("trloo")(
        token_level_rewards=data.batch["token_level_rewards"], response_mask=data.batch["response_mask"],
        config=AlgoConfig(adv_estimator="trloo", **algorithm), index=data.non_tensor_batch["uid"])


def test_importing_the_plugin_registers_it_with_verl():
    assert _agent_loop_registry[plugin.AGENT_LOOP] == {"_target_": "drkernel.integrations.verl.KernelAgentLoop"}
    assert get_adv_estimator_fn(plugin.ESTIMATOR) is plugin.compute_trloo_advantage


# --- the estimator --------------------------------------------------------------------------------------------------

def test_trloo_estimator_gives_drkernel_trains_signal_on_a_multi_turn_batch():
    """Episodes of 1-3 turns, 4 per prompt, rows shuffled as verl may hand them: every turn's tokens get the
    advantage and return `drkernel train` computes (drkernel.train.signals.step_signals), void turns 0, and turns PRS
    left out stay out of the loss but in their group's baseline."""
    rng, samples, width = random.Random(7), 4, 48
    turns, layout = [], {}  # JudgedTurn of every turn (trajectory = prompt * samples + sample); row layouts
    for trajectory in range(3 * samples):
        count = rng.choice([1, 2, 3])
        rewards = [rng.choice([0.0, 0.5, 1.0, 1.7]) for _ in range(count)]
        dropped = {t for t, r in enumerate(rewards) if r > 0 and rng.random() < 0.3}  # PRS drops correct turns
        spans, position = [], 0
        for turn in range(count):
            position += rng.randint(1, 5) if turn else 0  # the feedback and the chat template's tokens
            spans.append((position, position + rng.randint(1, 6)))
            position = spans[-1][1]
        turns += [JudgedTurn(trajectory, t + 1, r, r > 0, None) for t, r in enumerate(rewards)]
        layout[trajectory] = (rewards, dropped, spans)
    order = list(layout)
    rng.shuffle(order)
    rewards = torch.zeros(len(order), width)
    mask = torch.zeros(len(order), width, dtype=torch.int64)
    for row, trajectory in enumerate(order):
        values, dropped, spans = layout[trajectory]
        for t, (start, end) in enumerate(spans):
            mask[row, start:end] = 0 if t in dropped else 1
            rewards[row, end - 1] = values[t]
    advantages, returns = _estimate(rewards, mask, [f"uid-{trajectory // samples}" for trajectory in order])

    signals = step_signals(turns, samples, "trloo", void_turn=True, prs=False)
    want_adv, want_ret = torch.zeros_like(advantages), torch.zeros_like(returns)
    for turn, signal in zip(turns, signals):
        _, dropped, spans = layout[turn.trajectory]
        if turn.turn - 1 in dropped:
            continue  # out of the loss, yet in its group's baseline through step_signals
        start, end = spans[turn.turn - 1]
        row = order.index(turn.trajectory)
        want_ret[row, start:end] = signal.ret
        want_adv[row, start:end] = 0.0 if signal.dropped else signal.advantage
    assert any(s.dropped == ("void_turn",) for s in signals) and any(d for _, d, _ in layout.values())
    torch.testing.assert_close(advantages, want_adv)
    torch.testing.assert_close(returns, want_ret)


def test_trloo_estimator_refuses_settings_that_hide_the_turns():
    rewards, mask, uids = torch.zeros(2, 4), torch.ones(2, 4, dtype=torch.int64), ["a", "a"]
    with pytest.raises(ValueError, match="use_kl_in_reward"):
        _estimate(rewards, mask, uids, use_kl_in_reward=True)
    with pytest.raises(ValueError, match="bypass mode"):
        _estimate(rewards, mask, uids, rollout_correction=RolloutCorrectionConfig.decoupled_geo_rs())
    with pytest.raises(ValueError, match="gamma"):
        _estimate(rewards, mask, uids, gamma=0.9)
    with pytest.raises(ValueError, match="uid"):
        get_adv_estimator_fn("trloo")(token_level_rewards=rewards, response_mask=mask,
                                      config=AlgoConfig(adv_estimator="trloo"))


@pytest.mark.parametrize("low, high, veto", [(0.999, 1.001, 1e-4), (0.95, 1.01, 1e-3)])
def test_mrs_settings_reject_what_mrs_rejects_on_whole_episodes(low, high, veto):
    settings = plugin.mrs_rollout_correction(low, high, veto)
    RolloutCorrectionConfig(**settings)  # verl accepts them
    gen = torch.Generator().manual_seed(0)
    batch, length = 64, 50
    rollout = -torch.rand(batch, length, generator=gen, dtype=torch.float64) * 3
    # mean log ratios in and out of (asymmetric) bounds
    drift = torch.linspace(2 * np.log(low), 2 * np.log(high), batch, dtype=torch.float64).unsqueeze(1)
    trainer = rollout + drift + torch.randn(batch, length, generator=gen, dtype=torch.float64) * 1e-4
    mask = (torch.rand(batch, length, generator=gen) < 0.9).long()
    # one token far off in a row whose mean log ratio is 0: under the veto (both reject the row), and over 1 / veto
    # (verl's symmetric k2 veto rejects the row, MRS keeps it)
    for row, ratio in ((5, veto / 2), (6, 2 / veto)):
        others = mask[row].bool().clone()
        others[3] = False
        mask[row, 3] = 1
        trainer[row] = rollout[row]
        trainer[row, 3] += np.log(ratio)
        trainer[row, others] -= np.log(ratio) / int(others.sum())
    kept_mask, _ = compute_rollout_rejection_mask(trainer - rollout, mask, settings["rollout_rs"],
                                                  settings["rollout_rs_threshold"])
    verl_kept = (kept_mask == mask).all(dim=-1)
    drkernel_kept = mismatch_keep_mask(trainer, rollout, mask, low, high, veto)
    assert 0 < int(drkernel_kept.sum()) < batch - 2
    assert not verl_kept[5] and not drkernel_kept[5]
    assert not verl_kept[6] and drkernel_kept[6]
    others = [b for b in range(batch) if b != 6]
    assert torch.equal(verl_kept[others], drkernel_kept[others])


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
        self.max_tokens: list[int] = []

    async def generate(self, request_id, *, prompt_ids, sampling_params, **kwargs) -> TokenOutput:
        ids = self.tokenizer(self.answers.pop(0), add_special_tokens=False)["input_ids"] + [self.tokenizer.eos_token_id]
        self.prompts.append(list(prompt_ids))
        self.answered.append(ids)
        self.max_tokens.append(sampling_params["max_tokens"])
        step = len(self.prompts)  # as verl's server client reports the weights' version
        return TokenOutput(token_ids=ids, extra_fields={"min_global_steps": step, "max_global_steps": step})


class ScriptedEvaluator:
    """Hands out the given results in order (for the loop's masking logic, not KernelGym's verdicts)."""

    def __init__(self, results: list[EvalResult]) -> None:
        self.results = list(results)

    async def evaluate(self, task, code):
        return self.results.pop(0)


AGENT_LOOP_ENTRY = OmegaConf.load(REPO / "examples" / "verl" / "agent_loops.yaml")[0]


def _run_episode(tokenizer, server, evaluator, task="2_relu", **settings) -> AgentLoopOutput:
    """One episode, the agent loop built as verl's AgentLoopWorker builds it: hydra's instantiate of the example's
    agent loop file entry (overridden by `settings`), inside the worker's running event loop."""
    trainer = OmegaConf.create({"actor_rollout_ref": {"rollout": {"prompt_length": 4096, "response_length": 8192}},
                                "trainer": {"use_v1": True}})
    entry = OmegaConf.merge(AGENT_LOOP_ENTRY, {"tasks": str(REPO / "examples" / "tasks"),
                                               "engine": {"name": "embedded"}, "evaluator_retries": 0, **settings})

    async def episode():
        loop = hydra.utils.instantiate(entry, trainer_config=DictConfigWrap(trainer), server_manager=server,
                                       tokenizer=tokenizer, processor=None, hf_model_type="qwen2", dataset_cls=None,
                                       data_config=DictConfigWrap(OmegaConf.create({})), tools=None,
                                       evaluator=evaluator)
        return await loop.run({"temperature": 1.0, "logprobs": False}, raw_prompt=[], extra_info={"task": task})

    return asyncio.run(episode())


@pytest.mark.slow
def test_agent_loop_episode_matches_the_judged_answers(tokenizer, tasks):
    from drkernel.scheduling.evaluator import BackendEvaluator
    from drkernel.scheduling.scheduler import Scheduler
    from drkernel.schema import EvalOptions

    evaluator = BackendEvaluator(Scheduler(device="cpu", workers=1, cache_entries=0),
                                 EvalOptions(device="cpu", measure_performance=False, correctness_trials=1,
                                             timeout_s=120))
    try:
        server = ScriptedServer(tokenizer, [CORRECT_ANSWER, NO_CODE_ANSWER])
        out = _run_episode(tokenizer, server, evaluator, turns=2, prs=False)
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
    assert server.max_tokens == [4096, 4096]  # the per-answer budget of agent_loops.yaml
    assert (out.extra_fields["min_global_steps"], out.extra_fields["max_global_steps"]) == (1, 2)
    # verl's v1 trainer stores as_dict(): each turn's reward on its answer's last token
    scores = out.as_dict()["rm_scores"]
    assert scores[e1 - 1] == 0.5 and float(scores.sum()) == 0.5


def _correct(coverage):
    return EvalResult(status="correct", correct=True, profile=Profile(coverage=coverage, meaningful=True))


def test_prs_and_void_turns_leave_the_loss_but_not_the_baseline(tokenizer):
    # turn 1 correct but lazy (coverage 0: PRS always drops it), turn 2 without code after it (void), turn 3 correct
    lazy = _run_episode(tokenizer, ScriptedServer(tokenizer, [CORRECT_ANSWER, NO_CODE_ANSWER, CORRECT_ANSWER]),
                        ScriptedEvaluator([_correct(0.0), _correct(1.0)]))
    plain = _run_episode(tokenizer, ScriptedServer(tokenizer, [NO_CODE_ANSWER, CORRECT_ANSWER, CORRECT_ANSWER]),
                         ScriptedEvaluator([_correct(1.0), _correct(0.5)]))
    assert lazy.extra_fields[plugin.TURN_SCORES] == [0.5, 0.0, 1.0]
    assert lazy.extra_fields[plugin.TURN_PRS_KEPT] == [False, True, True]
    assert plain.extra_fields[plugin.TURN_SCORES] == [0.0, 1.0, 0.75]
    spans = lazy.extra_fields[plugin.TURN_SPANS]
    mask = torch.tensor(lazy.response_mask)
    assert not mask[spans[0][0]:spans[0][1]].any()  # PRS: the lazy turn's answer is out of the loss
    assert mask[spans[1][0]:spans[1][1]].all() and mask[spans[2][0]:spans[2][1]].all()

    # the rows as verl's v1 trainer stores them (AgentLoopWorkerTQ) and reads them back for the advantages
    fields = [{**o.as_dict(), "uid": "prompt-0"} for o in (lazy, plain)]
    batch = list_of_dict_to_tensordict(fields).select("rm_scores", "response_mask", "uid").to_padded_tensor()
    uids = list(batch.pop("uid").tolist())
    advantages, _ = _estimate(batch["rm_scores"], batch["response_mask"], uids)
    # both episodes' returns per turn: the lazy turn is found by its reward and stays in turn 1's baseline
    signals = step_signals([JudgedTurn(b, t + 1, r, r > 0, None) for b, o in enumerate((lazy, plain))
                            for t, r in enumerate(o.extra_fields[plugin.TURN_SCORES])], 2, "trloo")
    assert [s.advantage for s in signals][:3] == [1.5 - 1.75, 1.0 - 1.75, 1.0 - 0.75]
    (_, _), (s2, e2), (s3, e3) = spans
    assert torch.all(advantages[0, s2:e2] == 0)  # void: reward 0 after a rewarded turn
    assert torch.all(advantages[0, s3:e3] == signals[2].advantage)
    (p1, q1), _, _ = plain.extra_fields[plugin.TURN_SPANS]
    assert signals[3].advantage == 1.75 - 1.5  # the dropped turn's return is turn 1's baseline
    assert torch.all(advantages[1, p1:q1] == signals[3].advantage)


def test_agent_loop_judges_on_the_configured_service(tokenizer, tasks, monkeypatch, tmp_path):
    """No evaluator given: the agent loop opens the engine its settings name, once per process (here a `drkernel
    serve` app over a scripted backend, its token from $DRKERNEL_TOKEN)."""
    from tests.test_service_api import TOKEN, ScriptedBackend, serving

    from drkernel.agent.replay import fenced
    from drkernel.service.dispatcher import Dispatcher
    from drkernel.service.store import Store

    monkeypatch.setenv("DRKERNEL_TOKEN", TOKEN)
    monkeypatch.setattr(plugin, "_ENGINES", {})  # as in a fresh worker process
    monkeypatch.setattr(plugin, "_CLOSERS", [])
    backend = ScriptedBackend()  # judges a candidate "verdict <status>" as it asks
    answers = [fenced("verdict correct\nclass ModelNew: pass"), fenced("verdict incorrect\nclass ModelNew: pass")]
    with serving(Dispatcher(Store(tmp_path / "store.db"), backend, backend.device)) as url:
        out = _run_episode(tokenizer, ScriptedServer(tokenizer, answers), None, engine={"name": url}, turns=2,
                           prs=False)
    assert out.extra_fields[plugin.TURN_STATUS] == ["correct", "incorrect"]
    relu = {t.key: t for t in tasks}["2_relu"]
    assert [r.reference for r in backend.submitted] == [relu.code, relu.code]
    assert len(plugin._ENGINES) == len(plugin._CLOSERS) == 1


def test_agent_loop_refuses_bad_settings(tokenizer):
    with pytest.raises(hydra.errors.InstantiationException, match="unknown drkernel agent loop setting"):
        _run_episode(tokenizer, ScriptedServer(tokenizer, []), ScriptedEvaluator([]), turn=3)
    with pytest.raises(ValueError, match="unknown task"):
        _run_episode(tokenizer, ScriptedServer(tokenizer, []), ScriptedEvaluator([]), task="nope")


def test_dataset_rows_name_the_agent_loop_and_the_task(tokenizer, tasks, tmp_path):
    from verl.utils.dataset.rl_dataset import RLHFDataset

    path = write_dataset(tasks, tmp_path / "train.parquet")
    config = OmegaConf.create({"max_prompt_length": 4096, "cache_dir": str(tmp_path / "cache")})
    dataset = RLHFDataset(str(path), tokenizer, config)  # as verl's trainer reads data.train_files
    rows = [dataset[i] for i in range(len(dataset))]
    assert [r["extra_info"]["task"] for r in rows] == [r["reward_model"]["ground_truth"] for r in rows] == [
        t.key for t in tasks]
    assert {r["agent_name"] for r in rows} == {plugin.AGENT_LOOP}
    assert rows[0]["raw_prompt"] == [{"role": "user", "content": first_turn_prompt(tasks[0].code)}]


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
    with hydra.initialize_config_dir(config_dir=str(REPO / "examples" / "verl"), version_base=None):
        config = hydra.compose(config_name="drkernel_trloo")
    actor, rollout = config.actor_rollout_ref.actor, config.actor_rollout_ref.rollout
    assert (config.data.train_batch_size, rollout.n) == (16, 16)
    assert config.data.val_files.endswith("val.parquet") and config.data.train_files.endswith("train.parquet")
    assert (actor.optim.lr, actor.clip_ratio_low, actor.clip_ratio_high) == (1e-6, 0.2, 0.28)
    assert not actor.use_kl_loss and not config.algorithm.use_kl_in_reward and actor.kl_loss_coef == 0
    assert config.algorithm.adv_estimator == plugin.ESTIMATOR and rollout.agent.default_agent_loop == plugin.AGENT_LOOP
    mrs = plugin.mrs_rollout_correction()
    assert {key: config.algorithm.rollout_correction[key] for key in mrs} == mrs
    plugin._check_algorithm(config.algorithm)
    (entry,) = OmegaConf.load(REPO / rollout.agent.agent_loop_config_path)
    assert entry.name == plugin.AGENT_LOOP and entry._target_ == "drkernel.integrations.verl.KernelAgentLoop"


# --- the documented command, as verl runs it --------------------------------------------------------------------

CONFIG = REPO / "examples" / "verl" / "drkernel_trloo.yaml"


def _documented_commands() -> tuple[list[str], list[str]]:
    """The dataset command's arguments and the trainer command's overrides, as the example configuration's header
    documents them (docs/integrations.md shows the same lines)."""
    lines = [line.removeprefix("#").strip() for line in CONFIG.read_text().splitlines() if line.startswith("#")]
    dataset = shlex.split(next(line for line in lines if "drkernel.integrations.verl_dataset" in line))
    trainer = shlex.split(next(line for line in lines if "verl.trainer.main_ppo" in line))
    docs = " ".join((REPO / "docs" / "integrations.md").read_text().replace("\\\n", " ").split())
    assert " ".join(dataset) in docs and " ".join(trainer[trainer.index("--config-name"):]) in docs
    return dataset[dataset.index("drkernel.integrations.verl_dataset") + 1:], trainer[trainer.index("--config-name") + 2:]


@pytest.fixture(scope="module")
def documented(tmp_path_factory, tokenizer):
    """The documented dataset written in a fresh working folder and the documented configuration composed there as
    `main_ppo --config-path ... --config-name drkernel_trloo OVERRIDES` composes it, the model a local tiny policy."""
    work = tmp_path_factory.mktemp("work")
    (work / "examples").symlink_to(REPO / "examples")
    dataset_args, overrides = _documented_commands()
    policy = tokenizer.name_or_path
    overrides = [f"actor_rollout_ref.model.path={policy}" if o.startswith("actor_rollout_ref.model.path=") else o
                 for o in overrides]
    cwd = Path.cwd()
    os.chdir(work)  # the paths in both commands are relative to where they run
    try:
        spec, out = parse_spec(dataset_args)
        build_dataset(spec, out)
        with hydra.initialize_config_dir(config_dir=str(CONFIG.parent), version_base=None):
            config = hydra.compose(config_name=CONFIG.stem, overrides=overrides)
    finally:
        os.chdir(cwd)
    return work, config


@pytest.mark.slow
def test_the_documented_command_passes_verls_validation_and_fills_the_v1_trainers_batches(documented, monkeypatch):
    from verl.trainer.ppo.utils import need_critic, need_reference_policy
    from verl.trainer.ppo.v1 import get_trainer_cls  # imports TransferQueue, as TaskRunnerV1 does
    from verl.utils.config import validate_config

    work, config = documented
    monkeypatch.chdir(work)
    validate_config(config=config, use_reference_policy=need_reference_policy(config), use_critic=need_critic(config))
    assert config.trainer.use_v1
    # the v1 trainer up to its workers: the replay buffer, the tokenizer, the datasets and their loaders
    trainer = get_trainer_cls(config.trainer.v1.trainer_mode)(config=config)
    trainer._init_tokenizer()
    trainer._init_dataloader()
    assert trainer.steps_per_epoch >= 1 and trainer.total_training_steps >= 1
    batch = next(iter(trainer.train_dataloader))
    assert len(batch["agent_name"]) == config.data.train_batch_size
    assert set(batch["agent_name"]) == {plugin.AGENT_LOOP}
    # every task a row names is in the task file the agent loop reads (agent_loops.yaml's `tasks`)
    (entry,) = OmegaConf.load(REPO / config.actor_rollout_ref.rollout.agent.agent_loop_config_path)
    keys = set(plugin._shared_tasks(str(work / entry.tasks)))
    rows = [trainer.train_dataset[i] for i in range(len(trainer.train_dataset))]
    rows += [trainer.val_dataset[i] for i in range(len(trainer.val_dataset))]
    assert {r["extra_info"]["task"] for r in rows} <= keys


def test_mrs_reaches_verls_actor_loss(documented):
    """The composed actor config selects verl's bypass-mode loss with MRS's settings: an episode whose trainer/rollout
    ratio leaves the bounds gets no gradient, one inside them does (with verl's default `vanilla` loss, as the
    configuration had it before, both do)."""
    from verl.trainer.ppo.core_algos import get_policy_loss_fn
    from verl.utils.config import omega_conf_to_dataclass

    _, config = documented
    actor = omega_conf_to_dataclass(config.actor_rollout_ref.actor)
    assert actor.policy_loss.loss_mode == "bypass_mode"
    assert actor.policy_loss.rollout_correction["rollout_rs"] == plugin.mrs_rollout_correction()["rollout_rs"]
    plugin.check_rejection_in_loss(config)
    gen = torch.Generator().manual_seed(0)
    rollout = -torch.rand(2, 12, generator=gen, dtype=torch.float64) * 2
    current = rollout.clone()
    current[1] += 0.01  # a geometric-mean ratio of 1.01, outside [0.999, 1.001]
    advantages, mask = torch.ones_like(rollout), torch.ones_like(rollout, dtype=torch.bool)
    grads = {}
    for mode in ("bypass_mode", "vanilla"):
        actor.global_batch_info.update(dp_size=1, batch_num_tokens=int(mask.sum()), global_batch_size=2,
                                       loss_scale_factor=actor.loss_scale_factor)
        log_prob = current.clone().requires_grad_()
        loss, _ = get_policy_loss_fn(mode)(old_log_prob=rollout, log_prob=log_prob, advantages=advantages,
                                           response_mask=mask, loss_agg_mode=actor.loss_agg_mode, config=actor,
                                           rollout_is_weights=None)
        loss.backward()
        grads[mode] = log_prob.grad.abs().sum(dim=1)
    assert grads["bypass_mode"][0] > 0 and grads["bypass_mode"][1] == 0
    assert (grads["vanilla"] > 0).all()


def test_the_agent_loop_refuses_rejection_the_loss_would_not_apply(tokenizer):
    with hydra.initialize_config_dir(config_dir=str(CONFIG.parent), version_base=None):
        config = hydra.compose(config_name=CONFIG.stem, overrides=["actor_rollout_ref.actor.policy_loss.loss_mode=vanilla"])
    with pytest.raises(ValueError, match="policy_loss.loss_mode=bypass_mode"):
        plugin.check_rejection_in_loss(config)


def test_verl_finds_the_plugin_through_its_entry_point(tmp_path):
    """verl's own discovery (`verl.plugins` entry points, read when `verl` is imported) registers the agent loop and
    the estimator, with nothing but drkernel's declared entry point installed: no VERL_USE_EXTERNAL_MODULES."""
    declared = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["entry-points"]["verl.plugins"]
    info = tmp_path / "drkernel_entry-0.0.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: drkernel-entry\nVersion: 0.0.0\n")
    (info / "entry_points.txt").write_text("[verl.plugins]\n" + "".join(f"{k} = {v}\n" for k, v in declared.items()))
    probe = ("import sys, verl\n"
             "from verl.experimental.agent_loop.agent_loop import _agent_loop_registry\n"
             "from verl.trainer.ppo.core_algos import get_adv_estimator_fn\n"
             "print('drkernel_kernel' in _agent_loop_registry, get_adv_estimator_fn('trloo').__module__)\n")
    env = {k: v for k, v in os.environ.items() if k != "VERL_USE_EXTERNAL_MODULES"}
    env["PYTHONPATH"] = os.pathsep.join([str(REPO), str(tmp_path)])
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, env=env, timeout=300)
    assert done.stdout.split() == ["True", "drkernel.integrations.verl"], done.stderr[-2000:]


def test_the_dataset_builder_refuses_a_set_smaller_than_a_batch(tmp_path):
    with pytest.raises(ValueError, match="do not fill one batch of 16"):
        build_dataset(DatasetSpec(task_sources=(str(REPO / "examples" / "tasks"),)), tmp_path)
    with pytest.raises(ValueError, match="none of its 5 tasks is of level 1"):
        DatasetSpec(task_sources=(str(REPO / "examples" / "tasks"),), levels=(1,)).train_tasks()
    with pytest.raises(ValueError, match="no tasks"):
        DatasetSpec()
