"""The loop: prompt -> model -> code -> evaluator -> feedback -> next prompt, for many trajectories at once.

Each trajectory (task, sample) is one coroutine: its turn t+1 is asked as soon as turn t is judged, and
`concurrency` bounds how many trajectories are in flight. Generation and evaluation overlap across trajectories
because the evaluator queues work itself (the scheduler's workers, Ray actors or the service), so neither the model
server nor the GPUs wait on the loop. A turn is recorded once it is judged; a resumed run rebuilds each trajectory's
context from its records and asks only the turns that are missing. A model call that fails for good (after the
backend's retries) is logged in generation_errors.jsonl instead of being recorded as a turn: its trajectory ends
for this run, and a resumed run asks that turn again.
"""

from __future__ import annotations

import asyncio
import hashlib
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from drkernel.agent.backends import ChatModel, FatalGenerationError, GenerationError, SamplingParams
from drkernel.agent.context import ContextPolicy, ShownTurn, build_messages
from drkernel.scheduling.evaluator import Evaluator
from drkernel.agent.parsing import extract_code
from drkernel.agent.prompts import PromptTemplates, feedback_prompt, first_turn_prompt
from drkernel.agent.records import (
    FORMAT_ERROR,
    GENERATION_ERRORS,
    GenerationErrorRecord,
    JsonlAppender,
    TrajectoryWriter,
    TurnRecord,
    by_trajectory,
    read_trajectories,
)
from drkernel.errors import UsageError
from drkernel.rl import RewardConfig, reward
from drkernel.schema import EvalResult
from drkernel.tasks import Task


@dataclass
class LoopConfig:
    """What shapes the trajectories. The paper's STTS evaluation: 8 samples, 14 turns, window:4."""

    samples: int = 1
    turns: int = 1
    context: ContextPolicy = field(default_factory=ContextPolicy)
    sampling: SamplingParams = field(default_factory=SamplingParams)
    concurrency: int = 32
    reward: RewardConfig = field(default_factory=RewardConfig)
    templates: PromptTemplates = field(default_factory=PromptTemplates)

    def __post_init__(self) -> None:
        if self.samples < 1 or self.turns < 1 or self.concurrency < 1:
            raise UsageError("samples, turns and concurrency must be at least 1")


@dataclass
class LoopOutcome:
    records: list[TurnRecord]  # every turn of the run, those of runs it resumes included, in file order
    new_turns: int  # turns this call judged and recorded
    generation_errors: list[GenerationErrorRecord]  # turns whose model call failed for good in this call


async def run_loop(
    tasks: Sequence[Task],
    model: ChatModel,
    evaluator: Evaluator,
    config: LoopConfig,
    run_dir: str | Path,
    on_turn: Callable[[TurnRecord], None] | None = None,
) -> LoopOutcome:
    """Run (or resume) every trajectory of `tasks` x `config.samples` up to `config.turns` turns.

    A turn whose model call fails for good is logged (RUN_DIR/generation_errors.jsonl), not recorded, and ends its
    trajectory for this call. `FatalGenerationError` (a refused key, an unknown model, an unreachable server)
    cancels every trajectory in flight and propagates; what was recorded before stays recorded.
    """
    earlier = by_trajectory(read_trajectories(run_dir))
    gate = asyncio.Semaphore(config.concurrency)
    new: list[TurnRecord] = []
    errors: list[GenerationErrorRecord] = []
    with TrajectoryWriter(run_dir) as writer, JsonlAppender(Path(run_dir) / GENERATION_ERRORS) as error_log:

        async def trajectory(task: Task, sample: int) -> None:
            history = list(earlier.get((task.key, sample), []))
            if len(history) >= config.turns:
                return
            async with gate:
                first = first_turn_prompt(task.code, config.templates)
                for turn in range(len(history) + 1, config.turns + 1):
                    try:
                        record = await _turn(task, sample, turn, first, history, model, evaluator, config)
                    except FatalGenerationError:
                        raise
                    except GenerationError as exc:
                        failure = GenerationErrorRecord(task.key, sample, turn, str(exc))
                        error_log.append_row(failure.to_dict())
                        errors.append(failure)
                        return
                    writer.append(record)
                    new.append(record)
                    history.append(record)
                    if on_turn is not None:
                        on_turn(record)

        jobs = [asyncio.ensure_future(trajectory(t, s)) for t in tasks for s in range(config.samples)]
        try:
            if jobs:
                await asyncio.gather(*jobs)
        finally:
            for job in jobs:
                job.cancel()
            await asyncio.gather(*jobs, return_exceptions=True)
    return LoopOutcome(read_trajectories(run_dir), len(new), errors)


def request_seed(seed: int, task: str, sample: int, turn: int) -> int:
    """The seed one request asks with: fixed by the run's seed, the task, the sample and the turn, so a rerun repeats
    it while every request draws its own random stream. (`seed + sample` gave sample i of every task the same
    stream: a one-sample run drew each task's answer with the same noise, and their kinds moved together.)"""
    digest = hashlib.sha256(f"{seed}/{task}/{sample}/{turn}".encode()).digest()
    return int.from_bytes(digest[:4], "big") & 0x7FFFFFFF  # a non-negative 32-bit int, which every server takes


async def _turn(
    task: Task, sample: int, turn: int, first_prompt: str, history: list[TurnRecord], model: ChatModel,
    evaluator: Evaluator, config: LoopConfig,
) -> TurnRecord:
    shown = [ShownTurn(r.response, r.feedback, r.reward) for r in history]
    messages, context_turns = build_messages(first_prompt, shown, config.context)
    seed = None if config.sampling.seed is None else request_seed(config.sampling.seed, task.key, sample, turn)
    record = TurnRecord(task=task.key, level=task.level, sample=sample, turn=turn, messages=messages, response="",
                        code=None, result=None, reward=0.0, feedback="", context_turns=context_turns)
    started = time.monotonic()
    completion = await model.complete(messages, config.sampling, seed=seed, tag=f"{task.key}/{sample}/{turn}")
    generated = time.monotonic()
    record.response, record.usage = completion.text, completion.usage
    judged = await judge_answer(task, completion.text, evaluator, config.reward, config.templates)
    record.code, record.status, record.reward = judged.code, judged.status, judged.reward
    record.feedback = judged.feedback
    record.result = judged.result.to_dict() if judged.result is not None else None
    record.timings = {"generation_s": generated - started, "evaluation_s": time.monotonic() - generated}
    return record


@dataclass
class JudgedAnswer:
    code: str | None  # the python block judged; None: the answer had none (status FORMAT_ERROR, reward 0)
    result: EvalResult | None
    status: str  # the result's Status, or FORMAT_ERROR
    reward: float
    feedback: str  # the message the next turn shows the model


async def judge_answer(task: Task, response: str, evaluator: Evaluator, reward_config: RewardConfig,
                       templates: PromptTemplates) -> JudgedAnswer:
    """One answer to one task: its code, verdict, reward and feedback. The loop, `drkernel bench` and the
    framework integrations (drkernel.integrations) judge a turn with this, so they agree on every answer."""
    code = extract_code(response)
    if code is None:
        return JudgedAnswer(None, None, FORMAT_ERROR, 0.0, feedback_prompt(None, None, templates))
    result = await evaluator.evaluate(task, code)
    return JudgedAnswer(code, result, result.status, reward(result, reward_config),
                        feedback_prompt(result, code, templates))
