"""A KernelBench task, its structural check, and the selection of tasks by level, id or name.

Only the standard library is used here: tasks are loaded and checked outside the sandbox, where task code must
never run, so the check reads the code with `ast` instead of importing it.
"""

from __future__ import annotations

import ast
import fnmatch
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from drkernel.errors import UsageError

REQUIRED_NAMES = ("Model", "get_inputs", "get_init_inputs")


class TaskLoadError(UsageError):
    """A task source cannot be used; the message names every problem found and where it is."""


class TaskSelectionError(TaskLoadError):
    """A selection or a pairing matched nothing, or named something that does not exist."""


@dataclass(frozen=True)
class Task:
    """One reference problem: source code defining `Model`, `get_inputs()` and `get_init_inputs()`."""

    name: str
    code: str
    level: int | None = None
    problem_id: int | None = None
    source: str = ""  # a path, or "hub:<dataset>/<split>"

    @property
    def key(self) -> str:
        """A name that stays unique across levels, since KernelBench numbers problems per level."""
        return self.name if self.level is None else f"L{self.level}/{self.name}"

    def problems(self) -> list[str]:
        """Every structural problem of the code, each prefixed with where the task came from."""
        where = f"{self.source} [{self.key}]" if self.source else self.key
        return [f"{where}: {problem}" for problem in code_problems(self.code)]

    def check(self) -> None:
        """Raise `TaskLoadError` naming every structural problem, so a bad task fails before any evaluation."""
        problems = self.problems()
        if problems:
            raise TaskLoadError("\n".join(problems))


def code_problems(code: str) -> list[str]:
    """Why `code` is not a usable task: a syntax error (with its line), or the required names it lacks."""
    try:
        tree = ast.parse(code)
    except SyntaxError as exc:
        return [f"syntax error at line {exc.lineno}: {exc.msg}"]
    except ValueError as exc:  # e.g. null bytes in the source
        return [f"unparsable source: {exc}"]
    missing = [name for name in REQUIRED_NAMES if name not in _module_level_names(tree)]
    return [f"missing {', '.join(missing)} at module level"] if missing else []


def _module_level_names(tree: ast.Module) -> set[str]:
    """Names bound at module level, including inside module-level if/try/with blocks (they bind globals too)."""
    names: set[str] = set()
    stack: list[ast.AST] = list(tree.body)
    while stack:
        node = stack.pop()
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            names.update((alias.asname or alias.name).split(".")[0] for alias in node.names)
        elif isinstance(node, (ast.Assign, ast.AnnAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            names.update(
                sub.id
                for target in targets
                for sub in ast.walk(target)
                if isinstance(sub, ast.Name) and isinstance(sub.ctx, ast.Store)
            )
        else:
            for field in ("body", "orelse", "finalbody", "handlers"):
                stack.extend(getattr(node, field, []))
    return names


def describe_available(tasks: Sequence[Task], limit: int = 5) -> str:
    """A short list of task keys for error messages, so the user sees what the names look like."""
    if not tasks:
        return "no tasks are available"
    shown = ", ".join(task.key for task in tasks[:limit])
    more = f", ... ({len(tasks)} in all)" if len(tasks) > limit else ""
    return f"available: {shown}{more}"


def select_tasks(
    tasks: Sequence[Task],
    levels: Iterable[int] | None = None,
    ids: Iterable[int] | None = None,
    names: Iterable[str] | None = None,
) -> list[Task]:
    """The tasks in every given filter (filters combine with AND, values within one with OR), in input order.

    `ids` are problem ids within the chosen levels; `names` match a task's name or key exactly or as a glob.
    Every requested level, id and name must match something: a typo should fail loudly, not shrink a run.
    """
    selected = list(tasks)
    if levels is not None:
        wanted = set(levels)
        _require_matches("level", wanted, {task.level for task in selected}, selected)
        selected = [task for task in selected if task.level in wanted]
    if ids is not None:
        wanted_ids = set(ids)
        _require_matches("problem id", wanted_ids, {task.problem_id for task in selected}, selected)
        selected = [task for task in selected if task.problem_id in wanted_ids]
    if names is not None:
        patterns = list(names)
        unmatched = [p for p in patterns if not any(_name_matches(task, p) for task in selected)]
        if unmatched:
            listed = ", ".join(map(repr, unmatched))
            raise TaskSelectionError(f"no task matches name {listed}; {describe_available(selected)}")
        selected = [task for task in selected if any(_name_matches(task, p) for p in patterns)]
    if not selected:
        raise TaskSelectionError(f"the selection matches no task; {describe_available(tasks)}")
    return selected


def _require_matches(what: str, wanted: set[int], present: set[int | None], tasks: Sequence[Task]) -> None:
    """Raise when some requested level or id is absent from the tasks still in the selection."""
    absent = sorted(wanted - present)
    if absent:
        values = sorted(value for value in present if value is not None)
        shown = ", ".join(map(str, values)) if len(values) <= 10 else f"{values[0]}..{values[-1]}"
        raise TaskSelectionError(
            f"no task has {what} {', '.join(map(str, absent))} ({what}s present: {shown or 'none'}); "
            f"{describe_available(tasks)}"
        )


def _name_matches(task: Task, pattern: str) -> bool:
    """Exact or glob match (case-sensitive, as names are identifiers) on the task's name or key."""
    return any(fnmatch.fnmatchcase(label, pattern) for label in (task.name, task.key))
