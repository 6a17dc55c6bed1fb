"""drkernel as a verl plugin (`pip install drkernel[verl]`, verl 0.9.1): the kernel episode as an agent loop, TRLOO
as an advantage estimator, PRS as a loss mask, the void-turn rule as a zero advantage, MRS as verl's rollout
correction.

Importing this module registers, in verl's own registries:

- the agent loop `drkernel_kernel` (`KernelAgentLoop`): one sample is one multi-turn episode on one task. Each turn
  asks verl's rollout server for an answer, judges it with `drkernel.agent.loop.judge_answer` (what `drkernel bench`
  and `drkernel train` judge with) on the embedded scheduler, Ray or a `drkernel serve` service, and shows the model
  drkernel's feedback;
- the advantage estimator `trloo` (`compute_trloo_advantage`): the returns, TRLOO advantages and void turns of
  `drkernel train` (`drkernel.train.signals`) over (prompt uid, turn) groups.

verl hands an advantage estimator only `token_level_rewards`, `response_mask`, the config and the prompt's uid, so
an episode reaches the estimator through those two tensors. One row is one episode; its response is answer 1, the
chat template's tokens and feedback 1, answer 2, ... in one token sequence (which is why the context is always the
full one: verl's token builder only appends), and:

- `response_mask` is 1 on the answers' tokens and 0 on the environment's; a turn PRS leaves out has 0 on its answer
  too (a loss mask: verl's losses and rejection sampling read this mask);
- `rm_scores` (verl's `token_level_rewards` when the reward has no KL term) holds each turn's reward on the last
  token of its answer (`KernelEpisodeOutput.as_dict`, which verl's v1 trainer stores), so a row sums to the
  episode's return.

The estimator reads the turns back: each run of mask-1 tokens is a turn, and so is each reward on a mask-0 token (a
turn PRS left out: PRS drops only correct turns, and a correct turn earns at least `RewardConfig.base` > 0). A
void turn (reward <= 0 after an earlier rewarded turn) earns 0, so masking it would hide it from its group's
baseline; the estimator gives its tokens advantage 0 instead, which under the clipped PPO loss without entropy or KL
terms gives them no gradient, as leaving them out does. Left-out and void turns still count in their group's
baseline, as in `drkernel train`.

MRS maps onto verl's `bypass_ppo_clip_geo_rs` preset plus a `seq_max_k2` veto (`mrs_rollout_correction`), which
the v1 trainer applies only in the actor's `bypass_mode` loss (`actor.policy_loss`; the agent loop refuses a config
that leaves it out: `check_rejection_in_loss`), tested on whole episodes; `drkernel train` tests each turn on its own tokens, which verl cannot express. Decoupled rejection
sampling masks rows before the advantages, which would hide their turns, and an in-reward KL puts a value on every
token: the estimator refuses both.
"""

from __future__ import annotations

import asyncio
import atexit
import json
import math
import random
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, fields
from typing import Any
from uuid import uuid4

import numpy as np
import torch
from verl.experimental.agent_loop.agent_loop import AgentLoopBase, AgentLoopMetrics, AgentLoopOutput, register
from verl.trainer.ppo.core_algos import register_adv_est

from drkernel.agent.context import ContextPolicy, ShownTurn, build_messages
from drkernel.scheduling.evaluator import Evaluator, open_evaluator
from drkernel.agent.loop import JudgedAnswer, judge_answer
from drkernel.agent.prompts import PromptTemplates, first_turn_prompt
from drkernel.integrations.verl_dataset import AGENT_LOOP
from drkernel.rl import RewardConfig, measured_coverage, prs_keep_mask
from drkernel.scheduling.engine import EngineConfig
from drkernel.schema import EvalOptions
from drkernel.tasks import Task, load_tasks
from drkernel.train.rollout import RetryingEvaluator
from drkernel.train.signals import JudgedTurn, advantages, turn_returns, void_turns

ESTIMATOR = "trloo"

# extra_fields of an episode's AgentLoopOutput (verl keeps them per row)
TURN_SCORES = "turn_scores"  # verl's own key for per-turn rewards
TURN_SPANS = "turn_spans"  # [start, end) of each answer in response_ids
TURN_STATUS = "turn_status"
TURN_PRS_KEPT = "turn_prs_kept"


