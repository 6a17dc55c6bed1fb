"""The cold-start SFT mix of the miniature reproduction, built from the synthetic task family (docs/miniature.md).

The mix must leave each signal of the recipe something to act on, so most first answers are `partial` (correct,
about 1x, part of the work in its own kernel: what plain GRPO keeps and the profiling reward pays little),
`lazy` (hacked on a GPU) or `unfused` (correct, about 1x), few are `fused`. Single-turn rows are the agent's first
prompt and a reference solution. Two-turn rows teach what to do with feedback: a scripted model answers a task
lazily, partially, wrongly, unfused or fused, then with the fused solution (lazy -> fused, partial -> fused, wrong ->
fixed, unfused -> fused: a correct but slow kernel made fast; fused -> fused: a correct, fast kernel kept, which
the first RL policies, never shown one, mostly broke after its feedback), through the real agent loop (`drkernel
bench`'s, judged by KernelGym, so the feedback between the answers is what the judge says), and the judged second
turns are kept as `drkernel export-sft` keeps turns. Rows are `{"messages": [...]}`, the chat format TRL's SFTTrainer
reads.

Run as a script: `python -m drkernel.train.synthetic_sft --out DIR [--n-tasks 400] [--multi-turn-tasks 100]
[--single-turn partial=0.4,lazy=0.3,unfused=0.2,fused=0.1] [--first-turn lazy=0.35,partial=0.35,wrong=0.3] ...`.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
from collections import Counter
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from drkernel.agent.export import SftFilter, sft_rows
from drkernel.agent.prompts import first_turn_prompt
from drkernel.agent.replay import ChatScript, ScriptedChatServer, fenced
from drkernel.tasks.synthetic import SyntheticTask, generate
from drkernel.tasks.synthetic_solutions import GOOD_VARIANTS, WRONG_VARIANTS, solution_source, variants_for

Shares = tuple[tuple[str, float], ...]
WRONG = "wrong"  # a first answer drawn from the task's wrong_* variants
FIRST_TURN_KINDS = ("lazy", "partial", WRONG, "unfused", "fused")
FIX = "fused"  # every second answer: the wrong_* are fused ones, so wrong -> fixed; fused -> fused keeps it


@dataclass(frozen=True)
class SftMixConfig:
    """Which train-split tasks, and in what proportions each kind of answer. Tasks 1..n_tasks give single-turn
    rows; the next `multi_turn_tasks` tasks give two-turn rows, so no task is in both."""

    n_tasks: int = 400
    multi_turn_tasks: int = 100
    seed: int = 0
    shape_scale: float = 1.0
    single_turn: Shares = (("partial", 0.4), ("lazy", 0.3), ("unfused", 0.2), ("fused", 0.1))
    first_turn: Shares = (("lazy", 0.35), ("partial", 0.35), (WRONG, 0.3))  # two-turn rows, before the feedback

    def __post_init__(self) -> None:
        if self.n_tasks < 1 or self.multi_turn_tasks < 0:
            raise ValueError("n_tasks must be at least 1 and multi_turn_tasks at least 0")
        for name, shares, allowed in (("single_turn", self.single_turn, GOOD_VARIANTS),
                                      ("first_turn", self.first_turn, FIRST_TURN_KINDS)):
            variants = [variant for variant, _ in shares]
            if any(share < 0 for _, share in shares) or not sum(share for _, share in shares) > 0:
                raise ValueError(f"{name} shares must be non-negative with a positive sum")
            bad = sorted(set(variants) - set(allowed))
            if bad or len(set(variants)) != len(variants):
                raise ValueError(f"{name} takes {', '.join(allowed)}, each once; got {', '.join(variants)}")


def parse_shares(text: str) -> Shares:
    """`partial=0.4,lazy=0.3` as shares (checked by SftMixConfig)."""
    shares = []
    for item in filter(None, (part.strip() for part in text.split(","))):
        name, _, value = item.partition("=")
        try:
            shares.append((name.strip(), float(value)))
        except ValueError:
            raise ValueError(f"expected NAME=SHARE, not {item!r}") from None
    return tuple(shares)


def assign(count: int, shares: Shares, rng: random.Random) -> list[str]:
    """`count` variants in the given proportions exactly (largest remainders), in a seeded random order."""
    total = sum(share for _, share in shares)
    exact = [(variant, count * share / total) for variant, share in shares]
    counts = {variant: int(value) for variant, value in exact}
    by_remainder = sorted(exact, key=lambda item: item[1] - int(item[1]), reverse=True)
    for variant, _ in by_remainder[: count - sum(counts.values())]:
        counts[variant] += 1
    chosen = [variant for variant, _ in shares for _ in range(counts[variant])]
    rng.shuffle(chosen)
    return chosen


def mix_tasks(config: SftMixConfig) -> tuple[list[SyntheticTask], list[SyntheticTask]]:
    """The single-turn tasks and the multi-turn tasks, disjoint, from the train split."""
    tasks = generate("train", config.n_tasks + config.multi_turn_tasks, config.seed, config.shape_scale)
    return tasks[: config.n_tasks], tasks[config.n_tasks :]


def single_turn_rows(config: SftMixConfig) -> tuple[list[dict[str, Any]], Counter[str]]:
    """One conversation per task: the first prompt, then a reference solution of the assigned variant."""
    tasks, _ = mix_tasks(config)
    variants = assign(len(tasks), config.single_turn, random.Random(f"sft-single/{config.seed}"))
    rows = [
        {"messages": [{"role": "user", "content": first_turn_prompt(task.task().code)},
                      {"role": "assistant", "content": fenced(solution_source(task, variant))}]}
        for task, variant in zip(tasks, variants)
    ]
    return rows, Counter(variants)


def multi_turn_script(tasks: Sequence[SyntheticTask], config: SftMixConfig) -> tuple[ChatScript, Counter[str]]:
    """Each task answered first as its assigned kind (`wrong`: one of its wrong_* variants), then with the fused
    solution; with the count of each kind of first answer."""
    rng = random.Random(f"sft-multi/{config.seed}")
    firsts = assign(len(tasks), config.first_turn, rng)
    replies = {}
    for task, first in zip(tasks, firsts):
        if first == WRONG:
            first = rng.choice([v for v in variants_for(task.structure) if v in WRONG_VARIANTS])
        replies[task.name] = [fenced(solution_source(task, first)), fenced(solution_source(task, FIX))]
    return ChatScript(replies), Counter(firsts)


def multi_turn_rows(config: SftMixConfig, run_dir: Path, device: str = "auto"
                    ) -> tuple[list[dict[str, Any]], Counter[str]]:
    """Two-turn conversations judged by the agent loop (a bench run in `run_dir`): the kept second turns, each with
    the first answer and its real feedback before it; and the count of each kind of first answer."""
    from drkernel.agent.bench import prepare_run_dir, run_bench
    from drkernel.agent.records import read_trajectories

    _, tasks = mix_tasks(config)
    if not tasks:
        return [], Counter()
    run_dir.mkdir(parents=True, exist_ok=True)
    tasks_file = run_dir / "tasks.jsonl"
    tasks_file.write_text("".join(json.dumps({"name": t.name, "code": t.task().code, "problem_id": t.index}) + "\n"
                                  for t in tasks))
    script, firsts = multi_turn_script(tasks, config)
    with ScriptedChatServer(script) as server:
        bench = prepare_run_dir(run_dir, {"tasks": str(tasks_file), "model": "scripted", "base_url": server.url,
                                          "turns": 2, "samples": 1, "evaluation": {"device": device}},
                                resume=True)  # a build stopped at a time limit continues its judged turns
        asyncio.run(run_bench(bench, [t.task() for t in tasks], run_dir))
    second_turns = [record for record in read_trajectories(run_dir) if record.turn == 2]
    return sft_rows(second_turns, SftFilter(require_correct=True, min_speedup=None)), firsts


def build_sft_mix(config: SftMixConfig, out: Path, device: str = "auto") -> dict[str, Any]:
    """Write OUT/sft.jsonl (single- and multi-turn rows, shuffled with the seed) and OUT/mix.json (what is in it);
    the multi-turn bench run stays in OUT/multi_turn_run for `drkernel report`. A build stopped before sft.jsonl
    was written continues that run when called again with the same config."""
    if (out / "sft.jsonl").exists():
        raise FileExistsError(f"{out / 'sft.jsonl'} already exists; choose another output folder")
    single, counts = single_turn_rows(config)
    multi, firsts = multi_turn_rows(config, out / "multi_turn_run", device)
    rows = single + multi
    random.Random(f"sft-order/{config.seed}").shuffle(rows)
    out.mkdir(parents=True, exist_ok=True)
    (out / "sft.jsonl").write_text("".join(json.dumps(row) + "\n" for row in rows))
    summary = {"config": asdict(config), "single_turn": dict(counts), "first_turn": dict(firsts),
               "multi_turn_kept": len(multi), "multi_turn_asked": config.multi_turn_tasks, "rows": len(rows)}
    (out / "mix.json").write_text(json.dumps(summary, indent=1) + "\n")
    return summary


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m drkernel.train.synthetic_sft", description=__doc__.split("\n")[0])
    parser.add_argument("--out", type=Path, required=True, help="folder for sft.jsonl, mix.json and the bench run")
    parser.add_argument("--n-tasks", type=int, default=SftMixConfig.n_tasks, help="single-turn tasks")
    parser.add_argument("--multi-turn-tasks", type=int, default=SftMixConfig.multi_turn_tasks)
    parser.add_argument("--seed", type=int, default=SftMixConfig.seed)
    parser.add_argument("--shape-scale", type=float, default=SftMixConfig.shape_scale)
    parser.add_argument("--single-turn", default=None, help="shares of the single-turn answers, e.g. "
                        "partial=0.4,lazy=0.3,unfused=0.2,fused=0.1 (the default)")
    parser.add_argument("--first-turn", default=None, help="shares of the two-turn rows' first answers, of "
                        f"{', '.join(FIRST_TURN_KINDS)}, e.g. lazy=0.35,partial=0.35,wrong=0.3 (the default); the "
                        "second is always fused")
    parser.add_argument("--device", default="auto", help="where the multi-turn examples are judged")
    args = parser.parse_args(argv)
    try:
        shares = {name: parse_shares(value) for name, value in (("single_turn", args.single_turn),
                                                                ("first_turn", args.first_turn)) if value is not None}
        config = SftMixConfig(args.n_tasks, args.multi_turn_tasks, args.seed, args.shape_scale, **shares)
        summary = build_sft_mix(config, args.out, args.device)
    except (ValueError, FileExistsError) as exc:
        parser.exit(2, f"error: {exc}\n")
    print(json.dumps({key: summary[key] for key in ("single_turn", "first_turn", "multi_turn_kept", "rows")}))


if __name__ == "__main__":
    main()
