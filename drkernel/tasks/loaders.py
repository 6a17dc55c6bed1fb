"""Load tasks from a .py file, a folder, a JSONL or parquet file in KernelBench's layout, or the Hugging Face hub.

Every loader checks every task's structure and reports all problems in one `TaskLoadError`, never skipping a
bad task: a run that silently evaluates fewer tasks than asked would look like a result. pyarrow and datasets are
optional and imported only by the loaders that need them.
"""

from __future__ import annotations

import importlib
import json
import re
from collections import Counter
from collections.abc import Iterable, Mapping
from pathlib import Path
from types import ModuleType
from typing import Any

from drkernel.tasks.task import Task, TaskLoadError

DEFAULT_HUB_DATASET = "ScalingIntelligence/KernelBench"
HUB_PREFIX = "hub:"

_LEVEL_NAME = re.compile(r"level_?(\d+)", re.IGNORECASE)
_LEADING_NUMBER = re.compile(r"(\d+)(?:_|$)")


def level_from_name(name: str) -> int | None:
    """The level in a folder or split name such as "level1" or "level_1", or None for any other name."""
    match = _LEVEL_NAME.fullmatch(name)
    return int(match.group(1)) if match else None


def leading_number(name: str) -> int | None:
    """The problem id KernelBench puts in front of a name ("19_ReLU" -> 19), or None without one."""
    match = _LEADING_NUMBER.match(name)
    return int(match.group(1)) if match else None


def python_files(folder: Path) -> list[tuple[Path, int | None]]:
    """The .py files of `folder` and of its level subfolders (a KernelBench checkout), with their level.

    Sorted by level, then by the number prefix, then by name, so "10_x" follows "9_x".
    """
    found = [(path, level_from_name(folder.name)) for path in folder.glob("*.py")]
    for sub in folder.iterdir():
        level = level_from_name(sub.name)
        if sub.is_dir() and level is not None:
            found.extend((path, level) for path in sub.glob("*.py"))

    def order(item: tuple[Path, int | None]) -> tuple[int, float, str]:
        path, level = item
        number = leading_number(path.stem)
        return (level or 0, float("inf") if number is None else number, path.name)

    return sorted(found, key=order)


def read_text(path: Path) -> str:
    """The file's text as UTF-8, with a `TaskLoadError` naming the file when it cannot be read."""
    try:
        return path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise TaskLoadError(f"{path}: cannot read: {exc}") from exc


def read_jsonl(path: Path) -> tuple[list[tuple[str, dict[str, Any]]], list[str]]:
    """The JSON objects of a JSONL file, each with "path:line" for messages, and the problems of bad lines."""
    rows: list[tuple[str, dict[str, Any]]] = []
    problems: list[str] = []
    # Not splitlines(): it also splits on U+2028 and friends, which JSON strings may hold unescaped.
    for number, line in enumerate(read_text(path).split("\n"), start=1):
        if not line.strip():
            continue
        where = f"{path}:{number}"
        try:
            row = json.loads(line)
        except json.JSONDecodeError as exc:
            problems.append(f"{where}: invalid JSON: {exc.msg}")
            continue
        if isinstance(row, dict):
            rows.append((where, row))
        else:
            problems.append(f"{where}: expected a JSON object, got {type(row).__name__}")
    return rows, problems


def raise_problems(problems: list[str], what: str) -> None:
    """Raise one error listing every problem, so the user can fix them all in one pass."""
    if problems:
        raise TaskLoadError(f"{len(problems)} problem(s) in {what}:\n" + "\n".join(f"  {p}" for p in problems))


def require(module: str, extra: str, purpose: str) -> ModuleType:
    """Import an optional dependency, or say which extra of drkernel provides it."""
    try:
        return importlib.import_module(module)
    except ImportError as exc:
        raise TaskLoadError(
            f"{purpose} needs the optional package '{module.split('.')[0]}': pip install 'drkernel[{extra}]'"
        ) from exc


def load_task_file(path: str | Path) -> Task:
    """One task from a .py file: name from the stem, id from its number prefix, level from a levelN parent."""
    path = Path(path)
    task = _task_from_file(path, level_from_name(path.parent.name))
    raise_problems(task.problems(), str(path))
    return task


def load_task_dir(path: str | Path) -> list[Task]:
    """Every .py file of a folder (and of its levelN subfolders) as tasks, in natural order."""
    folder = Path(path)
    if not folder.is_dir():
        raise TaskLoadError(f"{folder}: not a folder")
    files = python_files(folder)
    if not files:
        raise TaskLoadError(f"{folder}: no .py task files (nor level1/, level2/, ... subfolders holding some)")
    tasks, problems = [], []
    for file, level in files:
        try:
            task = _task_from_file(file, level)
        except TaskLoadError as exc:
            problems.append(str(exc))
            continue
        tasks.append(task)
        problems.extend(task.problems())
    return _finish(tasks, problems, str(folder))


def load_jsonl(path: str | Path) -> list[Task]:
    """Tasks from a JSONL file in the Hugging Face KernelBench layout (`code`, `name`, `level`, `problem_id`)."""
    path = Path(path)
    rows, problems = read_jsonl(path)
    tasks, row_problems = _tasks_from_rows(rows, str(path))
    return _finish(tasks, problems + row_problems, str(path))