@dataclass(frozen=True)
class KernelEpisodeConfig:
    """The episode's settings: the agent loop's keyword arguments, which verl's `agent_loop_config_path` file gives.
    Defaults are `drkernel train`'s (the paper's recipe: 3 turns, the profiling reward, PRS); the evaluation settings
    are `drkernel bench`'s, with their names."""

    tasks: str = "examples/tasks"  # anything `drkernel.tasks.load_tasks` reads; samples name a task by key
    turns: int = 3
    max_new_tokens: int = 4096  # per answer, within what is left of verl's response_length
    prompt_templates: str | None = None  # a TOML/JSON file of PromptTemplates overrides
    profiling_reward: bool = True
    speedup_cap: float = 3.0
    prs: bool = True
    prs_low: float = 0.3
    prs_high: float = 0.4
    # How answers are judged, nested as `drkernel bench` and `drkernel train` nest them: the engine (`name`:
    # embedded, ray:ADDRESS or a `drkernel serve` URL; workers, result_cache, token_env) and the evaluation options.
    engine: EngineConfig = EngineConfig()
    evaluation: EvalOptions = field(default_factory=EvalOptions)
    evaluator_retries: int = 3  # then the episode fails, and verl drops its prompt's group
    evaluator_backoff_s: float = 2.0

    def __post_init__(self) -> None:
        if self.turns < 1 or self.max_new_tokens < 1:
            raise ValueError(f"turns and max_new_tokens must be positive, not {self.turns}, {self.max_new_tokens}")
        if not 0 <= self.prs_low < self.prs_high:
            raise ValueError(f"need 0 <= prs_low < prs_high, not {self.prs_low}, {self.prs_high}")
        if self.evaluator_retries < 0 or self.evaluator_backoff_s < 0:
            raise ValueError("evaluator_retries and evaluator_backoff_s must not be negative")
        self.reward_config()

    @classmethod
    def from_settings(cls, settings: Mapping[str, Any]) -> KernelEpisodeConfig:
        known = {f.name for f in fields(cls)}
        if unknown := sorted(set(settings) - known):
            raise ValueError(f"unknown drkernel agent loop setting(s) {', '.join(unknown)}; "
                             f"known: {', '.join(sorted(known))}")
        values = dict(settings)
        values["engine"] = EngineConfig.from_dict(dict(settings.get("engine") or {}))
        values["evaluation"] = EvalOptions.from_dict(dict(settings.get("evaluation") or {}))
        return cls(**values)

    def engine_key(self) -> tuple[EngineConfig, str]:
        """Episodes that agree on it share one engine in a worker process."""
        return self.engine, json.dumps(self.evaluation.to_dict(), sort_keys=True)

    def reward_config(self) -> RewardConfig:
        return RewardConfig(profiling_reward=self.profiling_reward, speedup_cap=self.speedup_cap)

    def templates(self) -> PromptTemplates:
        return PromptTemplates.from_file(self.prompt_templates) if self.prompt_templates else PromptTemplates()


# verl builds an agent loop per sample: each worker process opens the engine and reads the task set once per config.
_ENGINES: dict[tuple[EngineConfig, str], Evaluator] = {}
_CLOSERS: list[Callable[[], Any]] = []
_TASK_SETS: dict[str, dict[str, Task]] = {}


def _shared_evaluator(config: KernelEpisodeConfig) -> Evaluator:
    key = config.engine_key()
    if key not in _ENGINES:
        _ENGINES[key], close = open_evaluator(config.engine, config.evaluation)
        _CLOSERS.append(close)
    return _ENGINES[key]


@atexit.register
def _close_engines() -> None:
    """At the worker's exit, stop the scheduler's or Ray's workers (a service client's sockets close with the
    process: its async close would need the event loop that has already stopped)."""
    for close in _CLOSERS:
        closed = close()
        if asyncio.iscoroutine(closed):
            closed.close()


def _shared_tasks(source: str) -> dict[str, Task]:
    if source not in _TASK_SETS:
        _TASK_SETS[source] = {task.key: task for task in load_tasks(source)}
    return _TASK_SETS[source]


