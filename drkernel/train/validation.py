"""Validation during training: `drkernel bench`'s loop on held-out tasks with the model being trained.

The records go to RUN_DIR/validation/step_<N>/ in the agent's trajectories.jsonl format, so `drkernel report` reads
them like any bench run; the numbers are the agent summary's.
"""

from __future__ import annotations

import asyncio
import threading
from pathlib import Path
from typing import TYPE_CHECKING, Any

from drkernel.agent.backends import Completion, SamplingParams
from drkernel.agent.bench import write_summary
from drkernel.agent.loop import LoopConfig, run_loop
from drkernel.agent.records import CONFIG, write_json
from drkernel.train.rollout import GenerateFn

if TYPE_CHECKING:
    from drkernel.train.trainer import DrKernelTrainer


class TrainerChatModel:
    """The agent's ChatModel over the trainer's in-memory model: one generation at a time, in a worker thread so
    the evaluator keeps judging other trajectories meanwhile."""

    def __init__(self, tokenizer: Any, generate: GenerateFn) -> None:
        self.tokenizer, self.generate = tokenizer, generate
        self._lock = threading.Lock()

    async def complete(
        self, messages: list[dict[str, str]], params: SamplingParams, seed: int | None = None, tag: str = ""
    ) -> Completion:
        return await asyncio.to_thread(self._complete, messages)

    def _complete(self, messages: list[dict[str, str]]) -> Completion:
        text = self.tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
        ids = list(self.tokenizer(text, add_special_tokens=False)["input_ids"])
        with self._lock:
            (answer,), _ = self.generate([ids])
        eos = self.tokenizer.eos_token_id
        finished = eos in answer
        answer = answer[: answer.index(eos)] if finished else answer
        return Completion(
            self.tokenizer.decode(answer, skip_special_tokens=True),
            {"prompt_tokens": len(ids), "completion_tokens": len(answer) + finished},
            "stop" if finished else "length",
        )

    async def close(self) -> None:
        return None


def validate(trainer: DrKernelTrainer, step: int) -> dict[str, Any]:
    """The contract's `validation` entry of metrics.jsonl for this step."""
    config = trainer.config
    run_dir = f"{config.output_dir}/validation/step_{step}"
    # the trainer's own model even when rollouts use vLLM: validation runs on the main process alone, and vLLM's
    # server mode gathers from every process
    generate = trainer.rollout.generate if trainer.rollout.generate != trainer.sample else trainer.sample_transformers
    model = TrainerChatModel(trainer.processing_class, generate)
    loop = LoopConfig(
        samples=config.validation_samples,
        turns=config.turns,
        context=config.context_policy(),
        sampling=SamplingParams(temperature=config.temperature, top_p=config.top_p, max_tokens=config.max_new_tokens),
        reward=config.reward_config(),
        templates=trainer.templates,
    )
    was_training = trainer.model.training
    trainer.model.eval()
    try:
        trainer.rollout.loop.run_until_complete(
            run_loop(trainer.validation_tasks, model, trainer.evaluator, loop, run_dir)
        )
    finally:
        trainer.model.train(was_training)
    planned = [(task.key, sample) for task in trainer.validation_tasks for sample in range(config.validation_samples)]
    summary = write_summary(Path(run_dir), planned, config.turns)
    if trainer.bench is not None:
        write_json(Path(run_dir) / CONFIG, trainer.bench.to_dict())
    return {
        "correct": summary["last_turn"]["correct"],
        "fast_1": summary["last_turn"]["fast_1"],
        "fast_1_2": summary["last_turn"]["fast_1_2"],
        "turn_fast_1": summary["per_turn"]["fast_1"],
        "turn_fast_1_2": summary["per_turn"]["fast_1_2"],
        "best_of_history_fast_1_2": summary["best_of_history"]["fast_1_2"],
    }
