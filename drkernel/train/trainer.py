"""`DrKernelTrainer`: TRL's GRPOTrainer with multi-turn KernelGym rollouts and the paper's per-turn signal.

TRL gives one scalar advantage per completion. Here a completion is a whole trajectory (answers, with the feedback
between them masked out by env_mask), and `_generate_and_score_completions` replaces TRL's advantages with a (B, T)
tensor in which each turn's tokens carry that turn's advantage (TRLOO by default, on reward-to-go, over the group
gathered from every process). The void-turn rule, PRS and MRS leave turns out through the loss mask (`tool_mask`,
which only the loss reads), so the attention still sees every token.
"""

from __future__ import annotations

import contextlib
import json
import math
import shutil
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import torch

from drkernel.agent.config import BenchConfig
from drkernel.agent.local_models import static_cache_settings
from drkernel.agent.prompts import PromptTemplates, first_turn_prompt
from drkernel.rl.kinds import AnswerKind, answer_kind, failure_reasons
from drkernel.rl.metrics import fast_p_per_turn
from drkernel.schema import Status
from drkernel.tasks.loaders import require
from drkernel.tasks.task import Task
from drkernel.train.config import TrainConfig
from drkernel.train.lora import lora_config, merged_weights
from drkernel.train.rollout import GenerateFn, MultiTurnRollout, RolloutStats, Trajectory, turn_coverage
from drkernel.train.selection import VALIDATED_POLICY
from drkernel.train.signals import JudgedTurn, kept_fraction, mrs_turn_keep, step_signals
from drkernel.train.validation import TrainerChatModel, Validation

trl = require("trl", "train", "Training")
transformers = require("transformers", "train", "Training")
accelerate_utils = require("accelerate.utils", "train", "Training")

METRICS = "metrics.jsonl"
FEEDBACK_TOKENS = 1024  # what the environment adds between two answers, at most, in the static cache's sizing


def _templates(config: TrainConfig) -> PromptTemplates:
    return PromptTemplates.from_file(config.prompt_templates) if config.prompt_templates else PromptTemplates()


def task_dataset(tasks: Sequence[Task], templates: PromptTemplates) -> Any:
    """One row per task: the first turn's chat, as TRL's conversational `prompt` column."""
    datasets = require("datasets", "train", "Training")
    return datasets.Dataset.from_list(
        [{"prompt": [{"role": "user", "content": first_turn_prompt(t.code, templates)}]} for t in tasks]
    )


