"""The training configuration: one dataclass, read from YAML with `--set key=value` overrides.

It holds what the recipe needs (tasks, turns, estimator, rejection rules, evaluator, the paper's optimiser settings)
and turns into TRL's `GRPOConfig`; the defaults are the paper's (see docs/training.md) except where a laptop needs
smaller numbers, which the example configs set.
"""

from __future__ import annotations

import dataclasses
import types
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from drkernel.agent.context import ContextPolicy
from drkernel.errors import UsageError
from drkernel.rl import RewardConfig
from drkernel.scheduling.engine import EngineConfig
from drkernel.schema import EvalOptions
from drkernel.settings import flatten, nest
from drkernel.tasks.loaders import require
from drkernel.train.signals import ESTIMATORS

TINY_MODEL = "tiny"  # `model: tiny` builds a random tiny policy (drkernel.train.policy) in the run directory


class ConfigError(UsageError):
    """A configuration that cannot train: an unknown key, a bad value, a combination that would train wrongly."""


@dataclass
class TrainConfig:
    """Every knob of `drkernel train`. Batch: each optimizer step trains on
    per_device_train_batch_size x processes x gradient_accumulation_steps trajectories, num_generations per prompt."""

    # what to train and on what
    model: str = TINY_MODEL  # a local path or a Hugging Face id, or "tiny"
    tasks: str = "examples/tasks"  # anything `drkernel.tasks.loaders.load_tasks` reads
    validation_tasks: str | None = None  # held-out tasks; None: no validation
    output_dir: str = "runs/train"
    # rollouts
    turns: int = 3
    num_generations: int = 16
    max_new_tokens: int = 4096  # per turn
    temperature: float = 1.0
    top_p: float = 1.0
    context: str = "full"
    prompt_templates: str | None = None  # a TOML/JSON file of PromptTemplates overrides
    use_vllm: bool = False  # sample the rollouts with vLLM through TRL (weights synced every step)
    vllm_mode: str = "colocate"  # or "server" (`trl vllm-serve` at vllm_server_base_url)
    vllm_server_base_url: str | None = None
    vllm_gpu_memory_utilization: float = 0.3
    # transformers sampling (no vLLM): a static KV cache, sized at a trajectory's first turn for all its turns, which
    # transformers compiles on a GPU with CUDA graphs: a small policy's decoding step is bound by kernel launches
    static_cache: bool = False
    # transformers sampling from a plain copy of the policy in this dtype, its weights (LoRA merged) synced before each
    # step's rollout, as a vLLM engine's are; None samples with the trainer's model itself. transformers compiles the
    # copy whole: on the H100 a LoRA policy decoded at 34.5 ms a step, a bfloat16 copy at 6.5 (docs/miniature.md)
    rollout_dtype: str | None = None
    # evaluation (KernelGym): how each answer is judged (EvalOptions) and by which engine (embedded, Ray, a service)
    evaluation: EvalOptions = field(default_factory=EvalOptions)
    engine: EngineConfig = field(default_factory=EngineConfig)
    evaluator_retries: int = 3
    evaluator_backoff_s: float = 2.0
    # reward and advantages
    profiling_reward: bool = True  # PR
    speedup_cap: float = 3.0
    advantage_estimator: str = "trloo"
    # rejection, each counted in metrics.jsonl
    void_turn: bool = True
    prs: bool = True
    prs_low: float = 0.3
    prs_high: float = 0.4
    # MRS guards against a rollout engine that is not the trainer: None turns it on exactly with vLLM or a rollout
    # copy (rollout_dtype); on with the trainer's own sampling, it tests generate's log-probs against its forward
    mrs: bool | None = None
    mrs_low: float = 0.999
    mrs_high: float = 1.001
    mrs_veto: float = 1e-4
    # optimisation (the paper's)
    learning_rate: float = 1e-6
    epsilon: float = 0.2
    epsilon_high: float = 0.28
    beta: float = 0.0
    loss_type: str = "dr_grpo"
    max_steps: int = 100
    per_device_train_batch_size: int = 16
    gradient_accumulation_steps: int = 16
    warmup_steps: int = 0
    weight_decay: float = 0.0
    max_grad_norm: float = 1.0
    bf16: bool = False
    # the weights' dtype while training: "auto" keeps the checkpoint's; "float32" keeps master weights in full
    # precision under bf16 autocast, which a small model needs (bf16 weights round its small updates away)
    model_dtype: str = "auto"
    gradient_checkpointing: bool = False
    lora_rank: int = 0  # > 0: train a LoRA adapter (drkernel.train.lora); checkpoints and final/ hold the adapter alone
    lora_alpha: int = 0  # 0: twice the rank
    use_cpu: bool = False
    seed: int = 0
    # bookkeeping
    save_steps: int = 50
    save_total_limit: int | None = 3
    logging_steps: int = 1
    report_to: list[str] = field(default_factory=lambda: ["none"])
    validation_every: int = 0  # steps; 0: never
    validation_samples: int = 1
    log_samples: str | None = None  # a JSONL file with one line per (step, prompt, sample, turn), the code included

    def __post_init__(self) -> None:
        problems = []
        if self.turns < 1:
            problems.append(f"turns must be at least 1, not {self.turns}")
        if self.num_generations < 2:
            problems.append(f"num_generations must be at least 2 (a group needs a baseline), not {self.num_generations}")
        if self.advantage_estimator not in ESTIMATORS:
            problems.append(f"advantage_estimator must be one of {', '.join(ESTIMATORS)}, not {self.advantage_estimator!r}")
        try:
            policy = ContextPolicy.parse(self.context)
        except ValueError as exc:
            problems.append(f"context: {exc}")
        else:
            if policy.kind != "full" and (policy.k or 0) < self.turns - 1:
                problems.append(
                    f"context {self.context!r} hides earlier turns within the {self.turns} trained turns, so a turn's "
                    "prompt would not extend the previous turn's and the turns could not be trained as one sequence; "
                    f"use 'full' (or K >= {self.turns - 1})"
                )
        if self.model_dtype not in ("auto", "float32", "bfloat16"):
            problems.append(f"model_dtype must be auto, float32 or bfloat16, not {self.model_dtype!r}")
        if self.rollout_dtype not in (None, "float32", "bfloat16", "float16"):
            problems.append(f"rollout_dtype must be float32, bfloat16 or float16 (or unset), not {self.rollout_dtype!r}")
        elif self.rollout_dtype and self.use_vllm:
            problems.append("rollout_dtype sets up a transformers copy for sampling, and use_vllm samples with vLLM: "
                            "choose one")
        if self.vllm_mode not in ("colocate", "server"):
            problems.append(f"vllm_mode must be colocate or server, not {self.vllm_mode!r}")
        if not 0 <= self.prs_low < self.prs_high:
            problems.append(f"need 0 <= prs_low < prs_high, not {self.prs_low}, {self.prs_high}")
        if self.validation_every < 0 or (self.validation_every and not self.validation_tasks):
            problems.append("validation_every needs validation_tasks (and must not be negative)")
        if self.max_new_tokens < 1 or self.max_steps < 1:
            problems.append("max_new_tokens and max_steps must be positive")
        try:
            self.reward_config()
        except ValueError as exc:
            problems.append(str(exc))
        if problems:
            raise ConfigError("; ".join(problems))

    @property
    def mrs_on(self) -> bool:
        return (self.use_vllm or self.rollout_dtype is not None) if self.mrs is None else self.mrs

    def context_policy(self) -> ContextPolicy:
        return ContextPolicy.parse(self.context)

    def reward_config(self) -> RewardConfig:
        return RewardConfig(profiling_reward=self.profiling_reward, speedup_cap=self.speedup_cap)

    def grpo_config(self) -> Any:
        """TRL's GRPOConfig for this run: one generation batch per optimizer step, checkpoints in output_dir."""
        trl = require("trl", "train", "Training")
        try:
            return self._grpo_config(trl)
        except ValueError as exc:  # TRL's own checks, e.g. a batch that does not hold whole groups
            raise ConfigError(str(exc)) from exc

    def _grpo_config(self, trl: Any) -> Any:
        return trl.GRPOConfig(
            output_dir=self.output_dir,
            num_generations=self.num_generations,
            max_completion_length=self.max_new_tokens,  # per turn: vLLM's max_tokens; dr_grpo's constant divisor
            temperature=self.temperature,
            top_p=self.top_p,
            learning_rate=self.learning_rate,
            epsilon=self.epsilon,
            epsilon_high=self.epsilon_high,
            beta=self.beta,
            loss_type=self.loss_type,
            max_steps=self.max_steps,
            per_device_train_batch_size=self.per_device_train_batch_size,
            gradient_accumulation_steps=self.gradient_accumulation_steps,
            steps_per_generation=self.gradient_accumulation_steps,
            num_iterations=1,
            warmup_steps=self.warmup_steps,
            weight_decay=self.weight_decay,
            max_grad_norm=self.max_grad_norm,
            bf16=self.bf16,
            gradient_checkpointing=self.gradient_checkpointing,
            use_cpu=self.use_cpu,
            seed=self.seed,
            save_strategy="steps",
            save_steps=self.save_steps,
            save_total_limit=self.save_total_limit,
            logging_steps=self.logging_steps,
            report_to=self.report_to,
            use_vllm=self.use_vllm,
            vllm_mode=self.vllm_mode,
            vllm_server_base_url=self.vllm_server_base_url,
            vllm_gpu_memory_utilization=self.vllm_gpu_memory_utilization,
            vllm_importance_sampling_correction=False,  # MRS rejects instead of reweighting
            scale_rewards="none",
            mask_truncated_completions=False,
            log_completions=False,
        )


