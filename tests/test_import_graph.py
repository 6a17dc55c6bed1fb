"""The package's import graph: imports go one way (tasks -> sandbox -> runner -> scheduling/service; cli on top)."""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parent.parent / "drkernel"


def _module(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def module_level_imports() -> dict[str, set[str]]:
    """drkernel module -> the drkernel modules it imports when it loads (imports inside functions wait, so they
    cannot close a circle at load time)."""
    modules = {_module(p): p for p in PACKAGE.rglob("*.py")}
    graph: dict[str, set[str]] = {}
    for name, path in modules.items():
        targets: set[str] = set()
        for node in ast.parse(path.read_text()).body:  # the module's own statements, not function bodies
            if isinstance(node, ast.Import):
                targets.update(alias.name for alias in node.names)
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                targets.update(f"{node.module}.{alias.name}" for alias in node.names)
                targets.add(node.module)
        graph[name] = {t for t in targets if t in modules and t != name}
    return graph


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    path: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        path.append(node)
        for target in sorted(graph[node]):
            if state.get(target) == 1:
                return path[path.index(target):] + [target]
            if target not in state and (cycle := visit(target)):
                return cycle
        state[node] = 2
        path.pop()
        return None

    for node in sorted(graph):
        if node not in state and (cycle := visit(node)):
            return cycle
    return None


def test_find_cycle_finds_one():
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b"}, "b": set()}) is None


def test_drkernel_imports_have_no_circle():
    # a package's __init__ importing its own submodules is not a circle of modules; leave those edges out
    graph = {m: {t for t in ts if not m.startswith(t + ".")} for m, ts in module_level_imports().items()}
    assert find_cycle(graph) is None


def test_hack_reasons_have_one_home():
    """guards' reason constants are HackReason's values, and the schema imports only the standard library and
    drkernel.errors, which imports nothing."""
    from drkernel.sandbox import guards
    from drkernel.schema import HackReason

    for reason in HackReason:
        assert getattr(guards, reason.name) == reason.value
    graph = module_level_imports()
    assert graph["drkernel.schema"] == {"drkernel.errors"} and not graph["drkernel.errors"]
