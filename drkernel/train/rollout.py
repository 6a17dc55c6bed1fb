"""Multi-turn rollouts as single completions: each turn's answer, then the feedback that the next turn's prompt adds.

The agent loop's prompts, code extraction, feedback and context policy build each turn's chat; the chat template
renders it. Turn t+1's rendered prompt must extend turn t's prompt plus its answer, so the whole trajectory is one
token sequence: the answers are the model's tokens (env_mask 1), the text the template adds between them (the end of
the answer's message, the feedback, the opening of the next answer) is the environment's (env_mask 0). That holds
for the `full` context policy with a template that renders earlier turns verbatim; anything else is refused,
because training on tokens the model never saw as its context would be wrong.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from drkernel.agent.context import ContextPolicy, ShownTurn, build_messages
from drkernel.scheduling.evaluator import Evaluator
from drkernel.agent.loop import JudgedAnswer, judge_answer
from drkernel.agent.prompts import PromptTemplates
from drkernel.agent.records import TurnRecord
from drkernel.errors import EngineError, UsageError
from drkernel.rl import RewardConfig, measured_coverage
from drkernel.schema import EvalResult, Status
from drkernel.tasks.task import Task


class EvaluatorUnavailable(EngineError):
    """The evaluator failed every retry: the step cannot be scored, and is failed rather than trained on zeros."""


class TemplateMismatch(UsageError):
    """The next turn's rendered prompt does not extend the previous one, so the turns are not one sequence."""


# generate(token-id contexts) -> (generated token ids per context, their sampling log-probs per context or None)
GenerateFn = Callable[[list[list[int]]], tuple[list[list[int]], "list[list[float]] | None"]]


@dataclass
class Trajectory:
    """One sample's turns as one completion, with where each answer lies in it."""

    task: Task
    first_prompt: str
    prompt_ids: list[int]
    text: str  # the rendered prompt and completion so far, to check that the next turn extends it
    completion_ids: list[int] = field(default_factory=list)
    env_mask: list[int] = field(default_factory=list)
    logprobs: list[float] | None = field(default_factory=list)  # the rollout engine's, 0 on environment tokens
    spans: list[tuple[int, int]] = field(default_factory=list)  # [start, end) of each answer in completion_ids
    shown: list[ShownTurn] = field(default_factory=list)
    records: list[TurnRecord] = field(default_factory=list)


@dataclass
class RolloutStats:
    generation_s: float = 0.0
    evaluation_s: float = 0.0
    evaluations: int = 0
    crashed: int = 0  # evaluations whose result was a crash of the evaluation itself: reward 0
    cached: int = 0  # evaluations answered by the result cache (an identical answer judged before)


@dataclass
class RetryingEvaluator:
    """An evaluator tried again, with backoff, when its engine fails (a refused connection, a dead Ray cluster, a
    service error); `EvaluatorUnavailable` once it has failed `retries + 1` times in a row."""

    evaluator: Evaluator
    retries: int
    backoff_s: float

    async def evaluate(self, task: Task, code: str) -> EvalResult:
        last: BaseException | None = None
        for attempt in range(self.retries + 1):
            try:
                return await self.evaluator.evaluate(task, code)
            except Exception as exc:
                last = exc
                if attempt < self.retries:
                    await asyncio.sleep(self.backoff_s * 2**attempt)
        raise EvaluatorUnavailable(
            f"the evaluator failed {self.retries + 1} times in a row for task {task.key}: {type(last).__name__}: "
            f"{last}"
        ) from last


def turn_coverage(record: TurnRecord) -> float | None:
    """Measured coverage of a judged turn, None where it was not measured (no GPU, no code)."""
    return measured_coverage((record.result or {}).get("profile"))


