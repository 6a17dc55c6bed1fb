"""Candidate kernels (sources defining `ModelNew`) and their pairing with the tasks they answer.

A candidate's code is deliberately not checked here: a candidate that does not parse or lacks `ModelNew` is a
result to grade (compile error, invalid), not a file to refuse.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from drkernel.tasks.loaders import level_from_name, optional_int, python_files, raise_problems, read_jsonl, read_text
from drkernel.tasks.task import Task, TaskLoadError, TaskSelectionError, describe_available

VARIANT_SEPARATOR = "__"
CODE_FIELDS = ("code", "kernel_code", "candidate")
TASK_FIELDS = ("task", "task_id", "name", "problem_id")

_LEVEL_AND_ID = re.compile(r"(?:L(\d+)/)?(\d+)")


@dataclass(frozen=True)
class Candidate:
    """One candidate source answering the task named by `task` (a task name, key, problem id or "L<level>/<id>")."""

    task: str
    code: str
    id: str
    source: str = ""


def load_candidates(spec: str | Path) -> list[Candidate]:
    """Candidates from a folder of `<task>.py` / `<task>__<variant>.py` files, one such .py file, or a JSONL file.

    Files in a levelN subfolder answer that level's task ("L1/<task>"). Every problem is reported at once, and
    ids must be unique because results are keyed by them.
    """
    path = Path(spec)
    if path.is_dir():
        candidates, problems = _from_folder(path)
    elif not path.exists():
        raise TaskLoadError(f"{path}: no such file or folder")
    elif path.suffix.lower() == ".jsonl":
        candidates, problems = _from_jsonl(path)
    elif path.suffix.lower() == ".py":
        candidates, problems = _from_files([(path, level_from_name(path.parent.name))])
    else:
        raise TaskLoadError(f"{path}: expected a folder of .py files, a .py file or a .jsonl file of candidates")
    duplicates = [cid for cid, count in Counter(c.id for c in candidates).items() if count > 1]
    raise_problems(problems + [f"duplicate candidate id {cid!r}" for cid in duplicates], str(path))
    if not candidates:
        raise TaskLoadError(f"{path}: holds no candidates")
    return candidates


def pair_candidates(tasks: Sequence[Task], candidates: Iterable[Candidate]) -> list[tuple[Task, Candidate]]:
    """Each candidate with its task, in task order; tasks without a candidate are left out.

    A candidate matches by task name, else by key, else by problem id ("19" or "L1/19"). A candidate that
    matches no task, or several, is an error: evaluating it against nothing or a guess would mislead.
    """
    position = {task: index for index, task in enumerate(tasks)}
    pairs: list[tuple[Task, Candidate]] = []
    problems: list[str] = []
    for candidate in candidates:
        matches = _matching_tasks(candidate.task, tasks)
        if len(matches) == 1:
            pairs.append((matches[0], candidate))
        elif not matches:
            problems.append(f"candidate {candidate.id!r} ({candidate.source}): no task {candidate.task!r}")
        else:
            keys = ", ".join(task.key for task in matches)
            problems.append(f"candidate {candidate.id!r}: {candidate.task!r} is ambiguous ({keys}); name it by key")
    if problems:
        listing = "\n".join(f"  {problem}" for problem in problems)
        raise TaskSelectionError(
            f"{len(problems)} candidate(s) match no single task:\n{listing}\n{describe_available(tasks)}"
        )
    return sorted(pairs, key=lambda pair: position[pair[0]])


def _matching_tasks(ref: str, tasks: Sequence[Task]) -> list[Task]:
    """The tasks `ref` names: by name first, then by key, then by "[L<level>/]<problem_id>"."""
    for label in ("name", "key"):
        matches = [task for task in tasks if getattr(task, label) == ref]
        if matches:
            return matches
    match = _LEVEL_AND_ID.fullmatch(ref)
    if match is None:
        return []
    level, problem_id = match.group(1), int(match.group(2))
    return [t for t in tasks if t.problem_id == problem_id and (level is None or t.level == int(level))]


def _from_folder(folder: Path) -> tuple[list[Candidate], list[str]]:
    """The candidates of a folder's .py files (and of its levelN subfolders)."""
    files = python_files(folder)
    if not files:
        raise TaskLoadError(f"{folder}: no .py candidate files")
    return _from_files(files)


def _from_files(files: Iterable[tuple[Path, int | None]]) -> tuple[list[Candidate], list[str]]:
    """Candidates named by their files: id = stem, task = the stem up to "__"; a level prefixes both."""
    candidates, problems = [], []
    for path, level in files:
        task = path.stem.split(VARIANT_SEPARATOR, 1)[0]
        if not task:
            problems.append(f"{path}: cannot tell the task from the file name (expected <task>[__<variant>].py)")
            continue
        try:
            code = read_text(path)
        except TaskLoadError as exc:
            problems.append(str(exc))
            continue
        prefix = "" if level is None else f"L{level}/"
        candidates.append(Candidate(task=prefix + task, code=code, id=prefix + path.stem, source=str(path)))
    return candidates, problems


def _from_jsonl(path: Path) -> tuple[list[Candidate], list[str]]:
    """Candidates from JSONL rows; `code` may be spelled kernel_code/candidate, `task` task_id/name/problem_id."""
    rows, problems = read_jsonl(path)
    candidates = []
    for number, (where, row) in enumerate(rows, start=1):
        try:
            candidates.append(_from_row(row, number, str(path)))
        except TaskLoadError as exc:
            problems.append(f"{where}: {exc}")
    return candidates, problems


def _from_row(row: Mapping[str, Any], number: int, source: str) -> Candidate:
    """One JSONL row; a `level` qualifies the task reference, and the id defaults to "<task>__<row number>"."""
    code = _first_present(row, CODE_FIELDS)
    if not isinstance(code, str) or not code:
        raise TaskLoadError(f"missing or empty code (one of {', '.join(CODE_FIELDS)})")
    ref = _first_present(row, TASK_FIELDS)
    if isinstance(ref, bool) or not isinstance(ref, (str, int)) or ref == "":
        raise TaskLoadError(f"missing task (one of {', '.join(TASK_FIELDS)}), got {ref!r}")
    level = optional_int(row, "level")
    task = str(ref) if level is None else f"L{level}/{ref}"
    row_id = row.get("id")
    return Candidate(
        task=task, code=code, id=f"{task}{VARIANT_SEPARATOR}{number}" if row_id is None else str(row_id), source=source
    )


def _first_present(row: Mapping[str, Any], fields: Sequence[str]) -> Any:
    """The value of the first of `fields` the row has (not null), since exports name these fields differently."""
    return next((row[field] for field in fields if row.get(field) is not None), None)
