"""Source-level hints about a candidate, read from its AST.

These support the runtime evidence (guards.py) and explain it; on their own they are notes, never a verdict,
because legitimate code can contain the same constructs (a dropout that checks `self.training`, say).
"""

from __future__ import annotations

import ast
from dataclasses import dataclass, field

MODE_QUERIES = {"training", "is_grad_enabled", "is_inference_mode_enabled", "is_current_stream_capturing",
                "is_scripting", "is_compiling"}
ESCAPE_MODULES = {"threading", "multiprocessing", "subprocess", "concurrent", "ctypes", "gc", "inspect", "signal",
                  "socket", "pickle", "shelve"}


@dataclass
class SourceHints:
    uses_reference_model: list[str] = field(default_factory=list)
    fallback_handlers: list[int] = field(default_factory=list)  # lines of `except` blocks that compute with torch
    mode_queries: list[str] = field(default_factory=list)
    escape_imports: list[str] = field(default_factory=list)
    uses_torch_compile: bool = False
    triton_kernels: list[str] = field(default_factory=list)
    parsed: bool = True  # False: the source is not valid Python, and its compile error says so; no hint applies

    def notes(self) -> list[str]:
        notes: list[str] = []
        if not self.parsed:
            return notes
        if self.uses_reference_model:
            notes.append(f"source refers to the reference Model ({', '.join(self.uses_reference_model)})")
        if self.fallback_handlers:
            notes.append(f"source has except blocks that compute with torch (lines {self.fallback_handlers})")
        if self.mode_queries:
            notes.append(f"source branches on execution mode ({', '.join(sorted(set(self.mode_queries)))})")
        if self.escape_imports:
            notes.append(f"source imports {', '.join(sorted(set(self.escape_imports)))}")
        if self.uses_torch_compile:
            notes.append("source calls torch.compile: kernels it generates are not the candidate's own")
        if not self.triton_kernels:
            notes.append("source defines no @triton.jit kernel")
        return notes


def inspect_source(source: str) -> SourceHints:
    hints = SourceHints()
    try:
        tree = ast.parse(source)
    except SyntaxError:
        hints.parsed = False
        return hints
    defines_model = any(isinstance(n, ast.ClassDef) and n.name == "Model" for n in tree.body)
    for node in ast.walk(tree):
        if isinstance(node, ast.ClassDef):
            if node.name == "ModelNew" and any(_name(base) == "Model" for base in node.bases):
                hints.uses_reference_model.append("ModelNew inherits Model")
            if node.name == "Model":
                hints.uses_reference_model.append("defines its own Model")
        elif isinstance(node, ast.Call) and _name(node.func) == "Model" and not defines_model:
            hints.uses_reference_model.append(f"instantiates Model (line {node.lineno})")
        elif isinstance(node, ast.ExceptHandler) and _computes_with_torch(node.body):
            hints.fallback_handlers.append(node.lineno)
        elif isinstance(node, ast.Attribute) and node.attr in MODE_QUERIES:
            hints.mode_queries.append(node.attr)
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else [node.module or ""]
            hints.escape_imports += [n.split(".")[0] for n in names if n.split(".")[0] in ESCAPE_MODULES]
        elif isinstance(node, ast.FunctionDef) and any(_is_triton_jit(d) for d in node.decorator_list):
            hints.triton_kernels.append(node.name)
        if isinstance(node, ast.Attribute) and node.attr == "compile" and _name(node.value) == "torch":
            hints.uses_torch_compile = True
    return hints


def _name(node: ast.AST) -> str:
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        return node.attr
    return ""


def _is_triton_jit(node: ast.AST) -> bool:
    target = node.func if isinstance(node, ast.Call) else node
    return isinstance(target, ast.Attribute) and target.attr == "jit" or _name(target) in {"jit", "autotune",
                                                                                            "heuristics"}


def _computes_with_torch(body: list[ast.stmt]) -> bool:
    for stmt in body:
        for node in ast.walk(stmt):
            if isinstance(node, ast.Call):
                func = node.func
                root = func
                while isinstance(root, ast.Attribute):
                    root = root.value
                if isinstance(root, ast.Name) and root.id in {"torch", "F", "nn"}:
                    return True
                if isinstance(func, ast.Attribute) and func.attr in {"forward", "matmul", "mm", "relu", "softmax"}:
                    return True
    return False
