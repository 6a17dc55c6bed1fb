"""A seeded family of KernelBench-style tasks where fusion pays: chains of elementwise ops, row reductions,
softmax/norm variants and a matmul with an epilogue, for the miniature reproduction of Dr. Kernel.

Every task is an op chain over a row-major matrix `x` (M, N) and a per-column vector `vec` (N,) used by one op
(bias or gain), or a matmul `a @ w` (M, K) x (K, N) followed by an epilogue. Eager PyTorch makes one pass over
memory per op; one fused kernel makes one pass in all, so on a GPU the fused solution wins by about the chain's
length (docs/miniature.md).

Splits are by structure: a chain's kind and the multiset of its ops decide its split through a hash, so no test
task is a train task with other shapes or its ops reordered, whatever the seed. The seed picks which structures
and shapes a split's list holds; the list for n tasks is the first n of the list for more.

Reference solutions of graded quality come from the same structure (drkernel.tasks.synthetic_solutions). Only
the standard library is used here, as everywhere in drkernel.tasks: tasks are built outside the sandbox.
"""

from __future__ import annotations

import hashlib
import random
from dataclasses import dataclass

from drkernel.errors import UsageError
from drkernel.tasks.task import Task

SPLITS = ("train", "validation", "test")
KINDS = ("elementwise", "norm", "reduce", "matmul")

# Elementwise ops: name -> (PyTorch expression, Triton expression) of the running value `v` (and `vec`).
UNARY_OPS: dict[str, tuple[str, str]] = {
    "relu": ("torch.relu(v)", "tl.maximum(v, 0.0)"),
    "sigmoid": ("torch.sigmoid(v)", "tl.sigmoid(v)"),
    "tanh": ("torch.tanh(v)", "2.0 * tl.sigmoid(2.0 * v) - 1.0"),
    "silu": ("F.silu(v)", "v * tl.sigmoid(v)"),
    "gelu": ('F.gelu(v, approximate="tanh")', "v * tl.sigmoid(1.5957691216057308 * (v + 0.044715 * v * v * v))"),
    "leaky_relu": ("F.leaky_relu(v, 0.1)", "tl.where(v > 0.0, v, 0.1 * v)"),
    "hardtanh": ("torch.clamp(v, -1.0, 1.0)", "tl.minimum(tl.maximum(v, -1.0), 1.0)"),
    "softplus": ("F.softplus(v)", "tl.where(v > 20.0, v, tl.log(1.0 + tl.exp(v)))"),
    "abs": ("torch.abs(v)", "tl.abs(v)"),
    "square": ("v * v", "v * v"),
    "double": ("v * 2.0", "v * 2.0"),
    "halve": ("v * 0.5", "v * 0.5"),
    "add_one": ("v + 1.0", "v + 1.0"),
    "sub_half": ("v - 0.5", "v - 0.5"),
}
VECTOR_OPS: dict[str, tuple[str, str]] = {
    "add_bias": ("v + vec", "v + vec"),
    "mul_gain": ("v * vec", "v * vec"),
}
ELEMENTWISE_OPS = {**UNARY_OPS, **VECTOR_OPS}
# Row reductions, (M, N) -> (M,), and row normalisations, (M, N) -> (M, N): name -> PyTorch expression.
REDUCTIONS: dict[str, str] = {
    "sum": "torch.sum(v, dim=1)",
    "mean": "torch.mean(v, dim=1)",
    "max": "torch.amax(v, dim=1)",
    "l2norm": "torch.sqrt(torch.sum(v * v, dim=1))",
    "logsumexp": "torch.logsumexp(v, dim=1)",
}
NORMS: dict[str, str] = {
    "softmax": "torch.softmax(v, dim=1)",
    "log_softmax": "torch.log_softmax(v, dim=1)",
    "layernorm": "F.layer_norm(v, (v.shape[1],), eps=1e-5)",
    "rmsnorm": "v * torch.rsqrt(torch.mean(v * v, dim=1, keepdim=True) + 1e-6)",
    "l2normalize": "F.normalize(v, dim=1)",
}
# Row ops whose Triton form divides by a statistic: their "missing normalisation" wrong solution drops it.
NORMALISING = frozenset({"mean", "softmax", "log_softmax", "layernorm", "rmsnorm", "l2normalize"})
MATMUL = "matmul"