class DrKernelTrainer(trl.GRPOTrainer):
    """GRPOTrainer whose rollouts are the agent's multi-turn loop, judged by KernelGym.

    `generate` replaces the sampling function (tests script the model's answers with it; the rewards still come
    from real evaluations of the code in them).
    """

    def __init__(
        self,
        model: Any,
        config: TrainConfig,
        tasks: Sequence[Task],
        evaluator: Any,
        processing_class: Any,
        generate: GenerateFn | None = None,
        validation_tasks: Sequence[Task] = (),
        validation_bench: BenchConfig | None = None,
    ) -> None:
        self.config = config
        self.templates = _templates(config)
        self._task_of = {first_turn_prompt(t.code, self.templates): t for t in tasks}
        super().__init__(
            model=model,
            reward_funcs=[turn_reward_sum],
            args=config.grpo_config(),
            train_dataset=task_dataset(tasks, self.templates),
            processing_class=processing_class,
            rollout_func=self._rollout,
            peft_config=lora_config(config.lora_rank, config.lora_alpha),
        )
        self.rollout = MultiTurnRollout(
            tokenizer=processing_class,
            evaluator=evaluator,
            generate=generate or self.sample,
            turns=config.turns,
            reward_config=config.reward_config(),
            templates=self.templates,
            context=config.context_policy(),
            evaluator_retries=config.evaluator_retries,
            evaluator_backoff_s=config.evaluator_backoff_s,
        )
        # validation answers with the trainer's own model even when rollouts use vLLM: it runs on the main process
        # alone, and vLLM's server mode gathers from every process
        self.validation = Validation(
            list(validation_tasks), validation_bench, config.reward_config(), evaluator,
            TrainerChatModel(processing_class, generate or self.sample_transformers, fill=config.static_cache,
                             max_batch=min(validation_bench.concurrency,
                                           len(validation_tasks) * validation_bench.samples)),
            self.rollout.loop, Path(config.output_dir),
        ) if validation_tasks and validation_bench is not None else None
        self._trajectories: list[Trajectory] = []
        self._step_metrics: dict[str, Any] = {}
        self._scored_at = 0.0
        self._cache_len = 0  # the static cache's length so far (config.static_cache)
        self._copy: Any = None  # the rollout copy (config.rollout_dtype) and the step its weights are from
        self._copy_step: int | None = None
        self.add_callback(StepRecorder(self))
        self.add_callback(NonFiniteUpdateGuard(self))

    def sample(self, contexts: list[list[int]]) -> tuple[list[list[int]], list[list[float]] | None]:
        """One turn's answers for a batch of token contexts: vLLM through TRL when configured (TRL has synced the
        weights before the rollout), else transformers."""
        if not self.use_vllm:
            return self.sample_transformers(contexts)
        _, completion_ids, logprobs, _ = self.vllm_generation.generate(prompts=contexts, images=None, num_generations=1)
        return completion_ids, [[token[0] for token in row] for row in logprobs]  # the sampled token's log-prob

    def sample_transformers(self, contexts: list[list[int]]) -> tuple[list[list[int]], list[list[float]] | None]:
        """Sampling with transformers' `generate` (`_sampling_model`), left-padded, one batch per turn. With MRS on
        it also gives each sampled token's log-probability under logits / temperature, as the trainer computes it."""
        tokenizer, c = self.processing_class, self.config
        with_logprobs = c.mrs_on
        pad = tokenizer.pad_token_id
        width = max(len(ids) for ids in contexts)
        cache = static_cache_settings(self._static_cache_len(width)) if c.static_cache else {}
        device = self.accelerator.device
        ids = torch.tensor([[pad] * (width - len(x)) + x for x in contexts], device=device)
        attention = torch.tensor([[0] * (width - len(x)) + [1] * len(x) for x in contexts], device=device)
        with self._sampling_model() as model, torch.no_grad():
            out = model.generate(
                input_ids=ids, attention_mask=attention, max_new_tokens=c.max_new_tokens, do_sample=True,
                temperature=c.temperature, top_p=c.top_p, top_k=0, pad_token_id=pad,
                eos_token_id=tokenizer.eos_token_id, return_dict_in_generate=True, output_logits=with_logprobs,
                **cache,
            )
        new = out.sequences[:, width:]
        if not with_logprobs:
            return new.tolist(), None
        logits = torch.stack(out.logits, dim=1).float() / c.temperature
        return new.tolist(), logits.log_softmax(-1).gather(-1, new.unsqueeze(-1)).squeeze(-1).tolist()

    @contextlib.contextmanager
    def _sampling_model(self) -> Iterator[Any]:
        """What samples: the rollout copy (config.rollout_dtype), which computes in its own dtype (under autocast, a
        float32 copy's static cache fails: its keys are float32 after the rotary embedding, its values bfloat16),
        else the trainer's own model, unwrapped by TRL's context (which also lifts gradient checkpointing so the KV
        cache works)."""
        if self.config.rollout_dtype is not None:
            yield self._rollout_copy()
            return
        with trl.models.unwrap_model_for_generation(
            self.model_wrapped,
            self.accelerator,
            gather_deepspeed3_params=self.args.ds3_gather_for_generation,
            gradient_checkpointing_kwargs=self.args.gradient_checkpointing_kwargs,
        ) as model:
            yield model

    def _rollout_copy(self) -> Any:
        """A plain model of the policy's architecture in rollout_dtype, built at the first call, holding the trainer's
        weights (LoRA merged) as of this optimizer step: synced once per step, in place, so the decoding step that
        transformers compiled and captured keeps reading the same buffers."""
        policy = self.accelerator.unwrap_model(self.model)
        if self._copy is None:
            config = (policy.get_base_model() if hasattr(policy, "get_base_model") else policy).config
            plain = transformers.AutoModelForCausalLM.from_config(config)
            plain.generation_config = policy.generation_config
            self._copy = plain.to(device=self.accelerator.device, dtype=getattr(torch, self.config.rollout_dtype))
            self._copy.eval().requires_grad_(False)
        if self._copy_step != self.state.global_step:
            with torch.no_grad():
                self._copy.load_state_dict(merged_weights(policy))
            self._copy_step = self.state.global_step
        return self._copy

    def _static_cache_len(self, width: int) -> int:
        """The static cache's length: at the first turn, room for every turn's answer and the feedback between
        them, so that transformers compiles its decoding step once for the run; a context that outgrows it sizes
        it again (and recompiles)."""
        c = self.config
        if width + c.max_new_tokens > self._cache_len:
            self._cache_len = width + c.turns * c.max_new_tokens + (c.turns - 1) * FEEDBACK_TOKENS
        return self._cache_len

    # --- rollouts -------------------------------------------------------------------------------------------

    def _rollout(self, prompts: list[list[dict[str, str]]], trainer: Any) -> dict[str, Any]:
        """TRL's rollout_func: the prompts of this process (each repeated num_generations times in a row)."""
        base = self.accelerator.process_index * len(prompts)
        trajectories = []
        for prompt in prompts:
            first = prompt[0]["content"]
            if first not in self._task_of:
                raise KeyError("a prompt that matches no training task reached the rollout")
            trajectories.append(self.rollout.start(self._task_of[first], first))
        self.rollout.run(trajectories, [(base + i) % self.num_generations for i in range(len(prompts))])
        self._trajectories = trajectories
        with_logprobs = all(t.logprobs is not None for t in trajectories)
        return {
            "prompt_ids": [t.prompt_ids for t in trajectories],
            "completion_ids": [t.completion_ids for t in trajectories],
            "logprobs": [t.logprobs for t in trajectories] if with_logprobs else None,
            "env_mask": [t.env_mask for t in trajectories],
            "trajectory_reward": [sum(r.reward for r in t.records) for t in trajectories],
        }

    def _generate_and_score_completions(self, inputs: list[dict[str, Any]]) -> dict[str, Any]:
        self.rollout.stats = RolloutStats()
        output = super()._generate_and_score_completions(inputs)
        if self.model.training:
            self._apply_turn_signals(output)
        self._scored_at = time.perf_counter()
        return output

    def _apply_turn_signals(self, output: dict[str, Any]) -> None:
        trajectories = self._trajectories
        base = self.accelerator.process_index * len(trajectories)
        mrs_local = self._mrs_verdicts(output) if self.config.mrs_on else None
        rows, n = [], 0
        for i, traj in enumerate(trajectories):
            for record in traj.records:
                rows.append({
                    "trajectory": base + i, "turn": record.turn, "reward": record.reward, "correct": record.correct,
                    "coverage": turn_coverage(record), "speedup": record.speedup, "status": record.status,
                    "kind": answer_kind(record.result).value, "reasons": failure_reasons(record.result),
                    "mrs": None if mrs_local is None else mrs_local[n], "task": record.task, "code": record.code,
                })
                n += 1
        rows = accelerate_utils.gather_object(rows)
        turns = [JudgedTurn(r["trajectory"], r["turn"], r["reward"], r["correct"], r["coverage"]) for r in rows]
        signals = step_signals(
            turns,
            self.num_generations,
            estimator=self.config.advantage_estimator,
            void_turn=self.config.void_turn,
            prs=self.config.prs,
            prs_seed=self.prs_seed(self.state.global_step),
            prs_low=self.config.prs_low,
            prs_high=self.config.prs_high,
            mrs_keep=[r["mrs"] for r in rows] if mrs_local is not None else None,
        )
        completion_ids = output["completion_ids"]
        advantages = torch.zeros(completion_ids.shape, dtype=torch.float32, device=completion_ids.device)
        tool_mask = output["tool_mask"].clone()
        by_key = {(r["trajectory"], r["turn"]): s for r, s in zip(rows, signals)}
        for i, traj in enumerate(trajectories):
            for (start, end), record in zip(traj.spans, traj.records):
                signal = by_key[(base + i, record.turn)]
                advantages[i, start:end] = signal.advantage
                if not signal.kept:
                    tool_mask[i, start:end] = 0
        output["advantages"] = advantages
        output["tool_mask"] = tool_mask
        loss_mask = output["completion_mask"] * tool_mask
        output["num_items_in_batch"] = self.accelerator.gather(loss_mask.sum()).sum()
        step = self.state.global_step + 1
        self._step_metrics = self._metrics_of(step, rows, signals, output)
        if self.config.log_samples and self.accelerator.is_main_process:
            with open(self.config.log_samples, "a") as f:
                for r, s in zip(rows, signals):
                    f.write(json.dumps({
                        "step": step, "prompt_id": s.prompt_id, "sample": s.sample, "turn": s.turn, "task": r["task"],
                        "reward": s.reward, "return": s.ret, "advantage": s.advantage, "correct": r["correct"],
                        "coverage": r["coverage"], "kept": s.kept, "why_not": s.why_not, "status": r["status"],
                        "speedup": r["speedup"], "kind": r["kind"], "reasons": r["reasons"], "code": r["code"],
                    }) + "\n")

    def validate(self, step: int) -> dict[str, Any]:
        """Validation of the model at `step`, in eval mode (no dropout), as drkernel bench would run it."""
        assert self.validation is not None, "validation_every needs validation_tasks (TrainConfig checks it)"
        was_training = self.model.training
        self.model.eval()
        try:
            return self.validation.run(step)
        finally:
            self.model.train(was_training)

    def prs_seed(self, global_step: int) -> int:
        """PRS's draws are seeded by the run's seed and the step, so a rerun drops the same turns."""
        return self.config.seed * 1_000_003 + global_step

    def _mrs_verdicts(self, output: dict[str, Any]) -> list[bool]:
        """MRS per turn, in the order of the records: the trainer's log-probs against the rollout engine's."""
        rollout_logp = output.get("sampling_per_token_logps")
        if rollout_logp is None:
            raise RuntimeError("MRS needs the rollout engine's log-probs, and this rollout gave none")
        trainer_logp = output.get("old_per_token_logps")
        if trainer_logp is None:
            with torch.no_grad():
                trainer_logp, _, _ = self._get_per_token_logps_and_entropies(
                    self.model,
                    torch.cat([output["prompt_ids"], output["completion_ids"]], dim=1),
                    torch.cat([output["prompt_mask"], output["completion_mask"]], dim=1),
                    output["completion_ids"].size(1),
                    batch_size=self.args.per_device_train_batch_size,
                )
        rows, masks = [], []
        width = output["completion_ids"].size(1)
        for i, traj in enumerate(self._trajectories):
            for start, end in traj.spans:
                mask = torch.zeros(width, dtype=torch.bool, device=trainer_logp.device)
                mask[start:end] = True
                rows.append(i)
                masks.append(mask)
        if not rows:
            return []
        c = self.config
        return mrs_turn_keep(trainer_logp, rollout_logp, rows, torch.stack(masks), c.mrs_low, c.mrs_high, c.mrs_veto)

    def _metrics_of(self, step: int, rows: list[dict[str, Any]], signals: list,
                    output: dict[str, Any]) -> dict[str, Any]:
        width = self.config.turns
        trajectories = sorted({r["trajectory"] for r in rows})
        index = {t: n for n, t in enumerate(trajectories)}
        speedups = [[math.nan] * width for _ in trajectories]
        correct = [[False] * width for _ in trajectories]
        reached = [[False] * width for _ in trajectories]
        for r in rows:
            i, t = index[r["trajectory"]], r["turn"] - 1
            reached[i][t] = True
            correct[i][t] = r["correct"]
            speedups[i][t] = math.nan if r["speedup"] is None else float(r["speedup"])
        rewards = torch.tensor([r["reward"] for r in rows], dtype=torch.float64)
        coverage = [r["coverage"] for r in rows if r["coverage"] is not None]
        kind_shares = _kind_shares(rows)
        # per turn, and the mean advantage the loss gave each kind: what the step pushed towards, beside what it saw
        turn_kind_shares = [_kind_shares([r for r in rows if r["turn"] == turn]) for turn in range(1, width + 1)]
        kept = [(r["kind"], s.advantage) for r, s in zip(rows, signals) if s.kept]
        advantage_by_kind = {k.value: _mean([a for kind, a in kept if kind == k]) for k in AnswerKind}
        reached_turns = torch.tensor(reached).sum(0).clamp(min=1)
        tokens = self.accelerator.gather(
            (output["prompt_mask"].sum() + output["completion_mask"].sum()).reshape(1)
        ).sum()
        stats = self.rollout.stats
        return {
            "step": step,
            "tasks": sorted({r["task"] for r in rows}),  # the step's prompts: most of the noise between runs' steps
            "reward_mean": rewards.mean().item() if len(rows) else 0.0,
            "reward_std": rewards.std().item() if len(rows) > 1 else 0.0,
            "turn_correct": (torch.tensor(correct).sum(0) / reached_turns).tolist(),
            "turn_fast_1": _finite(fast_p_per_turn(speedups, correct, 1.0, reached).tolist()),
            "turn_fast_1_2": _finite(fast_p_per_turn(speedups, correct, 1.2, reached).tolist()),
            "hacked_share": sum(r["status"] == Status.HACKED for r in rows) / max(len(rows), 1),
            "lazy_share": kind_shares[AnswerKind.LAZY.value],
            "kind_shares": kind_shares,
            "turn_kind_shares": turn_kind_shares,
            "advantage_by_kind": advantage_by_kind,
            "coverage_mean": _mean(coverage),
            "kept_mrs": kept_fraction(signals, "mrs"),
            "kept_prs": kept_fraction(signals, "prs"),
            "kept_void_turn": kept_fraction(signals, "void_turn"),
            "tokens": int(tokens.item()),
            "evaluations": stats.evaluations,
            "evaluation_crashes": stats.crashed,
            "evaluations_cached": stats.cached,
            "time_generation_s": stats.generation_s,
            "time_evaluation_s": stats.evaluation_s,
        }


