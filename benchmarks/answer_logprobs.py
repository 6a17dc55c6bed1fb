"""How likely each policy finds the answers of a bench run: what an RL run moved, read off its answers.

    python benchmarks/answer_logprobs.py (RUN_DIR | --synthetic SPLIT:N) --policy NAME=PATH [--policy NAME=PATH ...]
                                         [--turn 1] [--limit N] [--device cpu] [--out FILE]

Issue 21 asks, when the lift is not reached, for the policy's log-probability of its rewarded answers before and
after RL. This scores every answer of one turn of a `drkernel bench` run (its prompt as the record shows it, the
answer and the end-of-turn token) under each policy (anything `hf:` takes: a folder, a GGUF, a LoRA adapter) and
reports, per answer kind (`drkernel.rl.kinds`), the log-probability per answer token and per whole answer under each
policy and the mean change from the first policy to each other one. An RL run that learnt from its rewards raises
what it was paid for and lowers what it was not, relative to the policy it started from.

`--synthetic SPLIT:N` scores, instead, the reference solutions of the first N tasks of a split of the synthetic family
(seed 0, full shapes, as the miniature's splits), one answer per variant (lazy, partial, unfused, fused; the kind is
the variant), as first answers to the agent's first prompt: how far from sampling each kind a policy is.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from drkernel.agent.local_models import load_causal_lm, load_tokenizer, locate  # noqa: E402
from drkernel.agent.prompts import first_turn_prompt  # noqa: E402
from drkernel.agent.records import read_trajectories  # noqa: E402
from drkernel.agent.replay import fenced  # noqa: E402
from drkernel.rl.kinds import answer_kind  # noqa: E402
from drkernel.tasks.synthetic import SyntheticError, generate  # noqa: E402
from drkernel.tasks.synthetic_solutions import solution_source  # noqa: E402

REFERENCE_VARIANTS = ("lazy", "partial", "unfused", "fused")


@dataclass(frozen=True)
class Answer:
    task: str
    sample: int
    kind: str
    messages: list[dict[str, str]]
    response: str


def bench_answers(run_dir: Path, turn: int) -> list[Answer]:
    """The answers of one turn of a bench run, each of the kind its verdict says."""
    return [Answer(r.task, r.sample, answer_kind(r.result).value, r.messages, r.response)
            for r in read_trajectories(run_dir) if r.turn == turn and r.response]


def reference_answers(split: str, n: int) -> list[Answer]:
    """The reference solutions of each variant for the first n tasks of a split, as first answers."""
    answers = []
    for synthetic in generate(split, n, seed=0, shape_scale=1.0):
        prompt = [{"role": "user", "content": first_turn_prompt(synthetic.task().code)}]
        answers += [Answer(synthetic.name, 0, variant, prompt, fenced(solution_source(synthetic, variant)))
                    for variant in REFERENCE_VARIANTS]
    return answers


def answer_logprob(model, tokenizer, messages: list[dict[str, str]], response: str, device: str
                   ) -> tuple[float, float]:
    """The log-probability of `response` and the end of turn after `messages`' rendered prompt: per token, and in
    all."""
    prompt = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    prompt_ids = tokenizer(prompt, add_special_tokens=False)["input_ids"]
    answer_ids = tokenizer(response, add_special_tokens=False)["input_ids"] + [tokenizer.eos_token_id]
    ids = torch.tensor([prompt_ids + answer_ids], device=device)
    with torch.no_grad():
        logits = model(ids).logits[0, len(prompt_ids) - 1:-1].float()
    picked = logits.log_softmax(-1).gather(-1, ids[0, len(prompt_ids):].unsqueeze(-1))
    return picked.mean().item(), picked.sum().item()


def score(answers: list[Answer], policies: dict[str, str], device: str) -> dict:
    per_policy: dict[str, list[tuple[float, float]]] = {}
    for name, path in policies.items():
        tokenizer = load_tokenizer(path)
        model = load_causal_lm(path, torch.float32).to(device).eval()
        per_policy[name] = [answer_logprob(model, tokenizer, a.messages, a.response, device) for a in answers]
        del model
    first = next(iter(policies))
    groups: dict[str, list[int]] = defaultdict(list)
    for index, answer in enumerate(answers):
        groups[answer.kind].append(index)
    summary = {}
    for kind, indices in sorted(groups.items()):
        summary[kind] = {"answers": len(indices)}
        for name, values in per_policy.items():
            summary[kind][f"mean_logprob_{name}"] = statistics.fmean(values[i][0] for i in indices)
            summary[kind][f"mean_answer_logprob_{name}"] = statistics.fmean(values[i][1] for i in indices)
            if name != first:
                changes = [values[i][0] - per_policy[first][i][0] for i in indices]
                summary[kind][f"change_{first}_to_{name}"] = statistics.fmean(changes)
                summary[kind][f"raised_share_{name}"] = sum(c > 0 for c in changes) / len(changes)
    return {"policies": policies, "by_kind": summary,
            "answers": [{"task": a.task, "sample": a.sample, "kind": a.kind,
                         **{name: values[i][0] for name, values in per_policy.items()},
                         **{f"{name}_answer": values[i][1] for name, values in per_policy.items()}}
                        for i, a in enumerate(answers)]}


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("run_dir", type=Path, nargs="?", help="a drkernel bench run folder")
    parser.add_argument("--synthetic", default=None, metavar="SPLIT:N",
                        help="score the reference solutions of the first N tasks of this split instead")
    parser.add_argument("--policy", action="append", required=True, metavar="NAME=PATH",
                        help="a policy to score with (the first is the baseline); repeatable")
    parser.add_argument("--turn", type=int, default=1)
    parser.add_argument("--limit", type=int, default=None, help="score only the first N answers of the turn")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--out", type=Path, default=None, help="also write the figures here as JSON")
    args = parser.parse_args(argv)
    policies = {}
    for spec in args.policy:
        name, found, path = spec.partition("=")
        if not found or not name or not path:
            parser.error(f"--policy takes NAME=PATH, not {spec!r}")
        try:
            locate(path)
        except ValueError as exc:
            parser.error(f"--policy {name}: {exc}")
        policies[name] = path
    if (args.run_dir is None) == (args.synthetic is None):
        parser.error("give a bench run folder or --synthetic SPLIT:N (one of the two)")
    if args.synthetic:
        split, found, count = args.synthetic.partition(":")
        if not found or not count.isdigit() or int(count) < 1:
            parser.error(f"--synthetic takes SPLIT:N, not {args.synthetic!r}")
        try:
            answers, source = reference_answers(split, int(count)), {"synthetic": args.synthetic}
        except SyntheticError as exc:
            parser.error(str(exc))
    else:
        if not args.run_dir.is_dir():
            parser.error(f"{args.run_dir}: no such bench run folder")
        answers, source = bench_answers(args.run_dir, args.turn), {"run": str(args.run_dir), "turn": args.turn}
        if not answers:
            parser.error(f"{args.run_dir} holds no answer at turn {args.turn}")
    answers = answers[: args.limit] if args.limit else answers
    figures = {**source, **score(answers, policies, args.device)}
    print(json.dumps(figures["by_kind"], indent=1))
    if args.out:
        args.out.write_text(json.dumps(figures, indent=1))
    return figures


if __name__ == "__main__":
    main()
