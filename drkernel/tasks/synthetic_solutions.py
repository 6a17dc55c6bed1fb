"""Reference Triton solutions of graded quality for the synthetic tasks, generated from the task's structure.

- `fused`: one kernel computes the whole chain in one pass over memory (fast on a GPU);
- `unfused`: one kernel per op, each a pass over memory, as eager PyTorch does (about 1x);
- `partial`: PyTorch computes the chain, the expensive part included (the norm, the reduction, the matmul), but
  for its vector op (bias or gain), which a Triton kernel applies to the whole (M, N) intermediate in a pass of its
  own: correct, about 1x, and on a GPU one pass of the several the chain makes is in the candidate's own kernel
  (coverage expected between about 0.1 and 0.5: to measure, stage 0 of docs/miniature.md);
- `lazy`: PyTorch computes the chain and a Triton kernel only copies the (N,) vector it uses: correct, but on a
  GPU little of the time is in the candidate's own kernels, so the evaluator's coverage check usually calls it
  lazy (on an H100, 14 of the 16 test tasks; the two with the shortest chains gave 5-6%, over the 5% floor);
- `wrong_mask` (the last quarter of the columns, or the last k of a matmul, masked off: one column is not
  enough, a mean or a max over thousands of columns hardly notices it), `wrong_op` (the last elementwise op
  replaced by another) and, where the chain normalises, `wrong_norm` (the division by the statistic dropped):
  the fused kernel with one bug each, all incorrect.

Each source is a self-contained ModelNew module that imports torch, triton and triton.language only, written
like a plain answer (no comment gives its grade away), so the sources can serve as training targets.
"""

from __future__ import annotations

import dataclasses
import textwrap

from drkernel.tasks.synthetic import (
    ELEMENTWISE_OPS,
    MATMUL,
    NORMALISING,
    REDUCTIONS,
    VECTOR_OPS,
    Structure,
    SyntheticError,
    SyntheticTask,
    input_names,
    torch_lines,
)

GOOD_VARIANTS = ("fused", "unfused", "partial", "lazy")
WRONG_VARIANTS = ("wrong_mask", "wrong_op", "wrong_norm")
VARIANTS = GOOD_VARIANTS + WRONG_VARIANTS
# The op that replaces the last elementwise op in `wrong_op`: nonlinear, so no later norm can undo the change.
WRONG_OP_REPLACEMENT = {"sigmoid": "relu"}
DEFAULT_WRONG_OP = "sigmoid"

_ROW_MAX = 'row_max = tl.max(tl.where(mask, v, -float("inf")), axis=0)'


def variants_for(structure: Structure) -> tuple[str, ...]:
    """The variants a structure has: `wrong_norm` only where the chain divides by a row statistic."""
    return tuple(v for v in VARIANTS if v != "wrong_norm" or structure.core in NORMALISING)


def solutions(synthetic: SyntheticTask) -> dict[str, str]:
    """Every variant's ModelNew source for one task, by variant name."""
    return {variant: solution_source(synthetic, variant) for variant in variants_for(synthetic.structure)}


def solution_source(synthetic: SyntheticTask, variant: str) -> str:
    structure = synthetic.structure
    available = variants_for(structure)
    if variant not in available:
        raise SyntheticError(f"{synthetic.name} has no variant {variant!r}; it has {', '.join(available)}")
    if variant == "lazy":
        return _lazy(structure)
    if variant == "partial":
        return _partial(structure)
    if variant == "unfused":
        return _unfused(structure)
    if variant == "wrong_op":
        return _fused(_with_wrong_op(structure))
    return _fused(structure, short_mask=variant == "wrong_mask", drop_norm=variant == "wrong_norm")


def _with_wrong_op(structure: Structure) -> Structure:
    """The structure with its last elementwise op replaced, the op nearest the output so nothing can mask it."""
    fields = {"prologue": list(structure.prologue), "epilogue": list(structure.epilogue)}
    part = "epilogue" if structure.epilogue else "prologue"
    last = fields[part][-1]
    fields[part][-1] = WRONG_OP_REPLACEMENT.get(last, DEFAULT_WRONG_OP)
    return dataclasses.replace(structure, prologue=tuple(fields["prologue"]), epilogue=tuple(fields["epilogue"]))


