"""TRL's GRPOTrainer training a policy on drkernel's OpenEnv environment (`drkernel.integrations.openenv`).

    python examples/trl_openenv_grpo.py --model PATH [--route tools|turns] [--tasks examples/tasks]
        [--env-url http://HOST:8000] [--use-vllm]

Every episode goes through openenv-core's client: to a server at `--env-url` (`drkernel-openenv`, run elsewhere),
or else to one this script serves on the loopback, judging on the embedded scheduler. `reset(task=KEY)` gives the
first chat, each `step(KernelAction(answer))` judges one answer with drkernel's verdicts, `done` after the episode's
last turn (`--turns`, 3 as the paper trains, for the script's own server; the server's own setting behind
`--env-url`). GRPO takes one reward per completion: the episode's return, the sum of its turns' rewards. Per-turn
credit (TRLOO, the paper's), PRS, MRS and the void-turn rule are `drkernel train`'s, not this script's.

Two routes into the trainer (tested with TRL 1.16):

- `--route tools` (default): TRL's `environment_factory`, its documented route for OpenEnv. Each rollout gets a
  `KernelTools`; the model submits a kernel by calling its `submit_kernel` tool and reads the verdict as the tool's
  reply, at most `--turns` times; TRL's own tool loop samples, masks the tool replies and renders the chat (with its
  prefix-preserving training template for Qwen3 and the other templates it knows). The policy's chat template must
  support tool calls.
- `--route turns`: TRL's `rollout_func`, which adds what the tool route cannot: drkernel's own turn format (a whole
  answer per turn, the feedback as the next user message, as the paper and `drkernel train` lay out an episode) for
  any chat template, tool calls or not. Each turn is sampled by TRL's per-turn sampler
  (`GRPOTrainer._generate_single_turn`, private: hence TRL is pinned to 1.16 in drkernel's extras); the model's
  answers join the completion verbatim under env_mask 1, and between them the tokens the chat template puts after
  an assistant message (its end, the feedback, the next generation prompt) under env_mask 0. The earlier turns are
  never re-rendered, so templates that rewrite them (Qwen3 strips earlier turns' reasoning) train as they sample.

`--use-vllm` samples with vLLM in the trainer's process (TRL's colocate mode); it needs vLLM installed (CUDA only)
and is refused without it. Without it, TRL samples with transformers' `generate`.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import importlib.util
import json
import threading
from collections.abc import Awaitable, Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import uvicorn
from datasets import Dataset
from trl import GRPOConfig, GRPOTrainer

from drkernel.scheduling.evaluator import BackendEvaluator
from drkernel.agent.replay import fenced
from drkernel.integrations.openenv import (CLIENT_TIMEOUT_S, EpisodeConfig, KernelAction, KernelEnvClient,
                                           KernelObservation, create_server)
from drkernel.runner.devices import resolve_device
from drkernel.scheduling.scheduler import Scheduler
from drkernel.schema import EvalOptions
from drkernel.tasks import Task, load_task_dir

T = TypeVar("T")
ROUTES = ("tools", "turns")
# Marks where an assistant message's content ends in a rendered chat; no answer contains it.
ANSWER_END = "\u2063drkernel-answer-end\u2063"


class KernelTools:
    """TRL's `environment_factory` object: one per concurrent rollout, kept across steps. TRL calls `reset` with the
    dataset row's fields, offers the public methods as tools, and calls `get_reward` once the rollout ends."""

    def __init__(self, url: str, timeout_s: float = CLIENT_TIMEOUT_S) -> None:
        self.client = KernelEnvClient(base_url=url, message_timeout_s=timeout_s).sync()
        self.client.connect()
        self.rewards: list[float] = []
        self.done = False

    def reset(self, task: str, **_: Any) -> str:
        self.client.reset(task=task)
        self.rewards, self.done = [], False
        return ("\n\nSubmit your ModelNew by calling the submit_kernel tool with the module's full source: its verdict "
                "comes back, and you may fix the kernel and submit again while submissions remain.")

    def submit_kernel(self, code: str) -> str:
        """Judge a Triton kernel: check its output against the reference model and time it.

        Args:
            code: The complete Python source of a module defining `class ModelNew(nn.Module)` that computes what the
                reference `Model` computes, with Triton kernels.

        Returns:
            The verdict: correct or not, why, and the speedup over the reference when correct.
        """
        if self.done:
            return "The episode is over: no more submissions are judged."
        result = self.client.step(KernelAction(answer=fenced(code)))
        self.rewards.append(float(result.reward or 0.0))
        self.done = result.done
        return result.observation.feedback

    def get_reward(self) -> float:
        """The episode's return: the sum of its submissions' rewards (0 when the model submitted nothing)."""
        return sum(self.rewards)


