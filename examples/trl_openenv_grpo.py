"""TRL's GRPOTrainer training a policy on drkernel's OpenEnv environment (`drkernel.integrations.openenv`).

    python examples/trl_openenv_grpo.py --model PATH [--tasks examples/tasks] [--env-url http://HOST:8000]

Every episode goes through openenv-core's client: to a server at `--env-url` (drkernel.integrations.openenv's
`create_server`, run elsewhere), or else to one this script serves on the loopback, judging on the embedded
scheduler. `reset(task=KEY)` gives the first chat, each `step(KernelAction(answer))` judges one answer with
drkernel's verdicts and gives the next turn's chat, `done` after the episode's last turn (`--turns`, 3 as the paper
trains, for the script's own server; the server's own setting behind `--env-url`).

TRL 1.16 offers two ways to put an environment under GRPOTrainer. `environment_factory` exposes the environment's
methods as tools that the model must call in its chat template's tool-call syntax; drkernel's environment takes a
whole answer (a ModelNew in a python block, as its prompts ask), so this example uses the other one, `rollout_func`
(experimental in TRL), which is multi-turn:

- each turn's answers are sampled by TRL's own per-turn sampler (`GRPOTrainer._generate_single_turn`, the one its
  tool-calling loop uses: transformers `generate` or vLLM, with the trainer's sampling settings; a private method,
  so this is pinned to TRL 1.16), `--max-completion-length` tokens at most per turn;
- every answer goes to the environment, which judges it; the tokens that the next turn's chat adds (the end of the
  answer, the feedback, the opening of the next answer) join the completion with env_mask 0, so the loss skips them;
  this needs a chat template that renders earlier turns verbatim (ChatML does) and the environment's `full` context
  policy (its default), and is refused otherwise (`drkernel train` lays out its own rollouts the same way);
- GRPO takes one reward per completion: here the episode's return, the sum of the rewards the environment gave its
  turns. Per-turn credit (TRLOO, the paper's), PRS, MRS and the void-turn rule are in `drkernel train`, not here.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
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
from drkernel.integrations.openenv import EpisodeConfig, KernelAction, KernelEnvClient, KernelObservation, create_server
from drkernel.runner.devices import resolve_device
from drkernel.scheduling.scheduler import Scheduler
from drkernel.schema import EvalOptions
from drkernel.tasks import Task, load_task_dir

T = TypeVar("T")


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
    text: str  # the rendered prompt and completion so far, which the next turn's chat must extend
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
    queue orders the work). One event loop for the whole run, because a client's WebSocket belongs to the loop that
    opened it.
    """

    def __init__(self, new_connection: Callable[[], EnvConnection]) -> None:
        self.new_connection = new_connection
        self.connections: list[EnvConnection] = []
        self.task_of: dict[str, str] = {}  # the first chat (as JSON) -> its task's key
        self.loop = asyncio.new_event_loop()

    def dataset(self, keys: Sequence[str]) -> Dataset:
        """One row per task: the first chat, as the environment gives it, in TRL's conversational `prompt`."""
        self._grow(1)
        rows = []
        for key in keys:
            messages = self.loop.run_until_complete(self.connections[0].reset(key)).messages
            self.task_of[_prompt_key(messages)] = key
            rows.append({"prompt": messages})
        return Dataset.from_list(rows)

    def __call__(self, prompts: list[list[dict[str, str]]], trainer: GRPOTrainer) -> dict[str, Any]:
        tokenizer = trainer.processing_class
        keys = []
        for prompt in prompts:
            if _prompt_key(prompt) not in self.task_of:
                raise KeyError("a prompt that is no task's first chat reached the rollout")
            keys.append(self.task_of[_prompt_key(prompt)])
        self._grow(len(prompts))
        connections = self.connections[: len(prompts)]
        first = self.loop.run_until_complete(_gather(c.reset(k) for c, k in zip(connections, keys)))
        episodes = []
        for key, prompt, observation in zip(keys, prompts, first):
            if observation.messages != prompt:
                raise RuntimeError(f"the environment's first chat for {key} changed since the dataset was built")
            text = self._render(trainer, observation.messages)
            episodes.append(Episode(key, tokenizer(text, add_special_tokens=False)["input_ids"], text))
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
                episode.text += _decode(tokenizer, ids)
                spoken = ids[:-1] if ids and ids[-1] in trainer.eos_token_ids else ids  # the answer, less its end
                responses.append(_decode(tokenizer, spoken))
            steps = _gather(connections[i].step(r) for i, r in zip(live, responses))
            for i, observation in zip(live, self.loop.run_until_complete(steps)):
                self._take(trainer, episodes[i], observation)
        with_logprobs = all(e.logprobs is not None for e in episodes)
        return {
            "prompt_ids": [e.prompt_ids for e in episodes],
            "completion_ids": [e.completion_ids for e in episodes],
            "logprobs": [e.logprobs for e in episodes] if with_logprobs else None,
            "env_mask": [e.env_mask for e in episodes],
            "env_return": [sum(e.rewards) for e in episodes],
        }

    def _take(self, trainer: GRPOTrainer, episode: Episode, observation: KernelObservation) -> None:
        """Record a judged turn; unless the episode is done, append what the next turn's chat adds as env tokens."""
        if observation.reward is None:
            raise RuntimeError(f"the environment judged an answer for {episode.task} without a reward")
        episode.rewards.append(float(observation.reward))
        episode.done = observation.done
        if episode.done:
            return
        text = self._render(trainer, observation.messages)
        if not text.startswith(episode.text):
            raise ValueError(
                "the next turn's chat, rendered, does not extend the previous prompt plus the answer, so the turns "
                "cannot be trained as one sequence: use the environment's `full` context policy and a chat template "
                "that renders earlier assistant messages verbatim (ChatML does; templates that strip reasoning do not)"
            )
        ids = trainer.processing_class(text[len(episode.text):], add_special_tokens=False)["input_ids"]
        episode.completion_ids += ids
        episode.env_mask += [0] * len(ids)
        if episode.logprobs is not None:
            episode.logprobs += [0.0] * len(ids)
        episode.text = text

    @staticmethod
    def _render(trainer: GRPOTrainer, messages: list[dict[str, str]]) -> str:
        return trainer.processing_class.apply_chat_template(
            messages, tokenize=False, add_generation_prompt=True, **trainer.chat_template_kwargs)

    def _grow(self, count: int) -> None:
        while len(self.connections) < count:
            self.connections.append(self.new_connection())

    def close(self) -> None:
        self.loop.run_until_complete(_gather(c.close() for c in self.connections))
        self.loop.close()