def _kind_shares(rows: list[dict[str, Any]]) -> dict[str, float]:
    return {k.value: sum(r["kind"] == k for r in rows) / max(len(rows), 1) for k in AnswerKind}


def _mean(values: list[float]) -> float | None:
    return sum(values) / len(values) if values else None


def _finite(values: list[float]) -> list[float | None]:
    return [None if math.isnan(v) else v for v in values]


def turn_reward_sum(completions: list[Any], trajectory_reward: list[float], **_: Any) -> list[float]:
    """The sum of a trajectory's turn rewards, for TRL's reward logging; the advantages come from the turns."""
    return [float(r) for r in trajectory_reward]


class NonFiniteUpdateGuard(transformers.TrainerCallback):
    """A step whose gradient is not finite updates nothing: clipped by a NaN norm, it would turn every trainable
    weight into NaN, and every later step and checkpoint with it (seen on the H100: a LoRA run whose grad_norm was
    NaN at step 4 of 30 failed in the CUDA sampler at step 5). The step is recorded as skipped (`update_skipped`
    in metrics.jsonl), and a run resumed from weights that are already not finite is refused."""

    def __init__(self, trainer: DrKernelTrainer) -> None:
        self.trainer = trainer

    def on_train_begin(self, args: Any, state: Any, control: Any, model: Any = None, **kwargs: Any) -> None:
        broken = [name for name, p in model.named_parameters() if p.requires_grad and not torch.isfinite(p).all()]
        if broken:
            raise RuntimeError(f"{len(broken)} trainable tensors hold NaN or inf before training (e.g. {broken[0]}): "
                               "a checkpoint written after a non-finite update (resume from an earlier one or start "
                               "the run again) or a model whose weights are broken")

    def on_pre_optimizer_step(self, args: Any, state: Any, control: Any, model: Any = None, optimizer: Any = None,
                              **kwargs: Any) -> None:
        """Before AdamW's step, after clipping: with any gradient not finite, none is applied (AdamW passes over a
        parameter without a gradient, its moments unchanged); the learning-rate schedule goes on."""
        grads = [p.grad for group in optimizer.param_groups for p in group["params"] if p.grad is not None]
        finite = bool(torch.stack([torch.isfinite(g).all() for g in grads]).all()) if grads else True
        self.trainer._step_metrics["update_skipped"] = not finite
        if finite:
            return
        for group in optimizer.param_groups:
            for p in group["params"]:
                p.grad = None
        print(f"[train] step {state.global_step + 1}: the gradient is not finite; this step updates nothing",
              flush=True)