def mask_runs(mask: torch.Tensor) -> list[tuple[int, int]]:
    """[start, end) of each run of nonzero entries of a 1-D mask, in order: an episode's answers."""
    on = mask.bool()
    before = torch.cat([on.new_zeros(1), on[:-1]])
    after = torch.cat([on[1:], on.new_zeros(1)])
    starts = torch.nonzero(on & ~before).flatten().tolist()
    ends = (torch.nonzero(on & ~after).flatten() + 1).tolist()
    return list(zip(starts, ends))


def turn_reward_tensor(length: int, spans: Sequence[Sequence[int]], rewards: Sequence[float]) -> torch.Tensor:
    """[length] float32: each turn's reward on the last token of its answer, 0 elsewhere (the row's rm_scores)."""
    if len(spans) != len(rewards):
        raise ValueError(f"{len(spans)} answer spans for {len(rewards)} rewards")
    scores = torch.zeros(length, dtype=torch.float32)
    for (start, end), value in zip(spans, rewards):
        if not 0 <= start < end <= length:
            raise ValueError(f"answer span [{start}, {end}) does not lie in a response of {length} tokens")
        scores[end - 1] = value
    return scores


class KernelEpisodeOutput(AgentLoopOutput):
    """An episode's output whose `rm_scores` carry every turn's reward, not only the episode's total at the end."""

    def as_dict(self) -> dict[str, Any]:
        output = super().as_dict()
        output["rm_scores"] = turn_reward_tensor(len(self.response_ids), self.extra_fields[TURN_SPANS],
                                                 self.extra_fields[TURN_SCORES])
        return output


@dataclass
class _Episode:
    prompt_ids: list[int]
    runtime_ids: list[int]  # prompt and response so far, as the rollout server sees them
    messages: list[dict[str, str]]
    mask: list[int] = field(default_factory=list)
    logprobs: list[float] | None = None
    answers: list[str] = field(default_factory=list)
    judged: list[JudgedAnswer] = field(default_factory=list)
    server_fields: list[dict[str, Any]] = field(default_factory=list)  # each turn's TokenOutput.extra_fields
    generation_s: float = 0.0
    evaluation_s: float = 0.0
    preempted: int = -1