def _coerce(name: str, hint: Any, value: Any) -> Any:
    """A YAML or `--set` value checked against the field's type. A string for a field that takes strings stays a
    string ("hub:" is a task source, not a mapping), except null; other strings are read as YAML scalars."""
    yaml = require("yaml", "train", "Reading a training config")
    options = typing.get_args(hint) if typing.get_origin(hint) in (typing.Union, types.UnionType) else (hint,)
    if isinstance(value, str):
        if str in options:
            return None if value in ("", "null", "~") and type(None) in options else value
        value = yaml.safe_load(value) if value.strip() else None
    if value is None and type(None) in options:
        return None
    for option in options:
        origin = typing.get_origin(option) or option
        if origin is list and isinstance(value, list):
            return [str(v) for v in value]
        if origin is list and isinstance(value, str):
            return [value]
        if origin is bool and isinstance(value, bool):
            return value
        if origin is int and isinstance(value, int) and not isinstance(value, bool):
            return value
        if origin is float and isinstance(value, (int, float)) and not isinstance(value, bool):
            return float(value)
        if origin is float and isinstance(value, str):  # YAML 1.1 reads 1e-6 (no dot) as a string
            try:
                return float(value)
            except ValueError:
                pass
        if origin is str and isinstance(value, (str, int, float)) and not isinstance(value, bool):
            return str(value)
    raise ConfigError(f"{name}: {value!r} is not a {hint}")