def load_parquet(path: str | Path) -> list[Task]:
    """Tasks from a parquet file in the Hugging Face KernelBench layout (as the hub stores its splits)."""
    path = Path(path)
    parquet = require("pyarrow.parquet", "parquet", "reading parquet tasks")
    try:
        records = parquet.read_table(path).to_pylist()
    except (OSError, ValueError) as exc:  # pyarrow's errors derive from these
        raise TaskLoadError(f"{path}: cannot read parquet: {exc}") from exc
    rows = [(f"{path} row {index}", record) for index, record in enumerate(records)]
    tasks, problems = _tasks_from_rows(rows, str(path))
    return _finish(tasks, problems, str(path))


def load_hub(name: str = DEFAULT_HUB_DATASET, levels: Iterable[int] | None = None) -> list[Task]:
    """Tasks from a Hugging Face data set whose splits are named "level_1", "level_2", ... (KernelBench's layout).

    A split's level fills in rows that lack one; `levels` picks splits, and a level with no split is an error.
    """
    datasets = require("datasets", "hub", "loading tasks from the Hugging Face hub")
    dataset = datasets.load_dataset(name)
    split_levels = {split: level_from_name(split) for split in dataset}
    if levels is not None:
        wanted = set(levels)
        absent = sorted(wanted - set(split_levels.values()))
        if absent:
            missing, splits = ", ".join(map(str, absent)), ", ".join(split_levels)
            raise TaskLoadError(f"{HUB_PREFIX}{name} has no split for level {missing}; splits: {splits}")
        split_levels = {split: level for split, level in split_levels.items() if level in wanted}
    tasks, problems = [], []
    for split, level in split_levels.items():
        source = f"{HUB_PREFIX}{name}/{split}"
        rows = [(f"{source} row {index}", row) for index, row in enumerate(dataset[split])]
        split_tasks, split_problems = _tasks_from_rows(rows, source, level)
        tasks.extend(split_tasks)
        problems.extend(split_problems)
    return _finish(tasks, problems, f"{HUB_PREFIX}{name}")


def load_tasks(spec: str | Path) -> list[Task]:
    """Tasks from "hub:<dataset>" (or bare "hub:" for KernelBench), a folder, or a .py, .jsonl or .parquet file."""
    text = str(spec)
    if text.startswith(HUB_PREFIX):
        return load_hub(text[len(HUB_PREFIX) :] or DEFAULT_HUB_DATASET)
    path = Path(spec)
    if path.is_dir():
        return load_task_dir(path)
    if not path.exists():
        raise TaskLoadError(f"{path}: no such file or folder")
    loaders = {".py": lambda p: [load_task_file(p)], ".jsonl": load_jsonl, ".parquet": load_parquet}
    loader = loaders.get(path.suffix.lower())
    if loader is None:
        raise TaskLoadError(f"{path}: expected a folder, a .py, .jsonl or .parquet file, or hub:<dataset>")
    return loader(path)


def task_from_row(row: Mapping[str, Any], source: str, default_level: int | None = None) -> Task:
    """A task from one KernelBench-layout row; `level` and `problem_id` may be missing (id then from the name)."""
    code, name = row.get("code"), row.get("name")
    absent = [field for field, value in (("code", code), ("name", name)) if not isinstance(value, str) or not value]
    if absent:
        raise TaskLoadError(f"missing or empty {', '.join(absent)}")
    level = optional_int(row, "level")
    problem_id = optional_int(row, "problem_id")
    return Task(
        name=name,
        code=code,
        level=default_level if level is None else level,
        problem_id=leading_number(name) if problem_id is None else problem_id,
        source=source,
    )


def optional_int(row: Mapping[str, Any], field: str) -> int | None:
    """An integer field that may be absent or null, accepting numeric strings as some exports write them."""
    value = row.get(field)
    if value is None:
        return None
    if isinstance(value, bool) or (isinstance(value, float) and not value.is_integer()):
        raise TaskLoadError(f"{field} is not an integer: {value!r}")
    try:
        return int(value)
    except (TypeError, ValueError) as exc:
        raise TaskLoadError(f"{field} is not an integer: {value!r}") from exc


def _task_from_file(path: Path, level: int | None) -> Task:
    """A task from one .py file without checking its structure (the callers collect problems)."""
    return Task(
        name=path.stem, code=read_text(path), level=level, problem_id=leading_number(path.stem), source=str(path)
    )


def _tasks_from_rows(
    rows: Iterable[tuple[str, Mapping[str, Any]]], source: str, default_level: int | None = None
) -> tuple[list[Task], list[str]]:
    """The tasks of KernelBench-layout rows, shared by the JSONL, parquet and hub loaders, with all their problems."""
    tasks, problems = [], []
    for where, row in rows:
        try:
            task = task_from_row(row, source, default_level)
        except TaskLoadError as exc:
            problems.append(f"{where}: {exc}")
            continue
        tasks.append(task)
        problems.extend(task.problems())
    return tasks, problems


def _finish(tasks: list[Task], problems: list[str], what: str) -> list[Task]:
    """Raise on any problem, on an empty source, or on duplicate keys (results are keyed by task)."""
    duplicates = [key for key, count in Counter(task.key for task in tasks).items() if count > 1]
    problems = problems + [f"duplicate task {key}" for key in duplicates]
    raise_problems(problems, what)
    if not tasks:
        raise TaskLoadError(f"{what}: holds no tasks")
    return tasks
