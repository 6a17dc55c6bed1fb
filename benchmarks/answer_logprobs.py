"""How likely each policy finds the answers of a bench run: what an RL run moved, read off its answers.

    python benchmarks/answer_logprobs.py RUN_DIR --policy NAME=PATH [--policy NAME=PATH ...] [--turn 1]
                                         [--limit N] [--device cpu] [--out FILE]

Issue 21 asks, when the lift is not reached, for the policy's log-probability of its rewarded answers before and
after RL. This scores every answer of one turn of a `drkernel bench` run (its prompt as the record shows it, the
answer and the end-of-turn token) under each policy (anything `hf:` takes: a folder, a GGUF, a LoRA adapter) and
reports, per answer kind (`drkernel.rl.kinds`), the mean log-probability per answer token under each policy and the
mean change from the first policy to each other one. An RL run that learnt from its rewards raises what it was paid
for and lowers what it was not, relative to the policy it started from.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from collections import defaultdict
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from drkernel.agent.local_models import load_causal_lm, load_tokenizer  # noqa: E402
from drkernel.agent.records import read_trajectories  # noqa: E402
from drkernel.rl.kinds import answer_kind  # noqa: E402


def answer_logprob(model, tokenizer, messages: list[dict[str, str]], response: str, device: str) -> float:
    """Mean log-probability per token of `response` and the end of turn after `messages`' rendered prompt."""
    prompt = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    prompt_ids = tokenizer(prompt, add_special_tokens=False)["input_ids"]
    answer_ids = tokenizer(response, add_special_tokens=False)["input_ids"] + [tokenizer.eos_token_id]
    ids = torch.tensor([prompt_ids + answer_ids], device=device)
    with torch.no_grad():
        logits = model(ids).logits[0, len(prompt_ids) - 1:-1].float()
    picked = logits.log_softmax(-1).gather(-1, ids[0, len(prompt_ids):].unsqueeze(-1))
    return picked.mean().item()


def score(run_dir: Path, policies: dict[str, str], turn: int, limit: int | None, device: str) -> dict:
    records = [r for r in read_trajectories(run_dir) if r.turn == turn and r.response]
    records = records[:limit] if limit else records
    kinds = [answer_kind(r.result).value for r in records]
    per_policy: dict[str, list[float]] = {}
    for name, path in policies.items():
        tokenizer = load_tokenizer(path)
        model = load_causal_lm(path, torch.float32).to(device).eval()
        per_policy[name] = [answer_logprob(model, tokenizer, r.messages, r.response, device) for r in records]
        del model
    first = next(iter(policies))
    groups: dict[str, list[int]] = defaultdict(list)
    for index, kind in enumerate(kinds):
        groups[kind].append(index)
    summary = {}
    for kind, indices in sorted(groups.items()):
        summary[kind] = {"answers": len(indices)}
        for name, values in per_policy.items():
            summary[kind][f"mean_logprob_{name}"] = statistics.fmean(values[i] for i in indices)
            if name != first:
                changes = [values[i] - per_policy[first][i] for i in indices]
                summary[kind][f"change_{first}_to_{name}"] = statistics.fmean(changes)
                summary[kind][f"raised_share_{name}"] = sum(c > 0 for c in changes) / len(changes)
    return {"run": str(run_dir), "turn": turn, "policies": policies, "by_kind": summary,
            "answers": [{"task": r.task, "sample": r.sample, "kind": k,
                         **{name: values[i] for name, values in per_policy.items()}}
                        for i, (r, k) in enumerate(zip(records, kinds))]}


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("run_dir", type=Path, help="a drkernel bench run folder")
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
        policies[name] = path
    figures = score(args.run_dir, policies, args.turn, args.limit, args.device)
    print(json.dumps(figures["by_kind"], indent=1))
    if args.out:
        args.out.write_text(json.dumps(figures, indent=1))
    return figures


if __name__ == "__main__":
    main()