def _op_lines(op: str, drop_norm: bool = False) -> list[str]:
    """Triton statements applying `op` to the running value `v` of one row (`mask`, `n_cols` in scope)."""
    if op in ELEMENTWISE_OPS:
        return [f"v = {ELEMENTWISE_OPS[op][1]}"]
    masked_sum = "tl.sum(tl.where(mask, {}, 0.0), axis=0)"
    norm2 = masked_sum.format("v * v")
    lines = {
        "sum": [f"v = {masked_sum.format('v')}"],
        "mean": [f"v = {masked_sum.format('v')}"] + ([] if drop_norm else ["v = v / n_cols"]),
        "max": ['v = tl.max(tl.where(mask, v, -float("inf")), axis=0)'],
        "l2norm": [f"v = tl.sqrt({norm2})"],
        "logsumexp": [_ROW_MAX, f"v = row_max + tl.log({masked_sum.format('tl.exp(v - row_max)')})"],
        "softmax": [_ROW_MAX, "v = tl.where(mask, tl.exp(v - row_max), 0.0)"]
        + ([] if drop_norm else ["v = v / tl.sum(v, axis=0)"]),
        "log_softmax": [_ROW_MAX, "v = v - row_max"]
        + ([] if drop_norm else [f"v = v - tl.log({masked_sum.format('tl.exp(v)')})"]),
        "layernorm": [f"v = tl.where(mask, v - {masked_sum.format('v')} / n_cols, 0.0)"]
        + ([] if drop_norm else ["v = v / tl.sqrt(tl.sum(v * v, axis=0) / n_cols + 1e-5)"]),
        "rmsnorm": [] if drop_norm else [f"v = v / tl.sqrt({norm2} / n_cols + 1e-6)"],
        "l2normalize": [] if drop_norm else [f"v = v / tl.maximum(tl.sqrt({norm2}), 1e-12)"],
    }
    return lines[op]


def _uses_vec(ops: tuple[str, ...]) -> bool:
    return any("vec" in ELEMENTWISE_OPS[op][1] for op in ops if op in ELEMENTWISE_OPS)


def _row_kernel(name: str, ops: tuple[str, ...], short_mask: bool = False, drop_norm: bool = False) -> str:
    """A kernel with one program per row of a contiguous (rows, n_cols) matrix applying `ops` in registers; the
    output is a row too, or one value per row after a reduction."""
    uses_vec = _uses_vec(ops)
    reduces = any(op in REDUCTIONS for op in ops)
    body = [line for op in ops for line in _op_lines(op, drop_norm)]
    store = ("tl.store(out_ptr + row, v)" if reduces
             else "tl.store(out_ptr + row * n_cols + cols, v, mask=mask)")
    lines = [
        "@triton.jit",
        f"def {name}(x_ptr, {'vec_ptr, ' if uses_vec else ''}out_ptr, n_cols, BLOCK_N: tl.constexpr):",
        "    row = tl.program_id(axis=0)",
        "    cols = tl.arange(0, BLOCK_N)",
        f"    mask = cols < {'n_cols - n_cols // 4' if short_mask else 'n_cols'}",
        "    v = tl.load(x_ptr + row * n_cols + cols, mask=mask, other=0.0)",
        *(["    vec = tl.load(vec_ptr + cols, mask=mask, other=0.0)"] if uses_vec else []),
        *(f"    {line}" for line in body),
        f"    {store}",
    ]
    return "\n".join(lines) + "\n"


def _matmul_kernel(name: str, epilogue: tuple[str, ...], short_mask: bool = False) -> str:
    """A tiled matmul of contiguous a (M, K) and w (K, N) whose epilogue ops run on the tile before its store."""
    uses_vec = _uses_vec(epilogue)
    k_limit = "K - 1" if short_mask else "K"
    lines = [
        "@triton.jit",
        f"def {name}(a_ptr, w_ptr, {'vec_ptr, ' if uses_vec else ''}out_ptr, M, N, K,",
        f"{' ' * (len(name) + 5)}BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):",
        "    rows = tl.program_id(axis=0) * BLOCK_M + tl.arange(0, BLOCK_M)",
        "    cols = tl.program_id(axis=1) * BLOCK_N + tl.arange(0, BLOCK_N)",
        "    ks = tl.arange(0, BLOCK_K)",
        "    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)",
        "    for k0 in range(0, K, BLOCK_K):",
        "        k = k0 + ks",
        "        a = tl.load(a_ptr + rows[:, None] * K + k[None, :],",
        f"                    mask=(rows[:, None] < M) & (k[None, :] < {k_limit}), other=0.0)",
        "        w = tl.load(w_ptr + k[:, None] * N + cols[None, :],",
        f"                    mask=(k[:, None] < {k_limit}) & (cols[None, :] < N), other=0.0)",
        '        acc = tl.dot(a, w, acc, input_precision="ieee")',
        "    v = acc",
        *(["    vec = tl.load(vec_ptr + cols, mask=cols < N, other=0.0)[None, :]"] if uses_vec else []),
        *(f"    {line}" for op in epilogue for line in _op_lines(op)),
        "    mask = (rows[:, None] < M) & (cols[None, :] < N)",
        "    tl.store(out_ptr + rows[:, None] * N + cols[None, :], v, mask=mask)",
    ]
    return "\n".join(lines) + "\n"