@register(AGENT_LOOP)
class KernelAgentLoop(AgentLoopBase):
    """The multi-turn kernel episode. verl passes the dataset row's fields to `run`; the row names its task in
    `extra_info["task"]` (`drkernel.integrations.verl_dataset` writes such rows), and the episode's first prompt is drkernel's."""

    def __init__(
        self,
        trainer_config: Any,
        server_manager: Any,
        tokenizer: Any,
        processor: Any,
        dataset_cls: Any,
        data_config: Any,
        hf_model_type: str | None = None,
        *,
        name: str = AGENT_LOOP,  # verl's instantiate passes the config file's entry, name included
        tools: Any = None,  # and the configured tools, which a kernel episode does not call
        evaluator: Evaluator | None = None,  # replaces the configured engine (tests, notebooks)
        **settings: Any,
    ) -> None:
        super().__init__(trainer_config, server_manager, tokenizer, processor, dataset_cls, data_config, hf_model_type)
        if not self.config.get("trainer", {}).get("use_v1", True):
            raise ValueError("the drkernel agent loop needs verl's v1 trainer (trainer.use_v1=true): the legacy "
                             "trainer keeps only an episode's total reward, and the trloo estimator needs each turn's")
        check_rejection_in_loss(self.config)
        self.episode = KernelEpisodeConfig.from_settings(settings)
        self.tasks = _shared_tasks(self.episode.tasks)
        self.evaluator = RetryingEvaluator(evaluator or _shared_evaluator(self.episode), self.episode.evaluator_retries,
                                           self.episode.evaluator_backoff_s)
        self.reward = self.episode.reward_config()
        self.templates = self.episode.templates()
        self.response_length = self.rollout_config.response_length

    def _task(self, extra_info: Any) -> Task:
        key = (extra_info or {}).get("task")
        if key is None:
            raise ValueError("the sample names no task: the drkernel agent loop needs extra_info['task'] (a task key)")
        if key not in self.tasks:
            raise ValueError(f"unknown task {key!r}; the agent loop has {len(self.tasks)} "
                             f"(e.g. {next(iter(self.tasks))})")
        return self.tasks[key]

    async def run(self, sampling_params: dict[str, Any], priority: int = 0, **kwargs: Any) -> KernelEpisodeOutput:
        task = self._task(kwargs.get("extra_info"))
        first = first_turn_prompt(task.code, self.templates)
        messages = [{"role": "user", "content": first}]
        prompt_ids = await self.ct_build_initial_tokens(messages)
        episode = _Episode(prompt_ids=list(prompt_ids), runtime_ids=list(prompt_ids), messages=messages,
                           logprobs=[] if sampling_params.get("logprobs") else None)
        request_id = uuid4().hex  # one id per episode: its turns go to one server, which reuses the prefix cache
        for turn in range(1, self.episode.turns + 1):
            budget = min(self.episode.max_new_tokens, self.response_length - len(episode.mask))
            if budget < 1:
                break
            await self._answer(task, episode, {**sampling_params, "max_tokens": budget}, request_id, int(priority))
            if turn == self.episode.turns or not await self._show_feedback(first, episode):
                break
        return self._output(task, episode)

    async def _answer(self, task: Task, episode: _Episode, sampling_params: dict[str, Any], request_id: str,
                      priority: int) -> None:
        started = time.perf_counter()
        generated = await self.server_manager.generate(request_id=request_id, prompt_ids=episode.runtime_ids,
                                                       sampling_params=sampling_params, priority=priority)
        episode.generation_s += time.perf_counter() - started
        if not generated.token_ids:
            raise ValueError(f"the rollout server returned no tokens for task {task.key}")
        if generated.num_preempted is not None:
            episode.preempted = max(episode.preempted, 0) + generated.num_preempted
        episode.server_fields.append(generated.extra_fields)
        merged, episode.mask, logprobs = await self.ct_merge_assistant_token(
            episode.runtime_ids, generated.token_ids, episode.mask, episode.logprobs,
            assistant_logprobs=generated.log_probs if episode.logprobs is not None else None)
        if episode.logprobs is not None:
            episode.logprobs = logprobs
        episode.runtime_ids = merged.token_ids
        text = self.tokenizer.decode(generated.token_ids, skip_special_tokens=True)
        started = time.perf_counter()
        episode.judged.append(await judge_answer(task, text, self.evaluator, self.reward, self.templates))
        episode.evaluation_s += time.perf_counter() - started
        episode.answers.append(text)
        episode.messages = episode.messages + [{"role": "assistant", "content": text}]

    async def _show_feedback(self, first_prompt: str, episode: _Episode) -> bool:
        """Append the next turn's context (drkernel's feedback, every earlier turn shown); False when it would not
        fit in verl's response length, which ends the episode."""
        shown = [ShownTurn(text, j.feedback, j.reward) for text, j in zip(episode.answers, episode.judged)]
        messages, _ = build_messages(first_prompt, shown, ContextPolicy("full"))
        merged, mask, logprobs = await self.ct_merge_context_msg(
            episode.messages, messages, episode.runtime_ids, episode.mask, episode.logprobs)
        if len(mask) >= self.response_length:
            return False
        episode.runtime_ids, episode.mask, episode.messages = merged.token_ids, mask, messages
        if episode.logprobs is not None:
            episode.logprobs = logprobs
        return True

    def _prs_kept(self, judged: list[JudgedAnswer]) -> list[bool]:
        if not self.episode.prs:
            return [True] * len(judged)
        coverage = [float("nan") if j.result is None or (c := measured_coverage(j.result.profile)) is None else c
                    for j in judged]
        correct = [j.result is not None and j.result.correct for j in judged]
        return prs_keep_mask(coverage, correct, random.SystemRandom().getrandbits(63), self.episode.prs_low,
                             self.episode.prs_high).tolist()

    def _output(self, task: Task, episode: _Episode) -> KernelEpisodeOutput:
        spans = mask_runs(torch.tensor(episode.mask))  # the builder may trim a boundary token: read the mask back
        if len(spans) != len(episode.judged):
            raise RuntimeError(f"{len(episode.judged)} answers but {len(spans)} runs of model tokens in the response")
        kept = self._prs_kept(episode.judged)
        mask = list(episode.mask)
        for (start, end), keep in zip(spans, kept):
            if not keep:  # PRS drops correct turns only, whose reward (> 0) the estimator still finds
                mask[start:end] = [0] * (end - start)
        rewards = [j.reward for j in episode.judged]
        steps = {"min_global_steps": episode.server_fields[0].get("min_global_steps"),
                 "max_global_steps": episode.server_fields[-1].get("max_global_steps")} if episode.server_fields else {}
        return KernelEpisodeOutput(
            prompt_ids=episode.prompt_ids,
            response_ids=episode.runtime_ids[len(episode.prompt_ids):],
            response_mask=mask,
            response_logprobs=episode.logprobs,
            reward_score=float(sum(rewards)),
            num_turns=2 * len(rewards),  # the task, each answer, and the feedback between answers
            metrics=AgentLoopMetrics(generate_sequences=episode.generation_s, tool_calls=episode.evaluation_s,
                                     num_preempted=episode.preempted),
            extra_fields={
                **steps,  # the weights' versions the episode was sampled with (verl's staleness control reads them)
                "task": task.key,
                TURN_SCORES: rewards,
                TURN_SPANS: [list(span) for span in spans],
                TURN_STATUS: [j.status for j in episode.judged],
                TURN_PRS_KEPT: kept,
            },
        )