class StepRecorder(transformers.TrainerCallback):
    """Writes RUN_DIR/metrics.jsonl (one line per optimizer step) and runs validation every N steps, saving the
    policy it validated beside its records (validation/step_N/policy: the candidates of model selection,
    drkernel.train.selection)."""

    def __init__(self, trainer: DrKernelTrainer) -> None:
        self.trainer = trainer
        self.path = Path(trainer.config.output_dir) / METRICS
        self._entropies: list[float] = []  # TRL's per-micro-batch entropy list of the current logging window
        self._entropies_taken = 0  # how many of them earlier steps already recorded

    def on_train_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        """A resumed run redoes the steps after its checkpoint: drop their lines so each step appears once."""
        if not self.trainer.accelerator.is_main_process:
            return
        for path in (self.path, self.trainer.config.log_samples):
            if path and Path(path).exists():
                lines = Path(path).read_text().splitlines()
                kept = [line for line in lines if line.strip() and json.loads(line)["step"] <= state.global_step]
                Path(path).write_text("".join(line + "\n" for line in kept))

    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        metrics = dict(self.trainer._step_metrics)
        metrics["step"] = state.global_step
        metrics["time_update_s"] = time.perf_counter() - self.trainer._scored_at
        metrics["policy_entropy"] = self._step_entropy()
        if not self.trainer.accelerator.is_main_process:
            return
        every = self.trainer.config.validation_every
        if every and state.global_step % every == 0:  # on the main process only: one run directory per step
            step_dir = Path(self.trainer.config.output_dir) / "validation" / f"step_{state.global_step}"
            shutil.rmtree(step_dir, ignore_errors=True)  # a run stopped after validating redoes the step: anew
            metrics["validation"] = self.trainer.validate(state.global_step)
            self.trainer.save_model(str(step_dir / VALIDATED_POLICY))
        self.path.parent.mkdir(parents=True, exist_ok=True)
        with self.path.open("a") as f:
            f.write(json.dumps(metrics) + "\n")

    def _step_entropy(self) -> float | None:
        """The mean token entropy of the policy over this step's trained answer tokens (TRL's `entropy`, one value a
        micro-batch, gathered over processes), from the values TRL added since the previous step; a collapse onto
        one answer shows as entropy falling towards 0. TRL clears its list when it logs, after this callback."""
        current = self.trainer._metrics["train"].get("entropy", [])
        if current is not self._entropies:
            self._entropies, self._entropies_taken = current, 0
        new = [value for value in current[self._entropies_taken:] if math.isfinite(value)]
        self._entropies_taken = len(current)
        return sum(new) / len(new) if new else None