def _row_launch(kernel: str, ops: tuple[str, ...], source: str, out: str) -> list[str]:
    """Statements allocating `out` and launching a row kernel on `source` (rows, n_cols, block, warps in scope)."""
    reduces = any(op in REDUCTIONS for op in ops)
    shape = "torch.empty(rows, device=v.device, dtype=v.dtype)" if reduces else f"torch.empty_like({source})"
    vec = "vec, " if _uses_vec(ops) else ""
    return [f"{out} = {shape}",
            f"{kernel}[(rows,)]({source}, {vec}{out}, n_cols, BLOCK_N=block, num_warps=warps)"]


def _matmul_launch(kernel: str, epilogue: tuple[str, ...]) -> list[str]:
    vec = "vec, " if _uses_vec(epilogue) else ""
    return [
        "M, K = a.shape",
        "N = w.shape[1]",
        "out = torch.empty((M, N), device=a.device, dtype=a.dtype)",
        "block_m = max(16, min(64, triton.next_power_of_2(M)))",
        "block_n = max(16, min(64, triton.next_power_of_2(N)))",
        "block_k = max(16, min(32, triton.next_power_of_2(K)))",
        "grid = (triton.cdiv(M, block_m), triton.cdiv(N, block_n))",
        f"{kernel}[grid](a, w, {vec}out, M, N, K, BLOCK_M=block_m, BLOCK_N=block_n, BLOCK_K=block_k)",
    ]


_ROW_SETUP = [
    "rows, n_cols = v.shape",
    "block = triton.next_power_of_2(n_cols)",
    "warps = 8 if block >= 2048 else 4",
]


def _module(kernels: list[str], structure: Structure, body: list[str]) -> str:
    """A ModelNew module: the kernels, then a forward made of `body` that leaves its result in `v`."""
    inputs = input_names(structure)
    contiguous = [f"{name} = {name}.contiguous()" for name in inputs]
    forward = textwrap.indent("\n".join(contiguous + body + ["return v"]), " " * 8)
    header = "import torch\nimport torch.nn as nn\nimport torch.nn.functional as F\nimport triton\n"
    header += "import triton.language as tl\n"
    classes = f'''class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, {", ".join(inputs)}):
{forward}
'''
    return "\n\n".join([header] + kernels + [classes])


def _fused(structure: Structure, short_mask: bool = False, drop_norm: bool = False) -> str:
    if structure.kind == "matmul":
        kernel = _matmul_kernel("fused_kernel", structure.epilogue, short_mask)
        return _module([kernel], structure, _matmul_launch("fused_kernel", structure.epilogue) + ["v = out"])
    kernel = _row_kernel("fused_kernel", structure.steps, short_mask, drop_norm)
    body = ["v = x", *_ROW_SETUP, *_row_launch("fused_kernel", structure.steps, "x", "out"), "v = out"]
    return _module([kernel], structure, body)


def _unfused(structure: Structure) -> str:
    """One kernel, and one pass over memory, per op."""
    kernels, body = [], []
    if structure.kind == "matmul":
        kernels.append(_matmul_kernel("k0_matmul", ()))
        body += _matmul_launch("k0_matmul", ()) + ["v = out"]
    else:
        body.append("v = x")
    body += _ROW_SETUP
    for index, op in enumerate(structure.steps):
        if op == MATMUL:
            continue
        name = f"k{index}_{op}"
        kernels.append(_row_kernel(name, (op,)))
        body += _row_launch(name, (op,), "v", "out") + ["v = out"]
    return _module(kernels, structure, body)


def _partial(structure: Structure) -> str:
    """PyTorch computes the chain but its vector op, which one row kernel applies in a pass of its own."""
    lines = torch_lines(structure)  # the start (x, or the matmul), then one line per op
    at = next(index for index, op in enumerate(structure.ops) if op in VECTOR_OPS)
    op = structure.ops[at]
    kernel = f"{op}_kernel"
    body = [*lines[: at + 1], *_ROW_SETUP, *_row_launch(kernel, (op,), "v", "out"), "v = out", *lines[at + 2 :]]
    return _module([_row_kernel(kernel, (op,))], structure, body)


def _lazy(structure: Structure) -> str:
    """PyTorch computes the chain; the only Triton kernel copies the (N,) vector PyTorch then uses."""
    copy = _row_kernel("copy_kernel", ())
    body = [
        "vec_copy = torch.empty_like(vec)",
        "copy_kernel[(1,)](vec, vec_copy, vec.numel(), BLOCK_N=triton.next_power_of_2(vec.numel()))",
        *torch_lines(structure, vec="vec_copy"),
    ]
    return _module([copy], structure, body)