class MultiTurnRollout:
    """Runs `turns` turns for a batch of first prompts; one instance per trainer."""

    def __init__(
        self,
        tokenizer: Any,
        evaluator: Evaluator,
        generate: GenerateFn,
        turns: int,
        reward_config: RewardConfig,
        templates: PromptTemplates = PromptTemplates(),
        context: ContextPolicy = ContextPolicy("full"),
        evaluator_retries: int = 3,
        evaluator_backoff_s: float = 1.0,
    ) -> None:
        if context.kind != "full" and (context.k is None or context.k < turns - 1):
            raise ValueError(
                f"training needs each turn's prompt to extend the previous turn's, which the context policy "
                f"{context} does not give for {turns} turns; use 'full' (or last/topk/window with K >= {turns - 1})"
            )
        if turns < 1:
            raise ValueError(f"turns must be at least 1, not {turns}")
        self.tokenizer = tokenizer
        self.evaluator = evaluator
        self.generate = generate
        self.turns = turns
        self.reward_config = reward_config
        self.templates = templates
        self.context = context
        self.evaluator_retries = evaluator_retries
        self.evaluator_backoff_s = evaluator_backoff_s
        self.stats = RolloutStats()
        # One event loop for the whole run: an async client (the service's) keeps connections bound to the loop
        # that opened them, so a fresh loop per turn would find them dead.
        self.loop = asyncio.new_event_loop()

    def _render(self, messages: list[dict[str, str]]) -> str:
        return self.tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)

    def _encode(self, text: str) -> list[int]:
        return list(self.tokenizer(text, add_special_tokens=False)["input_ids"])

    def start(self, task: Task, first_prompt: str) -> Trajectory:
        text = self._render([{"role": "user", "content": first_prompt}])
        return Trajectory(task=task, first_prompt=first_prompt, prompt_ids=self._encode(text), text=text)

    def run(self, trajectories: Sequence[Trajectory], samples: Sequence[int]) -> None:
        """Play every turn of every trajectory in place; `samples` are the 0-based sample numbers for the records."""
        for turn in range(1, self.turns + 1):
            contexts = [t.prompt_ids + t.completion_ids for t in trajectories]
            started = time.perf_counter()
            answers, logprobs = self._cut(*self.generate(contexts))
            generation_s = time.perf_counter() - started
            self.stats.generation_s += generation_s
            responses = [self._response(ids) for ids in answers]
            started = time.perf_counter()
            judged = self.loop.run_until_complete(self._judge([t.task for t in trajectories], responses))
            evaluation_s = time.perf_counter() - started
            self.stats.evaluation_s += evaluation_s
            for n, (traj, sample, ids) in enumerate(zip(trajectories, samples, answers)):
                if traj.logprobs is not None:
                    traj.logprobs = traj.logprobs + logprobs[n] if logprobs is not None else None
                self._record(traj, sample, turn, ids, responses[n], judged[n], generation_s, evaluation_s)
                if turn < self.turns:
                    self._extend(traj)

    def _cut(
        self, generated: list[list[int]], logprobs: list[list[float]] | None
    ) -> tuple[list[list[int]], list[list[float]] | None]:
        """Each answer up to and including its end-of-turn token; padding after it is not the model's."""
        eos = self.tokenizer.eos_token_id
        lengths = [list(ids).index(eos) + 1 if eos in ids else len(ids) for ids in generated]
        answers = [list(ids)[:n] for ids, n in zip(generated, lengths)]
        if logprobs is None:
            return answers, None
        return answers, [list(lp)[:n] for lp, n in zip(logprobs, lengths)]

    def _response(self, ids: list[int]) -> str:
        """The answer's text as the next prompt shows it: every token but the closing end-of-turn, special tokens
        included, so that rendering it again gives back exactly the tokens the model produced."""
        if ids and ids[-1] == self.tokenizer.eos_token_id:
            ids = ids[:-1]
        return self._decode(ids)

    def _decode(self, ids: list[int]) -> str:
        return self.tokenizer.decode(ids, skip_special_tokens=False, clean_up_tokenization_spaces=False)

    async def _judge(self, tasks: list[Task], responses: list[str]) -> list[JudgedAnswer]:
        """Every answer judged as `drkernel bench` judges it, the evaluator retried when its engine fails."""
        evaluator = RetryingEvaluator(self.evaluator, self.evaluator_retries, self.evaluator_backoff_s)
        return list(await asyncio.gather(*(judge_answer(task, response, evaluator, self.reward_config, self.templates)
                                           for task, response in zip(tasks, responses))))

    def _record(
        self,
        traj: Trajectory,
        sample: int,
        turn: int,
        ids: list[int],
        response: str,
        judged: JudgedAnswer,
        generation_s: float,
        evaluation_s: float,
    ) -> None:
        result, code, value, feedback = judged.result, judged.code, judged.reward, judged.feedback
        if result is not None:
            self.stats.evaluations += 1
            self.stats.crashed += result.status == Status.CRASHED
            self.stats.cached += result.cached
        messages, context_turns = build_messages(traj.first_prompt, traj.shown, self.context)
        start = len(traj.completion_ids)
        traj.completion_ids += ids
        traj.env_mask += [1] * len(ids)
        traj.spans.append((start, len(traj.completion_ids)))
        traj.text += self._decode(ids)
        traj.shown.append(ShownTurn(response=response, feedback=feedback, reward=value))
        traj.records.append(
            TurnRecord(
                task=traj.task.key,
                level=traj.task.level,
                sample=sample,
                turn=turn,
                messages=messages,
                response=response,
                code=code,
                result=result.to_dict() if result is not None else None,
                reward=value,
                feedback=feedback,
                context_turns=context_turns,
                usage={"prompt_tokens": len(traj.prompt_ids) + start, "completion_tokens": len(ids)},
                timings={"generation_s": generation_s, "evaluation_s": evaluation_s},
                status=judged.status,
            )
        )

    def _extend(self, traj: Trajectory) -> None:
        """Append the environment's tokens that open the next turn: what the next prompt adds to this sequence."""
        messages, _ = build_messages(traj.first_prompt, traj.shown, self.context)
        text = self._render(messages)
        if not text.startswith(traj.text):
            raise TemplateMismatch(
                "the chat template does not render the next turn's prompt as the previous prompt plus the answer, "
                "so the turns cannot be trained as one sequence; use a template that renders earlier assistant "
                "messages verbatim (ChatML does; templates that strip reasoning from earlier turns do not)"
            )
        env_ids = self._encode(text[len(traj.text):])
        traj.completion_ids += env_ids
        traj.env_mask += [0] * len(env_ids)
        if traj.logprobs is not None:
            traj.logprobs += [0.0] * len(env_ids)
        traj.text = text