@dataclass(frozen=True)
class RowTurn:
    """One turn of an episode row, as the estimator reads it back from the tensors."""

    start: int
    end: int
    reward: float
    in_loss: bool  # False: PRS left it out (its answer is masked)


def episode_turns(rewards: torch.Tensor, mask: torch.Tensor) -> list[RowTurn]:
    """The turns of one row ([L] token rewards, [L] 0/1 mask), in order: every run of mask 1 (a turn in the loss,
    its reward the sum over the run) and every reward on a mask-0 token (a turn PRS left out)."""
    cumulative = torch.cat([rewards.new_zeros(1, dtype=torch.float64), rewards.double().cumsum(0)]).tolist()
    turns = [RowTurn(s, e, cumulative[e] - cumulative[s], True) for s, e in mask_runs(mask)]
    values = rewards.double().tolist()
    left_out = torch.nonzero(~mask.bool() & (rewards != 0)).flatten().tolist()
    turns += [RowTurn(p, p + 1, values[p], False) for p in left_out]
    return sorted(turns, key=lambda t: t.start)


def _check_algorithm(config: Any) -> None:
    """Refuse the settings under which the rows no longer carry their turns, or the returns are not drkernel's."""
    if config is None:
        return
    if config.get("use_kl_in_reward", False):
        raise ValueError("the trloo estimator reads each turn's reward from token_level_rewards, which an in-reward "
                         "KL penalty changes on every token; set algorithm.use_kl_in_reward=false (the paper uses "
                         "no KL)")
    correction = config.get("rollout_correction", None)
    if correction is not None and correction.get("rollout_rs", None) and not correction.get("bypass_mode", False):
        raise ValueError("decoupled rejection sampling masks rejected rows before the advantages, which hides their "
                         "turns from the trloo estimator (and from their groups' baselines); use bypass mode "
                         "(drkernel.integrations.verl.mrs_rollout_correction())")
    if float(config.get("gamma", 1.0)) != 1.0:
        raise ValueError("the trloo estimator uses drkernel's undiscounted reward-to-go: set algorithm.gamma=1.0")