# GPU shapes (shape_scale=1): large enough that a pass over memory costs far more than a launch on an H100.
ROWS = (2048, 4096, 8192)
COLS = (1000, 2048, 3000, 4096)  # not all powers of two, so that masks matter
MATMUL_MN = (2048, 4096)
MATMUL_K = (64, 128)  # a short K: the epilogue's passes over (M, N) are a large share of eager time
MIN_DIM = 8  # scaled-down shapes never go below it (the kernels pad blocks to 16 where tl.dot needs it)
INPUT_SCALES = (1.5, 2.0, 3.0)
SPLIT_BUCKETS = {"train": range(0, 7), "validation": range(7, 8), "test": range(8, 10)}
MAX_FRUITLESS_DRAWS = 20000  # draws in a row that find no new chain of the split: its chains are used up


class SyntheticError(UsageError):
    """A request the task family cannot satisfy (unknown split, too many tasks for the split's structures)."""


@dataclass(frozen=True)
class Structure:
    """An op chain: elementwise ops, then the core op (a reduction, a norm, a matmul, or none), then more ops."""

    kind: str
    prologue: tuple[str, ...] = ()
    core: str | None = None
    epilogue: tuple[str, ...] = ()

    @property
    def steps(self) -> tuple[str, ...]:
        """Every op in the order it applies."""
        return self.prologue + ((self.core,) if self.core else ()) + self.epilogue

    @property
    def ops(self) -> tuple[str, ...]:
        """The steps after the matmul, which every name and description starts from."""
        return tuple(op for op in self.steps if op != MATMUL)

    @property
    def key(self) -> str:
        """What decides the split: the kind and the multiset of ops, so reordering a chain keeps its split."""
        return f"{self.kind}:{','.join(sorted(self.steps))}"

    @property
    def split(self) -> str:
        bucket = int(hashlib.sha256(self.key.encode()).hexdigest()[:8], 16) % 10
        return next(split for split, buckets in SPLIT_BUCKETS.items() if bucket in buckets)


@dataclass(frozen=True)
class Shape:
    rows: int  # M
    cols: int  # N
    inner: int | None = None  # K, matmul only


@dataclass(frozen=True)
class SyntheticTask:
    """One generated problem: its structure, shape and input scale; `task()` gives the KernelBench source."""

    index: int  # 1-based position in its split's list
    split: str
    structure: Structure
    shape: Shape
    input_scale: float
    level: int | None = None

    @property
    def name(self) -> str:
        return f"{self.index}_{self.structure.kind}_{'_'.join(self.structure.ops)}"

    def task(self) -> Task:
        return Task(name=self.name, code=reference_source(self), level=self.level, problem_id=self.index,
                    source=f"synthetic:{self.split}")


def sample_structure(kind: str, rng: random.Random) -> Structure:
    """A random chain of `kind` with exactly one vector op, so every task has an (N,) input a lazy kernel can
    touch while PyTorch does the rest."""
    unary = sorted(UNARY_OPS)
    vector = rng.choice(sorted(VECTOR_OPS))

    def chain(length: int) -> tuple[str, ...]:
        ops = [rng.choice(unary) for _ in range(length)]
        while ops.count("square") > 1:  # squaring twice makes values too large for the tolerances to mean much
            ops[ops.index("square")] = rng.choice(unary)
        return tuple(ops)

    if kind == "elementwise":
        ops = list(chain(rng.randint(2, 4)))
        ops.insert(rng.randint(0, len(ops)), vector)
        return Structure(kind, prologue=tuple(ops))
    if kind == "reduce":
        ops = list(chain(rng.randint(1, 2)))
        ops.insert(rng.randint(0, len(ops)), vector)
        return Structure(kind, prologue=tuple(ops), core=rng.choice(sorted(REDUCTIONS)))
    if kind == "norm":
        before = chain(rng.randint(0, 2))
        return Structure(kind, prologue=before, core=rng.choice(sorted(NORMS)),
                         epilogue=(vector,) + chain(rng.randint(0, 2)))
    if kind == "matmul":
        return Structure(kind, core=MATMUL, epilogue=(vector,) + chain(rng.randint(1, 3)))
    raise SyntheticError(f"unknown kind {kind!r}; kinds: {', '.join(KINDS)}")