# keys of the config before the evaluation options and the engine nested: still read, where they live now
FLAT_TRAIN_KEYS = {
    "evaluator": "engine.name", "eval_token_env": "engine.token_env", "eval_workers": "engine.workers",
    "eval_cache_entries": "engine.result_cache", "eval_device": "evaluation.device",
    "eval_timeout_s": "evaluation.timeout_s",
    **{key: f"evaluation.{key}" for key in ("correctness_trials", "perf_trials", "measure_performance", "precision")},
}
NESTED = {"evaluation": EvalOptions, "engine": EngineConfig}


def load_config(path: str | Path | None = None, overrides: list[str] | tuple[str, ...] = ()) -> TrainConfig:
    """The config of a YAML file (or the defaults) with `key=value` overrides applied (`evaluation.device=cpu` for a
    nested setting); unknown keys are an error listing the known ones."""
    yaml = require("yaml", "train", "Reading a training config")
    data: dict[str, Any] = {}
    if path is not None:
        try:
            loaded = yaml.safe_load(Path(path).read_text())
        except (OSError, yaml.YAMLError) as exc:
            raise ConfigError(f"cannot read the training config {path}: {exc}") from exc
        if loaded is not None and not isinstance(loaded, dict):
            raise ConfigError(f"{path}: expected a mapping of config keys, not {type(loaded).__name__}")
        try:
            data.update(flatten(loaded or {}, FLAT_TRAIN_KEYS))
        except UsageError as exc:  # a setting under both its names
            raise ConfigError(f"{path}: {exc}") from exc
    for item in overrides:
        key, sep, value = item.partition("=")
        if not sep:
            raise ConfigError(f"--set expects key=value, not {item!r}")
        data[FLAT_TRAIN_KEYS.get(key.strip(), key.strip())] = value  # over the file's, whatever its spelling
    try:
        nested = nest(data)
    except UsageError as exc:  # a group of settings given a value
        raise ConfigError(str(exc)) from exc
    groups = {name: _nested_config(name, cls, nested.pop(name, {})) for name, cls in NESTED.items()}
    try:
        return TrainConfig(**_settings(TrainConfig, nested), **groups)
    except TypeError as exc:
        raise ConfigError(str(exc)) from exc


def _nested_config(name: str, cls: type, data: Any) -> Any:
    settings = _settings(cls, data, f"{name}.")
    try:
        return cls(**settings)
    except UsageError as exc:  # the nested config's own checks
        raise ConfigError(f"{name}: {exc}") from exc


def _settings(cls: type, data: Any, prefix: str = "") -> dict[str, Any]:
    """`data`'s values for the fields of `cls`, each checked against its type; an unknown key is a ConfigError."""
    if not isinstance(data, dict):
        raise ConfigError(f"{prefix.rstrip('.')} is a group of settings ({prefix}KEY=VALUE), not {data!r}")
    hints = typing.get_type_hints(cls)
    known = [f.name for f in dataclasses.fields(cls) if f.name not in (NESTED if cls is TrainConfig else ())]
    unknown = sorted(set(data) - set(known))
    if unknown:
        names = known + ([f"{name}.*" for name in NESTED] if cls is TrainConfig else [])
        raise ConfigError(f"unknown config key(s) {', '.join(prefix + key for key in unknown)}; known keys: "
                          f"{', '.join(prefix + name for name in names)}")
    return {key: _coerce(prefix + key, hints[key], value) for key, value in data.items()}
