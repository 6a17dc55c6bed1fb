"""A `drkernel bench` run's settings, `BenchConfig`: what `drkernel bench` takes on its command line (each field's
metadata is its help there, drkernel.cli.options) and saves as RUN_DIR/config.json.

Light to import (the command line reads it to build its options): the loop and the model backends load when a run
starts.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from drkernel.agent.context import ContextPolicy
from drkernel.errors import UsageError
from drkernel.scheduling.engine import EngineConfig, legacy_engine_name
from drkernel.schema import EvalOptions
from drkernel.settings import flatten, nest

if TYPE_CHECKING:
    from drkernel.agent.loop import LoopConfig

HF_PREFIX = "hf:"


@dataclass
class BenchConfig:
    """A bench run's settings. Each field's metadata gives its command-line help (drkernel.cli.options); the
    evaluation options and the engine nest, as in TrainConfig."""

    tasks: str = field(metadata={"help": "A folder of tasks, a .jsonl/.parquet, or hub:."})
    model: str = field(metadata={"help": "The served model's name, or hf:PATH (local)."})
    base_url: str | None = field(default=None, metadata={"help": "OpenAI-compatible endpoint, e.g. .../v1"})
    api_key_env: str = field(default="OPENAI_API_KEY", metadata={
        "help": "Variable holding the API key; unset sends no key."})
    levels: list[int] | None = field(default=None, metadata={
        "flag": "--level", "help": "Only tasks of these levels: 1,2 or 1-3."})
    problems: list[int] | None = field(default=None, metadata={"help": "Only these problem ids: 1,2,19 or 1-5."})
    names: list[str] | None = field(default=None, metadata={
        "flag": "--name", "help": "Only tasks with these names (globs)."})
    samples: int = field(default=1, metadata={"help": "Trajectories per task.", "min": 1})
    turns: int = field(default=1, metadata={"help": "Turns per trajectory.", "min": 1})
    context: str = field(default="full", metadata={
        "help": "Earlier turns each prompt shows: full, last:K, topk:K or window:K."})
    temperature: float = field(default=1.0, metadata={"help": "Sampling temperature.", "min": 0.0})
    top_p: float = field(default=0.95, metadata={
        "help": "Nucleus sampling: the probability mass kept.", "min": 0.0, "max": 1.0})
    max_tokens: int = field(default=8192, metadata={"help": "Most tokens per model answer.", "min": 1})
    stop: list[str] = field(default_factory=list, metadata={"help": "Stop sequence (repeatable)."})
    static_cache: bool = field(default=False, metadata={
        "help": "hf: models: generate over a static KV cache, which transformers compiles on a GPU (each batch "
                "filled to the largest batch size, so few shapes are compiled)."})
    seed: int | None = field(default=None, metadata={
        "help": "Each request asks with a seed made of this one, its task, sample and turn: reruns repeat.", "default_text": "none sent"})
    prompts: str | None = field(default=None, metadata={"help": "TOML/JSON file overriding prompt templates."})
    profiling_reward: bool = field(default=False, metadata={"help": "Reward coverage too (PR)."})
    concurrency: int = field(default=32, metadata={
        "help": "Trajectories in flight; an hf: model generates for all of them in one batch.", "min": 1})
    request_timeout_s: float = field(default=600.0, metadata={
        "flag": "--request-timeout", "help": "Seconds per model request.", "min": 0.1})
    retries: int = field(default=5, metadata={
        "help": "Retries of a failed request (429, 5xx, connection, timeout).", "min": 0})
    evaluation: EvalOptions = field(default_factory=EvalOptions)
    engine: EngineConfig = field(default_factory=EngineConfig)

    def __post_init__(self) -> None:
        ContextPolicy.parse(self.context)  # fail early on a bad policy
        if not self.model.startswith(HF_PREFIX) and not self.base_url:
            raise UsageError(f"--base-url is needed for the served model {self.model!r} (or use --model hf:PATH)")
        if min(self.samples, self.turns, self.concurrency) < 1:
            raise UsageError("samples, turns and concurrency must be at least 1")

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> BenchConfig:
        """From settings or a run's config.json, this version's or an older one, whose evaluation and engine
        settings were flat; keys this version does not know are left out."""
        nested = nest(flat_settings(data))
        known = {f.name for f in dataclasses.fields(cls)} - {"evaluation", "engine"}
        return cls(**{key: value for key, value in nested.items() if key in known},
                   evaluation=EvalOptions.from_dict(nested.get("evaluation")),
                   engine=EngineConfig.from_dict(nested.get("engine")))

    def loop_config(self) -> LoopConfig:
        from drkernel.agent.backends import SamplingParams
        from drkernel.agent.loop import LoopConfig
        from drkernel.agent.prompts import PromptTemplates
        from drkernel.rl import RewardConfig

        return LoopConfig(
            samples=self.samples, turns=self.turns, context=ContextPolicy.parse(self.context),
            sampling=SamplingParams(self.temperature, self.top_p, self.max_tokens, list(self.stop), self.seed),
            concurrency=self.concurrency, reward=RewardConfig(profiling_reward=self.profiling_reward),
            templates=PromptTemplates.from_file(self.prompts) if self.prompts else PromptTemplates(),
        )


# config.json's keys before the evaluation options and the engine nested (its `ray` and `service` name the engine)
FLAT_BENCH_KEYS = {
    **{key: f"evaluation.{key}" for key in ("device", "timeout_s", "correctness_trials", "perf_trials",
                                            "measure_performance", "precision")},
    "workers": "engine.workers", "result_cache": "engine.result_cache", "service_token_env": "engine.token_env",
}


def flat_settings(data: dict[str, Any]) -> dict[str, Any]:
    """Settings as dotted keys ("evaluation.precision"), an older config.json's flat keys where they live now."""
    flat = flatten(data, FLAT_BENCH_KEYS)
    engine = legacy_engine_name(flat.pop("ray", None), flat.pop("service", None))
    if engine is not None:
        flat.setdefault("engine.name", engine)
    return flat


FIXED_ON_RESUME = ("tasks", "model", "levels", "problems", "names", "samples", "context", "temperature", "top_p",
                   "max_tokens", "stop", "seed", "prompts", "profiling_reward", "evaluation.precision")
