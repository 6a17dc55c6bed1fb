"""One training run from a TrainConfig: tasks, policy, evaluator, trainer, checkpoints; what `drkernel train` calls."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import os
from pathlib import Path
from typing import Any

from drkernel.agent.config import HF_PREFIX, BenchConfig
from drkernel.scheduling.evaluator import open_evaluator
from drkernel.agent.local_models import load_causal_lm, load_tokenizer
from drkernel.agent.prompts import first_turn_prompt
from drkernel.tasks.loaders import load_tasks
from drkernel.tasks.task import Task
from drkernel.train.checkpoints import TRAINER_STATE, checkpoint_step, cut_checkpoints, last_checkpoint
from drkernel.train.config import TINY_MODEL, ConfigError, TrainConfig
from drkernel.train.policy import PolicyShape, build_policy
from drkernel.train.run_record import write_run_record
from drkernel.train.rollout import GenerateFn

TINY_POLICY_DIR = "tiny_policy"


def load_policy(config: TrainConfig, tasks: list[Task]) -> tuple[Any, Any]:
    """(model, tokenizer) from a saved folder, a GGUF or a hub id; `model: tiny` builds a random tiny policy in the
    run directory once and reuses it."""
    path = config.model
    if path == TINY_MODEL:
        out = Path(config.output_dir) / TINY_POLICY_DIR
        if not (out / "config.json").exists():
            build_policy(out, [t.code for t in tasks] + [first_turn_prompt(t.code) for t in tasks], PolicyShape())
        path = str(out)
    try:
        tokenizer = load_tokenizer(path)
        model = load_causal_lm(path, dtype=config.model_dtype)
    except (OSError, ValueError) as exc:
        raise ConfigError(f"model {config.model!r} does not load: {exc}") from exc
    if tokenizer.chat_template is None:
        raise ConfigError(f"the tokenizer of {config.model!r} has no chat template")
    if tokenizer.pad_token_id is None:
        tokenizer.pad_token = tokenizer.eos_token
    return model, tokenizer


def validation_bench_config(config: TrainConfig, model_path: str) -> BenchConfig:
    """The `drkernel bench` settings of this run's validations: each validation run directory gets them as its
    config.json, so `drkernel report` reads it as a bench run, and the validation loop runs with them."""
    return BenchConfig(
        tasks=config.validation_tasks or config.tasks, model=HF_PREFIX + model_path, samples=config.validation_samples,
        turns=config.turns, context=config.context, temperature=config.temperature, top_p=config.top_p,
        max_tokens=config.max_new_tokens, prompts=config.prompt_templates, profiling_reward=config.profiling_reward,
        evaluation=config.evaluation, engine=config.engine,
    )


def holds_a_run(output_dir: Path) -> bool:
    """Whether a former run left its metrics or checkpoints in `output_dir`."""
    return (output_dir / "metrics.jsonl").exists() or any(output_dir.glob("checkpoint-*"))


def _processes() -> int:
    return int(os.environ.get("WORLD_SIZE", "1"))  # what torchrun and accelerate launch set for each process


def prompts_per_step(config: TrainConfig) -> int:
    """Distinct prompts (tasks) one optimizer step draws: its trajectories over all processes, num_generations a
    prompt."""
    trajectories = config.per_device_train_batch_size * config.gradient_accumulation_steps * _processes()
    return trajectories // config.num_generations


def train(config: TrainConfig, resume: bool = False, generate: GenerateFn | None = None) -> Any:
    """Train; `resume` continues from the last checkpoint in output_dir (step count, optimizer, scheduler, RNG).
    Returns the trainer, whose state tells how far it got."""
    from drkernel.train.trainer import DrKernelTrainer

    out = Path(config.output_dir)
    checkpoint = last_checkpoint(out) if resume else None
    if resume and checkpoint is None:
        cut = cut_checkpoints(out)
        raise ConfigError(f"--resume: no checkpoint in {out}" + (
            f" that is whole ({', '.join(cut)}: no readable {TRAINER_STATE}, the run stopped while saving; delete "
            "it and start again)" if cut else ""))
    if not resume and holds_a_run(out):
        # a second run would write its metrics beside the first one's checkpoints and samples, and report mixes them
        raise ConfigError(f"{out} already holds a training run; pass --resume to continue it, "
                          "or choose another output_dir")
    if checkpoint is not None and checkpoint_step(checkpoint) >= config.max_steps:
        raise ConfigError(f"--resume: {checkpoint} is already at step {checkpoint_step(checkpoint)}, and max_steps is "
                          f"{config.max_steps}; raise max_steps to train further")
    tasks = load_tasks(config.tasks)
    per_step = prompts_per_step(config)
    if len(tasks) < per_step:
        # TRL's sampler draws whole steps only: it would train no step, and the run would end as if it had
        raise ConfigError(
            f"a step draws {per_step} prompts (per_device_train_batch_size {config.per_device_train_batch_size} x "
            f"gradient_accumulation_steps {config.gradient_accumulation_steps} x {_processes()} process(es) / "
            f"num_generations {config.num_generations}), and {config.tasks} holds {len(tasks)} task(s), so no step "
            "could be trained; give more tasks or draw fewer prompts a step")
    validation = load_tasks(config.validation_tasks) if config.validation_tasks else []
    out.mkdir(parents=True, exist_ok=True)
    if config.log_samples:
        Path(config.log_samples).parent.mkdir(parents=True, exist_ok=True)
    (out / "train_config.json").write_text(json.dumps(dataclasses.asdict(config), indent=2) + "\n")
    write_run_record(out, "rl", config.seed, dataclasses.asdict(config), resumed=checkpoint is not None)
    model, tokenizer = load_policy(config, tasks)
    evaluator, close_evaluator = open_evaluator(config.engine, config.evaluation)
    trainer = None
    try:
        trainer = DrKernelTrainer(
            model=model,
            config=config,
            tasks=tasks,
            evaluator=evaluator,
            processing_class=tokenizer,
            generate=generate,
            validation_tasks=validation,
            validation_bench=validation_bench_config(config, model.name_or_path),
        )
        trainer.train(resume_from_checkpoint=checkpoint)
        trainer.save_model(str(out / "final"))
    finally:
        closed = close_evaluator()
        if asyncio.iscoroutine(closed):  # the service's client closes in the loop that used it
            loop = trainer.rollout.loop if trainer is not None else asyncio.new_event_loop()
            loop.run_until_complete(closed)
    return trainer
