"""The parquet files verl's trainer reads (`data.train_files`, `data.val_files`) and the task file the drkernel
agent loop looks its samples up in, built from KernelBench levels, any task source and the synthetic family.

Why a builder: verl runs `len(train set) // train_batch_size` steps per epoch and divides by that number, so a
train set smaller than one batch fails after the first validation; and the agent loop finds a sample's task by its
key in its own task file, which must therefore hold every task the parquet files name. Nothing here imports verl,
so the files can be written on a machine without it.

    python -m drkernel.integrations.verl_dataset --out data/drkernel --tasks examples/tasks --synthetic 64
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from drkernel.agent.prompts import PromptTemplates, first_turn_prompt
from drkernel.errors import UsageError
from drkernel.tasks import Task, load_tasks
from drkernel.tasks.synthetic import generate_tasks

AGENT_LOOP = "drkernel_kernel"  # the agent loop's name in verl's registry (drkernel.integrations.verl)
DATA_SOURCE = "drkernel"
TRAIN_FILE, VAL_FILE, TASK_FILE = "train.parquet", "val.parquet", "tasks.jsonl"


def dataset_rows(tasks: Sequence[Task], templates: PromptTemplates = PromptTemplates()) -> list[dict[str, Any]]:
    """verl RL dataset rows, one per task: the first prompt (for verl's length filter; the agent loop builds its own
    from the task), the agent loop's name and the task's key (in `extra_info`, which the agent loop reads, and as
    `reward_model.ground_truth`, which verl's v1 trainer reads when it logs generations: the rewards are the agent
    loop's)."""
    return [{"data_source": DATA_SOURCE, "prompt": [{"role": "user", "content": first_turn_prompt(t.code, templates)}],
             "agent_name": AGENT_LOOP, "reward_model": {"style": DATA_SOURCE, "ground_truth": t.key},
             "extra_info": {"task": t.key, "index": i}} for i, t in enumerate(tasks)]


def write_dataset(tasks: Sequence[Task], path: str | Path, templates: PromptTemplates = PromptTemplates()) -> Path:
    """`dataset_rows` as the parquet file verl's `data.train_files` reads."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(pa.Table.from_pylist(dataset_rows(tasks, templates)), path)
    return path


@dataclass(frozen=True)
class DatasetSpec:
    """What goes into the train and validation sets."""

    task_sources: tuple[str, ...] = ()  # anything `drkernel.tasks.load_tasks` reads (hub: is KernelBench)
    levels: tuple[int, ...] = ()  # keep only these KernelBench levels of task_sources (empty: every task)
    synthetic: int = 0  # tasks of the synthetic family's train split
    synthetic_val: int = 16  # tasks of its validation split: the validation set (0: validate on the train set)
    seed: int = 0
    shape_scale: float = 1.0  # the synthetic shapes (1: sized for a datacenter GPU)
    batch_size: int = 16  # verl's data.train_batch_size: the train set must fill at least one batch

    def __post_init__(self) -> None:
        if self.synthetic < 0 or self.synthetic_val < 0:
            raise UsageError("the synthetic task counts must not be negative")
        if self.batch_size < 1:
            raise UsageError(f"the batch size must be positive, not {self.batch_size}")
        if not self.task_sources and not self.synthetic:
            raise UsageError("no tasks: give task sources (--tasks), synthetic tasks (--synthetic), or both")

    def train_tasks(self) -> list[Task]:
        tasks = []
        for source in self.task_sources:
            loaded = load_tasks(source)
            kept = [t for t in loaded if not self.levels or t.level in self.levels]
            if not kept:
                raise UsageError(f"{source}: none of its {len(loaded)} tasks is of level "
                                 f"{', '.join(map(str, self.levels))}")
            tasks += kept
        if self.synthetic:
            tasks += generate_tasks("train", self.synthetic, self.seed, self.shape_scale)
        if len(tasks) < self.batch_size:
            raise UsageError(f"{len(tasks)} train tasks do not fill one batch of {self.batch_size} prompts: verl "
                             f"would run 0 steps per epoch; add tasks (--synthetic N) or lower the batch size")
        return tasks

    def val_tasks(self, train: list[Task]) -> list[Task]:
        return generate_tasks("validation", self.synthetic_val, self.seed, self.shape_scale) if self.synthetic_val \
            else train


def build_dataset(spec: DatasetSpec, out: str | Path, templates: PromptTemplates = PromptTemplates()) -> dict[str, Path]:
    """OUT/train.parquet, OUT/val.parquet and OUT/tasks.jsonl (every task either names, in KernelBench's layout:
    the agent loop's `tasks` setting); returns their paths by name."""
    out = Path(out)
    train = spec.train_tasks()
    val = spec.val_tasks(train)
    tasks: dict[str, Task] = {}
    for task in train + val:
        if tasks.setdefault(task.key, task).code != task.code:
            raise UsageError(f"two different tasks share the key {task.key}: give each source's tasks distinct "
                             f"names or levels")
    out.mkdir(parents=True, exist_ok=True)
    task_file = out / TASK_FILE
    task_file.write_text("".join(json.dumps({"name": t.name, "code": t.code, "level": t.level,
                                             "problem_id": t.problem_id}) + "\n" for t in tasks.values()))
    return {"train": write_dataset(train, out / TRAIN_FILE, templates),
            "val": write_dataset(val, out / VAL_FILE, templates), "tasks": task_file}


def parse_spec(argv: Sequence[str] | None = None) -> tuple[DatasetSpec, Path]:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", type=Path, required=True, help="folder for train.parquet, val.parquet and tasks.jsonl")
    p.add_argument("--tasks", action="append", default=[], metavar="SPEC",
                   help="a task source (folder, .py, .jsonl, .parquet, hub: for KernelBench); repeatable")
    p.add_argument("--levels", default="", help="keep only these KernelBench levels of --tasks, e.g. 1,2")
    p.add_argument("--synthetic", type=int, default=0, help="tasks of the synthetic family's train split")
    p.add_argument("--synthetic-val", type=int, default=16,
                   help="tasks of its validation split, the validation set (0: validate on the train set)")
    p.add_argument("--seed", type=int, default=0, help="the synthetic family's seed")
    p.add_argument("--shape-scale", type=float, default=1.0, help="the synthetic shapes' scale (1/256 for a CPU)")
    p.add_argument("--batch-size", type=int, default=16, help="verl's data.train_batch_size")
    args = p.parse_args(argv)
    try:
        levels = tuple(int(level) for level in args.levels.split(",") if level)
    except ValueError:
        p.error(f"--levels takes comma-separated numbers, not {args.levels!r}")
    return DatasetSpec(tuple(args.tasks), levels, args.synthetic, args.synthetic_val, args.seed, args.shape_scale,
                       args.batch_size), args.out


def main(argv: Sequence[str] | None = None) -> int:
    spec, out = parse_spec(argv)
    paths = build_dataset(spec, out)
    print(" ".join(f"{name}={path}" for name, path in paths.items()))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