def environment_return(completions: list[Any], env_return: list[float], **_: Any) -> list[float]:
    """GRPO's reward: the episode's return, the sum of the rewards the environment gave its turns."""
    return [float(r) for r in env_return]


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", required=True, help="a causal LM folder or hub id, loaded by from_pretrained")
    p.add_argument("--tasks", type=Path, default=Path("examples/tasks"),
                   help="task folder; behind --env-url, the tasks to ask the server for (its set must hold them)")
    p.add_argument("--task", action="append", default=[], metavar="KEY", help="train on this task only (repeatable)")
    p.add_argument("--device", choices=("auto", "cpu", "cuda"), default="auto",
                   help="where the policy trains and the server served here judges")
    p.add_argument("--env-url", help="a drkernel OpenEnv server to use instead of serving one here")
    p.add_argument("--env-timeout-s", type=float, default=600.0, help="how long to wait for the server's answer")
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
    )


def train(args: argparse.Namespace, new_connection: Callable[[str], EnvConnection] | None = None) -> GRPOTrainer:
    """Build the trainer and run `args.max_steps` steps on the server at `--env-url`, or on one served here;
    `new_connection(url)` opens each connection (tests wrap them to watch the episodes)."""
    device = resolve_device(args.device)
    tasks = select_tasks(args.tasks, args.task)
    new_connection = new_connection or (lambda url: EnvConnection(url, args.env_timeout_s))
    with contextlib.ExitStack() as stack:
        url = args.env_url
        if url is None:
            scheduler = stack.enter_context(contextlib.closing(Scheduler(device=device)))
            options = EvalOptions(device=device, timeout_s=args.eval_timeout_s, measure_performance=device == "cuda")
            app = create_server(tasks, BackendEvaluator(scheduler, options), EpisodeConfig(turns=args.turns))
            url = stack.enter_context(local_server(app))
        rollout = EnvironmentRollout(lambda: new_connection(url))
        stack.callback(rollout.close)
        trainer = GRPOTrainer(
            model=args.model,
            reward_funcs=[environment_return],
            args=grpo_config(args, device),
            train_dataset=rollout.dataset([t.key for t in tasks]),
            rollout_func=rollout,
        )
        trainer.train()
        return trainer


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    trainer = train(args)
    trainer.save_model(str(args.output_dir))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