def sample_shape(kind: str, rng: random.Random, shape_scale: float) -> Shape:
    """A GPU-sized shape scaled by `shape_scale` (e.g. 1/256 for the CPU interpreter), never below MIN_DIM."""

    def scaled(dim: int) -> int:
        return max(MIN_DIM, round(dim * shape_scale))

    if kind == "matmul":
        return Shape(scaled(rng.choice(MATMUL_MN)), scaled(rng.choice(MATMUL_MN)), scaled(rng.choice(MATMUL_K)))
    return Shape(scaled(rng.choice(ROWS)), scaled(rng.choice(COLS)))


def generate(split: str, n: int, seed: int = 0, shape_scale: float = 1.0, level: int | None = None
             ) -> list[SyntheticTask]:
    """The first `n` tasks of `split` for `seed`: kinds in turn, distinct op chains, every one of the split."""
    if split not in SPLITS:
        raise SyntheticError(f"unknown split {split!r}; splits: {', '.join(SPLITS)}")
    if n < 1:
        raise SyntheticError(f"n must be at least 1, not {n}")
    if not shape_scale > 0:
        raise SyntheticError(f"shape_scale must be positive, not {shape_scale}")
    rng = random.Random(f"drkernel-synthetic/{seed}")
    tasks: list[SyntheticTask] = []
    seen: set[tuple[str, ...]] = set()
    fruitless = 0
    while len(tasks) < n:
        kind = KINDS[len(tasks) % len(KINDS)]
        structure = sample_structure(kind, rng)
        shape = sample_shape(kind, rng, shape_scale)
        input_scale = rng.choice(INPUT_SCALES)
        signature = (kind, *structure.steps)
        if structure.split != split or signature in seen:
            fruitless += 1
            if fruitless > MAX_FRUITLESS_DRAWS:
                raise SyntheticError(f"found only {len(tasks)} distinct {split} chains of {n} asked for")
            continue
        fruitless = 0
        seen.add(signature)
        tasks.append(SyntheticTask(len(tasks) + 1, split, structure, shape, input_scale, level))
    return tasks


def generate_tasks(split: str, n: int, seed: int = 0, shape_scale: float = 1.0, level: int | None = None
                   ) -> list[Task]:
    """`generate` as drkernel Tasks, ready for the Scheduler, `drkernel eval` or the agent loop."""
    return [synthetic.task() for synthetic in generate(split, n, seed, shape_scale, level)]


def torch_lines(structure: Structure, vec: str = "vec") -> list[str]:
    """The forward body computing the chain eagerly in PyTorch, one op a statement, on `v` (the result)."""
    lines = ["v = torch.matmul(a, w)" if structure.kind == "matmul" else "v = x"]
    for op in structure.ops:
        expression = ELEMENTWISE_OPS[op][0] if op in ELEMENTWISE_OPS else {**REDUCTIONS, **NORMS}[op]
        lines.append(f"v = {expression.replace('vec', vec)}")
    return lines


def input_names(structure: Structure) -> tuple[str, ...]:
    return ("a", "w", "vec") if structure.kind == "matmul" else ("x", "vec")


def describe(structure: Structure) -> str:
    """The chain as one line for the Model's docstring, e.g. "x -> relu -> add_bias -> softmax"."""
    start = "a @ w" if structure.kind == "matmul" else "x"
    return " -> ".join([start, *structure.ops])


def reference_source(synthetic: SyntheticTask) -> str:
    """The task's KernelBench source: Model, the shapes, get_inputs and get_init_inputs."""
    structure, shape = synthetic.structure, synthetic.shape
    body = "\n".join(f"        {line}" for line in torch_lines(structure))
    if structure.kind == "matmul":
        dims = f"M = {shape.rows}\nN = {shape.cols}\nK = {shape.inner}\n"
        inputs = f"torch.randn(M, K) * {synthetic.input_scale}, torch.randn(K, N) / K ** 0.5, torch.randn(N)"
    else:
        dims = f"M = {shape.rows}\nN = {shape.cols}\n"
        inputs = f"torch.randn(M, N) * {synthetic.input_scale}, torch.randn(N)"
    return f'''# Synthetic task {synthetic.name} ({synthetic.split} split)
import torch
import torch.nn as nn
import torch.nn.functional as F


class Model(nn.Module):
    """{describe(structure)}"""

    def __init__(self):
        super().__init__()

    def forward(self, {", ".join(input_names(structure))}):
{body}
        return v


{dims}

def get_inputs():
    return [{inputs}]


def get_init_inputs():
    return []
'''
