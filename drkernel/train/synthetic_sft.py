"""The cold-start SFT mix of the miniature reproduction, built from the synthetic task family (docs/experiments.md).

The mix must leave RL room to improve, so most answers are `unfused` (correct, about 1x) or `lazy` (correct on a
CPU, flagged lazy on a GPU), few are `fused`. Single-turn rows are the agent's first prompt and a reference
solution. Multi-turn rows show feedback: a scripted model answers a task with a wrong solution, then with a correct
one, through the real agent loop (`drkernel bench`'s, judged by KernelGym), and the judged second turns are kept as
`drkernel export-sft` keeps turns. Rows are `{"messages": [...]}`, the chat format TRL's SFTTrainer reads.

Run as a script: `python -m drkernel.train.synthetic_sft --out DIR [--n-tasks 400] [--multi-turn-tasks 100] ...`.
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
from drkernel.tasks.synthetic_solutions import WRONG_VARIANTS, solution_source, variants_for

Shares = tuple[tuple[str, float], ...]


@dataclass(frozen=True)
class SftMixConfig:
    """Which train-split tasks, and in what proportions each kind of answer. Tasks 1..n_tasks give single-turn
    rows; the next `multi_turn_tasks` tasks give two-turn rows, so no task is in both."""

    n_tasks: int = 400
    multi_turn_tasks: int = 100
    seed: int = 0
    shape_scale: float = 1.0
    single_turn: Shares = (("unfused", 0.5), ("lazy", 0.35), ("fused", 0.15))
    second_turn: Shares = (("unfused", 0.8), ("fused", 0.2))  # correct answers after the wrong first turn

    def __post_init__(self) -> None:
        if self.n_tasks < 1 or self.multi_turn_tasks < 0:
            raise ValueError("n_tasks must be at least 1 and multi_turn_tasks at least 0")
        for name, shares in (("single_turn", self.single_turn), ("second_turn", self.second_turn)):
            variants = [variant for variant, _ in shares]
            if any(share < 0 for _, share in shares) or not sum(share for _, share in shares) > 0:
                raise ValueError(f"{name} shares must be non-negative with a positive sum")
            bad = sorted(set(variants) - {"fused", "unfused", "lazy"})
            if bad or len(set(variants)) != len(variants):
                raise ValueError(f"{name} takes fused, unfused and lazy, each once; got {', '.join(variants)}")
        if "lazy" in dict(self.second_turn):
            raise ValueError("second_turn cannot use lazy: a GPU judges it hacked, and hacked turns are not kept")


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


def multi_turn_script(tasks: Sequence[SyntheticTask], config: SftMixConfig) -> ChatScript:
    """Each task answered first with one of its wrong solutions, then with a correct one."""
    rng = random.Random(f"sft-multi/{config.seed}")
    fixes = assign(len(tasks), config.second_turn, rng)
    replies = {}
    for task, fix in zip(tasks, fixes):
        wrong = rng.choice([v for v in variants_for(task.structure) if v in WRONG_VARIANTS])
        replies[task.name] = [fenced(solution_source(task, wrong)), fenced(solution_source(task, fix))]
    return ChatScript(replies)


def multi_turn_rows(config: SftMixConfig, run_dir: Path, device: str = "auto") -> list[dict[str, Any]]:
    """Two-turn conversations judged by the agent loop (a bench run in `run_dir`): the kept second turns, each with
    the wrong first answer and its real feedback before it."""
    from drkernel.agent.bench import prepare_run_dir, run_bench
    from drkernel.agent.records import read_trajectories

    _, tasks = mix_tasks(config)
    if not tasks:
        return []
    run_dir.mkdir(parents=True, exist_ok=True)
    tasks_file = run_dir / "tasks.jsonl"
    tasks_file.write_text("".join(json.dumps({"name": t.name, "code": t.task().code, "problem_id": t.index}) + "\n"
                                  for t in tasks))
    with ScriptedChatServer(multi_turn_script(tasks, config)) as server:
        bench = prepare_run_dir(run_dir, {"tasks": str(tasks_file), "model": "scripted", "base_url": server.url,
                                          "turns": 2, "samples": 1, "evaluation": {"device": device}},
                                resume=False)
        asyncio.run(run_bench(bench, [t.task() for t in tasks], run_dir))
    second_turns = [record for record in read_trajectories(run_dir) if record.turn == 2]
    return sft_rows(second_turns, SftFilter(require_correct=True, min_speedup=None))


def build_sft_mix(config: SftMixConfig, out: Path, device: str = "auto") -> dict[str, Any]:
    """Write OUT/sft.jsonl (single- and multi-turn rows, shuffled with the seed) and OUT/mix.json (what is in it);
    the multi-turn bench run stays in OUT/multi_turn_run for `drkernel report`."""
    if (out / "sft.jsonl").exists():
        raise FileExistsError(f"{out / 'sft.jsonl'} already exists; choose another output folder")
    single, counts = single_turn_rows(config)
    multi = multi_turn_rows(config, out / "multi_turn_run", device)
    rows = single + multi
    random.Random(f"sft-order/{config.seed}").shuffle(rows)
    out.mkdir(parents=True, exist_ok=True)
    (out / "sft.jsonl").write_text("".join(json.dumps(row) + "\n" for row in rows))
    summary = {"config": asdict(config), "single_turn": dict(counts), "multi_turn_kept": len(multi),
               "multi_turn_asked": config.multi_turn_tasks, "rows": len(rows)}
    (out / "mix.json").write_text(json.dumps(summary, indent=1) + "\n")
    return summary


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m drkernel.train.synthetic_sft", description=__doc__.split("\n")[0])
    parser.add_argument("--out", type=Path, required=True, help="folder for sft.jsonl, mix.json and the bench run")
    parser.add_argument("--n-tasks", type=int, default=SftMixConfig.n_tasks, help="single-turn tasks")
    parser.add_argument("--multi-turn-tasks", type=int, default=SftMixConfig.multi_turn_tasks)
    parser.add_argument("--seed", type=int, default=SftMixConfig.seed)
    parser.add_argument("--shape-scale", type=float, default=SftMixConfig.shape_scale)
    parser.add_argument("--device", default="auto", help="where the multi-turn examples are judged")
    args = parser.parse_args(argv)
    try:
        config = SftMixConfig(args.n_tasks, args.multi_turn_tasks, args.seed, args.shape_scale)
        summary = build_sft_mix(config, args.out, args.device)
    except (ValueError, FileExistsError) as exc:
        parser.exit(2, f"error: {exc}\n")
    print(json.dumps({key: summary[key] for key in ("single_turn", "multi_turn_kept", "rows")}))


if __name__ == "__main__":
    main()
