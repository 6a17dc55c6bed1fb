"""Validation during training: `drkernel bench`'s loop on held-out tasks with the model being trained.

The records go to RUN_DIR/validation/step_<N>/ in the agent's trajectories.jsonl format, so `drkernel report` reads
them like any bench run; the numbers are the agent summary's.
"""

from __future__ import annotations

import asyncio
import dataclasses
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from drkernel.agent.backends import ChatModel, ChatRequest, Completion, CompletionBatcher, SamplingParams
from drkernel.agent.bench import write_summary
from drkernel.agent.config import BenchConfig
from drkernel.scheduling.evaluator import Evaluator
from drkernel.agent.loop import run_loop
from drkernel.agent.records import CONFIG, write_json
from drkernel.rl import RewardConfig
from drkernel.tasks.task import Task
from drkernel.train.rollout import GenerateFn


class TrainerChatModel:
    """The agent's ChatModel over the trainer's in-memory model. Validation's trajectories run concurrently, and
    their requests are generated in batches (`CompletionBatcher`), each one call of the trainer's `generate`, in a
    worker thread so the evaluator keeps judging other trajectories meanwhile. The trainer samples with its own
    settings. `fill`: every batch is filled up to `max_batch` rows with copies of its first context, whose answers
    are dropped, so that a static cache's compiled decoding step sees one batch size (as `HFChatModel` does)."""

    def __init__(self, tokenizer: Any, generate: GenerateFn, max_batch: int = 32, fill: bool = False) -> None:
        self.tokenizer, self.generate, self.fill = tokenizer, generate, fill
        self.batcher = CompletionBatcher(self._answer, max_batch, name="validation-generate")

    async def complete(
        self, messages: list[dict[str, str]], params: SamplingParams, seed: int | None = None, tag: str = ""
    ) -> Completion:
        return await self.batcher.complete(messages, params, seed)

    def _answer(self, batch: list[ChatRequest]) -> list[Completion]:
        contexts = [self._context(request.messages) for request in batch]
        rows = contexts + [contexts[0]] * (self.batcher.max_batch - len(contexts)) if self.fill else contexts
        answers, _ = self.generate(rows)
        eos = self.tokenizer.eos_token_id
        completions = []
        for ids, answer in zip(contexts, answers):
            finished = eos in answer
            answer = answer[: answer.index(eos)] if finished else answer
            completions.append(Completion(
                self.tokenizer.decode(answer, skip_special_tokens=True),
                {"prompt_tokens": len(ids), "completion_tokens": len(answer) + finished},
                "stop" if finished else "length",
            ))
        return completions

    def _context(self, messages: list[dict[str, str]]) -> list[int]:
        text = self.tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
        return list(self.tokenizer(text, add_special_tokens=False)["input_ids"])

    async def close(self) -> None:
        self.batcher.close()


@dataclass
class Validation:
    """What validating needs, named (it read ten of the trainer's attributes): the held-out tasks, the bench settings
    the runs are made with (also written as each run's config.json), the reward the trainer's config gives, the
    evaluator, the model answering, and the event loop the evaluator lives in."""

    tasks: list[Task]
    bench: BenchConfig
    reward: RewardConfig
    evaluator: Evaluator
    model: ChatModel
    event_loop: asyncio.AbstractEventLoop
    output_dir: Path

    def run(self, step: int) -> dict[str, Any]:
        """Validate the model as it is at `step` into OUTPUT_DIR/validation/step_<step>/; the contract's
        `validation` entry of metrics.jsonl."""
        run_dir = self.output_dir / "validation" / f"step_{step}"
        loop = dataclasses.replace(self.bench.loop_config(), reward=self.reward)
        self.event_loop.run_until_complete(run_loop(self.tasks, self.model, self.evaluator, loop, run_dir))
        planned = [(task.key, sample) for task in self.tasks for sample in range(self.bench.samples)]
        summary = write_summary(run_dir, planned, self.bench.turns)
        write_json(run_dir / CONFIG, self.bench.to_dict())
        return {
            "correct": summary["last_turn"]["correct"],
            "fast_1": summary["last_turn"]["fast_1"],
            "fast_1_2": summary["last_turn"]["fast_1_2"],
            "turn_fast_1": summary["per_turn"]["fast_1"],
            "turn_fast_1_2": summary["per_turn"]["fast_1_2"],
            "best_of_history_fast_1_2": summary["best_of_history"]["fast_1_2"],
        }