@register_adv_est(ESTIMATOR)
def compute_trloo_advantage(
    token_level_rewards: torch.Tensor,
    response_mask: torch.Tensor,
    index: np.ndarray | None = None,
    config: Any = None,
    **kwargs: Any,
) -> tuple[torch.Tensor, torch.Tensor]:
    """`drkernel train`'s signal on verl's rows: reward-to-go returns per turn, TRLOO advantages over (prompt uid,
    turn) groups, advantage 0 for void turns (see the module's doc), broadcast to each turn's answer tokens.
    Returns (advantages, returns), [B, L] each, 0 off the loss mask."""
    _check_algorithm(config)
    if index is None:
        raise ValueError("the trloo estimator needs the prompt uid of each row (verl passes non_tensor_batch['uid'])")
    if token_level_rewards.shape != response_mask.shape or token_level_rewards.ndim != 2:
        raise ValueError(f"token_level_rewards and response_mask must share one [B, L] shape, not "
                         f"{tuple(token_level_rewards.shape)}, {tuple(response_mask.shape)}")
    if len(index) != token_level_rewards.shape[0]:
        raise ValueError(f"{len(index)} uids for {token_level_rewards.shape[0]} rows")
    rows = [episode_turns(token_level_rewards[b], response_mask[b]) for b in range(len(index))]
    # the void-turn rule reads only the trajectory, the turn and the reward of a JudgedTurn
    turns = [JudgedTurn(b, n + 1, t.reward, t.reward > 0, None)
             for b, row in enumerate(rows) for n, t in enumerate(row)]
    returns = turn_returns(turns)
    adv = advantages(returns, [index[t.trajectory] for t in turns], [t.turn for t in turns], ESTIMATOR)
    void = void_turns(turns)
    token_advantages = torch.zeros_like(token_level_rewards, dtype=torch.float64)
    token_returns = torch.zeros_like(token_level_rewards, dtype=torch.float64)
    for n, turn in enumerate(turns):
        row = rows[turn.trajectory][turn.turn - 1]
        if row.in_loss:
            token_returns[turn.trajectory, row.start:row.end] = returns[n]
            token_advantages[turn.trajectory, row.start:row.end] = 0.0 if void[n] else adv[n]
    mask = response_mask.to(torch.float64)
    dtype = token_level_rewards.dtype
    return (token_advantages * mask).to(dtype), (token_returns * mask).to(dtype)


def check_rejection_in_loss(config: Any) -> None:
    """Refuse bypass-mode rejection sampling that the actor's loss would never apply: verl's v1 trainer only swaps in
    the rollout's log-probs, and the rejection runs in the `bypass_mode` policy loss, which reads its settings from
    `actor.policy_loss.rollout_correction` (verl's legacy trainer set both; the v1 trainer sets neither)."""
    correction = (config.get("algorithm") or {}).get("rollout_correction") or {}
    if not correction.get("bypass_mode") or not (correction.get("rollout_rs") or correction.get("rollout_is")):
        return
    loss = ((config.get("actor_rollout_ref") or {}).get("actor") or {}).get("policy_loss") or {}
    in_loss = loss.get("rollout_correction") or {}
    if loss.get("loss_mode") != "bypass_mode" or any(in_loss.get(k) != correction.get(k)
                                                      for k in ("rollout_rs", "rollout_rs_threshold", "rollout_is")):
        raise ValueError("algorithm.rollout_correction asks for rejection in bypass mode, but verl's v1 trainer "
                         "applies it only in the actor's loss: set actor_rollout_ref.actor.policy_loss.loss_mode="
                         "bypass_mode and actor_rollout_ref.actor.policy_loss.rollout_correction="
                         "${algorithm.rollout_correction} (examples/verl/drkernel_trloo.yaml does)")


def mrs_rollout_correction(low: float = 0.999, high: float = 1.001, veto: float = 1e-4) -> dict[str, Any]:
    """`algorithm.rollout_correction` for MRS (`drkernel.rl.mismatch_keep_mask`) on whole episodes: verl's
    `bypass_ppo_clip_geo_rs` preset with bounds that keep exactly a geometric-mean trainer/rollout ratio in
    [low, high] (verl bounds the rollout/trainer mean, hence the reciprocals), plus `seq_max_k2`, which rejects an
    episode with a token whose |log ratio| exceeds |log veto|: MRS's veto of ratios below `veto`, and also of ratios
    above 1 / veto, which MRS keeps."""
    if not 0 < low <= high or not 0 < veto < 1:
        raise ValueError(f"need 0 < low <= high and 0 < veto < 1, not low={low}, high={high}, veto={veto}")
    return {
        "rollout_is": None,
        "rollout_rs": "seq_mean_k1,seq_max_k2",
        "rollout_rs_threshold": f"{1 / high!r}_{1 / low!r},{0.5 * math.log(veto) ** 2!r}",
        "bypass_mode": True,
        "loss_type": "ppo_clip",
    }