def environment_suffix(tokenizer: Any, messages: list[dict[str, str]], **template_kwargs: Any) -> str:
    """What the chat template writes after an assistant message's content when `messages` follow it, up to the next
    generation prompt: the end of that turn, the environment's messages, the opening of the next answer. Rendered
    after a placeholder exchange, so the earlier turns are never rendered again (Qwen3's template, for one, renders
    an earlier turn differently once a user message follows it)."""
    placeholder = [{"role": "user", "content": "task"}, {"role": "assistant", "content": ANSWER_END}]
    text = tokenizer.apply_chat_template(placeholder + messages, tokenize=False, add_generation_prompt=True,
                                         **template_kwargs)
    return text[text.rindex(ANSWER_END) + len(ANSWER_END):]


class EnvConnection:
    """One episode at a time on a drkernel OpenEnv server: a WebSocket connection of openenv-core's client."""

    def __init__(self, url: str, timeout_s: float) -> None:
        self.client = KernelEnvClient(base_url=url, message_timeout_s=timeout_s)

    async def reset(self, task: str) -> KernelObservation:
        return (await self.client.reset(task=task)).observation

    async def step(self, answer: str) -> KernelObservation:
        return (await self.client.step(KernelAction(answer=answer))).observation

    async def close(self) -> None:
        await self.client.close()


@contextlib.contextmanager
def local_server(app: Any) -> Iterator[str]:
    """Serve `app` on a free loopback port in a thread; yields its URL, stops it on exit."""
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=0, log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    while not server.started:
        if not thread.is_alive():
            raise RuntimeError("the environment server did not start")
        thread.join(0.05)
    try:
        yield f"http://127.0.0.1:{server.servers[0].sockets[0].getsockname()[1]}"
    finally:
        server.should_exit = True
        thread.join(30)


@dataclass
class Episode:
    """One rollout: its prompt, and its turns as one completion (answers env_mask 1, the environment's text 0)."""

    task: str
    prompt_ids: list[int]
    messages: list[dict[str, str]]  # the chat so far, as the environment shows it
    completion_ids: list[int] = field(default_factory=list)
    env_mask: list[int] = field(default_factory=list)
    logprobs: list[float] | None = field(default_factory=list)  # the sampler's, 0 on the environment's tokens
    rewards: list[float] = field(default_factory=list)
    done: bool = False


def _prompt_key(messages: list[dict[str, str]]) -> str:
    return json.dumps(messages, sort_keys=True)


def _decode(tokenizer: Any, ids: list[int]) -> str:
    """Special tokens kept, so that the chat template renders the answer back into exactly these tokens."""
    return tokenizer.decode(ids, skip_special_tokens=False, clean_up_tokenization_spaces=False)


async def _gather(awaitables: Iterable[Awaitable[T]]) -> list[T]:
    return list(await asyncio.gather(*awaitables))


