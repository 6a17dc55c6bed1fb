"""`drkernel synth`: write a split of the synthetic task family, and its reference solutions, where
`drkernel eval --tasks ... --candidates ...` reads them.

Folder format: OUT/tasks/<name>.py and OUT/solutions/<name>__<variant>.py (under levelN/ when a level is given).
JSONL format: OUT/tasks.jsonl (KernelBench's layout: name, code, level, problem_id) and OUT/solutions.jsonl
({"task", "level", "code", "id"}). Both: OUT/manifest.json, the generator's arguments and each task's structure.
"""

from __future__ import annotations

import json
from enum import Enum
from pathlib import Path
from typing import Any, Optional

import typer

from drkernel.cli.common import err
from drkernel.errors import UsageError
from drkernel.tasks.synthetic import SPLITS, SyntheticTask, generate
from drkernel.tasks.synthetic_solutions import VARIANTS, solutions


class Format(str, Enum):
    folder = "folder"
    jsonl = "jsonl"


def synth_command(
    out: Path = typer.Option(..., "--out", help="Folder to write into; it must not hold a split already."),
    split: str = typer.Option("test", "--split", help=f"One of {', '.join(SPLITS)}."),
    n: int = typer.Option(40, "--n", help="How many tasks."),
    seed: int = typer.Option(0, "--seed"),
    shape_scale: float = typer.Option(1.0, "--shape-scale", help="Multiplies every dimension (1/256 for the CPU)."),
    level: Optional[int] = typer.Option(None, "--level", help="Give the tasks this KernelBench level."),
    fmt: Format = typer.Option(Format.folder, "--format", help="Files in folders, or two JSONL files."),
    variants: str = typer.Option(",".join(VARIANTS), "--variants",
                                 help="Solutions to write, comma-separated; empty for none."),
) -> None:
    """Write a split of the synthetic task family and its graded reference solutions."""
    wanted = [v for v in variants.split(",") if v]
    unknown = sorted(set(wanted) - set(VARIANTS))
    if unknown:
        raise UsageError(f"unknown variant(s) {', '.join(unknown)}; variants: {', '.join(VARIANTS)}")
    tasks = generate(split, n, seed, shape_scale, level)
    targets = [out / "manifest.json"] + (
        [out / "tasks", out / "solutions"] if fmt is Format.folder else [out / "tasks.jsonl", out / "solutions.jsonl"])
    present = [str(path) for path in targets if path.exists()]
    if present:
        raise UsageError(f"{', '.join(present)} already exist(s); choose another --out")
    try:
        written = write_split(tasks, out, fmt, wanted)
    except OSError as exc:
        raise UsageError(f"cannot write to {out}: {exc}") from exc
    manifest = {"split": split, "n": n, "seed": seed, "shape_scale": shape_scale, "level": level,
                "variants": wanted, "tasks": [_describe(task) for task in tasks]}
    (out / "manifest.json").write_text(json.dumps(manifest, indent=1) + "\n")
    err.print(f"wrote {len(tasks)} {split} tasks and {written} solutions to {out}")


def write_split(tasks: list[SyntheticTask], out: Path, fmt: Format, variants: list[str]) -> int:
    """Write the tasks and their solutions (only the variants each task has, nothing when none is asked for);
    return how many solutions."""
    rows: list[dict[str, Any]] = []
    solution_rows: list[dict[str, Any]] = []
    for synthetic in tasks:
        task = synthetic.task()
        rows.append({"name": task.name, "code": task.code, "level": task.level, "problem_id": task.problem_id})
        for variant, code in solutions(synthetic).items():
            if variant in variants:
                solution_rows.append({"task": task.name, "level": task.level, "code": code,
                                      "id": f"{task.key}__{variant}"})
    out.mkdir(parents=True, exist_ok=True)
    outputs = [("tasks", rows, "name")] + ([("solutions", solution_rows, "id")] if solution_rows else [])
    if fmt is Format.jsonl:
        for name, items, _ in outputs:
            (out / f"{name}.jsonl").write_text("".join(json.dumps(item) + "\n" for item in items))
        return len(solution_rows)
    level = tasks[0].level
    sub = f"level{level}" if level is not None else ""
    for folder, items, stem in outputs:
        target = out / folder / sub
        target.mkdir(parents=True, exist_ok=True)
        for item in items:
            (target / f"{item[stem].rsplit('/', 1)[-1]}.py").write_text(item["code"])
    return len(solution_rows)


def _describe(synthetic: SyntheticTask) -> dict[str, Any]:
    structure, shape = synthetic.structure, synthetic.shape
    return {"name": synthetic.name, "kind": structure.kind, "steps": list(structure.steps), "key": structure.key,
            "shape": [shape.rows, shape.cols] + ([shape.inner] if shape.inner else []),
            "input_scale": synthetic.input_scale}