class EnvironmentRollout:
    """TRL's `rollout_func`: plays an episode of the environment for each prompt it is given.

    One connection per concurrent rollout, kept across steps; every connection's turn is judged at once (the evaluator's
    queue orders the work).
    """

    def __init__(self, new_connection: Callable[[], EnvConnection], dataset: Dataset) -> None:
        self.new_connection = new_connection
        self.connections: list[EnvConnection] = []
        self.task_of = {_prompt_key(row["prompt"]): row["task"] for row in dataset}  # first chat (JSON) -> task
        # One event loop for the whole run, always running in a thread of its own: a client's WebSocket belongs to
        # the loop that opened it, and that loop must answer the server's keepalive pings while the model samples.
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self.loop.run_forever, daemon=True, name="openenv-connections")
        self._thread.start()

    def __call__(self, prompts: list[list[dict[str, str]]], trainer: GRPOTrainer) -> dict[str, Any]:
        tokenizer = trainer.processing_class
        keys = []
        for prompt in prompts:
            if _prompt_key(prompt) not in self.task_of:
                raise KeyError("a prompt that is no task's first chat reached the rollout")
            keys.append(self.task_of[_prompt_key(prompt)])
        self._grow(len(prompts))
        connections = self.connections[: len(prompts)]
        first = self._run(_gather(s.reset(k) for s, k in zip(connections, keys)))
        episodes = []
        for key, prompt, observation in zip(keys, prompts, first):
            if observation.messages != prompt:
                raise RuntimeError(f"the environment's first chat for {key} changed since the dataset was built")
            text = tokenizer.apply_chat_template(observation.messages, tokenize=False, add_generation_prompt=True,
                                                 **trainer.chat_template_kwargs)
            episodes.append(Episode(key, tokenizer(text, add_special_tokens=False)["input_ids"], observation.messages))
        # Every episode of a run has the same number of turns, so each process samples as many times as the others
        # (TRL's vLLM server mode gathers every process's prompts for each call).
        while live := [i for i, e in enumerate(episodes) if not e.done]:
            contexts = [episodes[i].prompt_ids + episodes[i].completion_ids for i in live]
            answers, logprobs = trainer._generate_single_turn(contexts, None, {}, num_generations=1)
            responses = []
            for n, i in enumerate(live):
                episode, ids = episodes[i], list(answers[n])
                episode.completion_ids += ids
                episode.env_mask += [1] * len(ids)
                if episode.logprobs is not None:
                    episode.logprobs = episode.logprobs + list(logprobs[n]) if logprobs is not None else None
                ended = bool(ids) and ids[-1] in trainer.eos_token_ids
                responses.append((_decode(tokenizer, ids[:-1] if ended else ids), ended))
            steps = _gather(connections[i].step(answer) for i, (answer, _) in zip(live, responses))
            for i, (answer, ended), observation in zip(live, responses, self._run(steps)):
                self._take(trainer, episodes[i], answer, ended, observation)
        with_logprobs = all(e.logprobs is not None for e in episodes)
        return {
            "prompt_ids": [e.prompt_ids for e in episodes],
            "completion_ids": [e.completion_ids for e in episodes],
            "logprobs": [e.logprobs for e in episodes] if with_logprobs else None,
            "env_mask": [e.env_mask for e in episodes],
            "env_return": [sum(e.rewards) for e in episodes],
        }

    def _take(self, trainer: GRPOTrainer, episode: Episode, answer: str, ended: bool,
              observation: KernelObservation) -> None:
        """Record a judged turn; unless the episode is done, append what the next turn's chat adds after the answer
        (the model's tokens stay as sampled) as env tokens."""
        if observation.reward is None:
            raise RuntimeError(f"the environment judged an answer for {episode.task} without a reward")
        episode.rewards.append(float(observation.reward))
        episode.done = observation.done
        if episode.done:
            return
        shown = episode.messages + [{"role": "assistant", "content": answer}]
        if observation.messages[:len(shown)] != shown:
            raise ValueError("the next turn's chat does not show every earlier turn verbatim, so the turns cannot be "
                             "trained as one sequence: serve the environment with its `full` context policy")
        tokenizer = trainer.processing_class
        suffix = environment_suffix(tokenizer, observation.messages[len(shown):], **trainer.chat_template_kwargs)
        end_of_turn = tokenizer.eos_token or ""
        if ended and end_of_turn and suffix.startswith(end_of_turn):
            suffix = suffix[len(end_of_turn):]  # the sampled answer already ends its turn
        ids = tokenizer(suffix, add_special_tokens=False)["input_ids"]
        episode.completion_ids += ids
        episode.env_mask += [0] * len(ids)
        if episode.logprobs is not None:
            episode.logprobs += [0.0] * len(ids)
        episode.messages = observation.messages

    def _grow(self, count: int) -> None:
        while len(self.connections) < count:
            self.connections.append(self.new_connection())

    def close(self) -> None:
        self._run(_gather(s.close() for s in self.connections))
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join()
        self.loop.close()

    def _run(self, awaitable: Awaitable[T]) -> T:
        return asyncio.run_coroutine_threadsafe(awaitable, self.loop).result()


def task_dataset(url: str, keys: Sequence[str], timeout_s: float) -> Dataset:
    """One row per task: its first chat, as the environment gives it, in TRL's conversational `prompt`, and its key
    in `task` (which TRL passes to `KernelTools.reset`)."""
    with KernelEnvClient(base_url=url, message_timeout_s=timeout_s).sync() as client:
        return Dataset.from_list([{"prompt": client.reset(task=key).observation.messages, "task": key}
                                  for key in keys])


def environment_return(completions: list[Any], env_return: list[float], **_: Any) -> list[float]:
    """GRPO's reward: the episode's return, the sum of the rewards the environment gave its turns."""
    return [float(r) for r in env_return]


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", required=True, help="a causal LM folder or hub id, loaded by from_pretrained")
    p.add_argument("--route", choices=ROUTES, default="tools",
                   help="tools: TRL's environment_factory (the model calls submit_kernel); turns: rollout_func, a "
                        "whole answer per turn (any chat template)")
    p.add_argument("--use-vllm", action="store_true", help="sample with vLLM in this process (needs vLLM, CUDA)")
    p.add_argument("--tasks", type=Path, default=Path("examples/tasks"),
                   help="task folder; behind --env-url, the tasks to ask the server for (its set must hold them)")
    p.add_argument("--task", action="append", default=[], metavar="KEY", help="train on this task only (repeatable)")
    p.add_argument("--device", choices=("auto", "cpu", "cuda"), default="auto",
                   help="where the policy trains and the server served here judges")
    p.add_argument("--env-url", help="a drkernel OpenEnv server to use instead of serving one here")
    p.add_argument("--env-timeout-s", type=float, default=CLIENT_TIMEOUT_S,
                   help="how long to wait for the server's reply to one answer (its evaluation and the queue)")
    p.add_argument("--turns", type=int, default=3, help="answers per episode (the server served here)")
    p.add_argument("--eval-timeout-s", type=float, default=180.0, help="limit of one evaluation (served here)")
    p.add_argument("--max-steps", type=int, default=100, help="optimizer steps")
    p.add_argument("--output-dir", type=Path, default=Path("runs/trl_openenv_grpo"))
    p.add_argument("--num-generations", type=int, default=16, help="episodes per task in a GRPO group")
    p.add_argument("--batch-size", type=int, help="episodes per device and step (default: --num-generations)")
    p.add_argument("--max-completion-length", type=int, default=4096, help="tokens per answer (per turn)")
    p.add_argument("--learning-rate", type=float, default=1e-6)
    p.add_argument("--epsilon", type=float, default=0.2, help="lower clip of the ratio")
    p.add_argument("--epsilon-high", type=float, default=0.28, help="upper clip of the ratio")
    p.add_argument("--beta", type=float, default=0.0, help="KL coefficient (0: no reference model)")
    p.add_argument("--temperature", type=float, default=1.0)
    p.add_argument("--loss-type", default="dr_grpo")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--report-to", default="none", help="TRL's report_to (none, wandb, tensorboard, ...)")
    args = p.parse_args(argv)
    if args.turns < 1 or args.max_steps < 1 or args.num_generations < 2 or args.max_completion_length < 1:
        p.error("--turns, --max-steps and --max-completion-length must be positive, --num-generations at least 2")
    if args.use_vllm and importlib.util.find_spec("vllm") is None:
        p.error("--use-vllm needs vLLM, which is not installed (pip install vllm: CUDA only); without the flag, TRL "
                "samples with transformers")
    return args


def select_tasks(folder: Path, keys: Sequence[str]) -> list[Task]:
    """The folder's tasks, or the named ones (an unknown name is an error, not an empty run)."""
    tasks = load_task_dir(folder)
    if not keys:
        return tasks
    known = {t.key for t in tasks}
    if missing := [k for k in keys if k not in known]:
        raise ValueError(f"no task {', '.join(missing)} in {folder} (it has {', '.join(sorted(known))})")
    return [t for t in tasks if t.key in keys]


def grpo_config(args: argparse.Namespace, device: str) -> GRPOConfig:
    """Dr. GRPO as the paper trains (clip 0.2/0.28, no KL, unscaled rewards), one generation batch per step."""
    return GRPOConfig(
        output_dir=str(args.output_dir),
        max_steps=args.max_steps,
        num_generations=args.num_generations,
        per_device_train_batch_size=args.batch_size or args.num_generations,
        max_completion_length=args.max_completion_length,
        temperature=args.temperature,
        learning_rate=args.learning_rate,
        epsilon=args.epsilon,
        epsilon_high=args.epsilon_high,
        beta=args.beta,
        loss_type=args.loss_type,
        scale_rewards="none",
        mask_truncated_completions=False,
        use_cpu=device == "cpu",
        bf16=device == "cuda",
        seed=args.seed,
        logging_steps=1,
        save_strategy="no",
        report_to=args.report_to,
        use_vllm=args.use_vllm,
        vllm_mode="colocate",
        max_tool_calling_iterations=args.turns if args.route == "tools" else None,
    )


def train(args: argparse.Namespace, new_connection: Callable[[str], EnvConnection] | None = None,
          new_tools: Callable[[str], KernelTools] | None = None) -> GRPOTrainer:
    """Build the trainer and run `args.max_steps` steps on the server at `--env-url`, or on one served here;
    `new_connection(url)` and `new_tools(url)` open each rollout's client (tests wrap them to watch the episodes)."""
    device = resolve_device(args.device)
    tasks = select_tasks(args.tasks, args.task)
    new_connection = new_connection or (lambda url: EnvConnection(url, args.env_timeout_s))
    new_tools = new_tools or (lambda url: KernelTools(url, args.env_timeout_s))
    with contextlib.ExitStack() as stack:
        url = args.env_url
        if url is None:
            scheduler = stack.enter_context(contextlib.closing(Scheduler(device=device)))
            options = EvalOptions(device=device, timeout_s=args.eval_timeout_s, measure_performance=device == "cuda")
            app = create_server(tasks, BackendEvaluator(scheduler, options), EpisodeConfig(turns=args.turns))
            url = stack.enter_context(local_server(app))
        dataset = task_dataset(url, [t.key for t in tasks], args.env_timeout_s)
        if args.route == "tools":
            opened: list[KernelTools] = []
            stack.callback(lambda: [tools.client.close() for tools in opened])
            route: dict[str, Any] = {"environment_factory": lambda: opened.append(new_tools(url)) or opened[-1]}
        else:
            rollout = EnvironmentRollout(lambda: new_connection(url), dataset)
            stack.callback(rollout.close)
            route = {"reward_funcs": [environment_return], "rollout_func": rollout}
        trainer = GRPOTrainer(model=args.model, args=grpo_config(args, device), train_dataset=dataset, **route)
        trainer.train()
        return trainer


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    trainer = train(args)
    trainer.save_model(str(args.output_dir))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
