"""Compare candidate outputs with reference outputs.

Element-wise `isclose` with per-dtype atol/rtol (KernelBench's defaults), plus a bound on the relative error
||out - ref|| / ||ref|| so that a near-zero or all-zero answer cannot pass a loose absolute tolerance.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Callable, Iterator

import torch

from drkernel.schema import Mismatch

# dtype -> (atol, rtol, relative error bound)
TOLERANCES: dict[torch.dtype, tuple[float, float, float]] = {
    torch.float64: (1e-6, 1e-6, 1e-6),
    torch.float32: (1e-2, 1e-2, 5e-3),
    torch.float16: (1e-2, 1e-2, 1e-2),
    torch.bfloat16: (5e-2, 5e-2, 3e-2),
}
EXACT = (0.0, 0.0, 0.0)  # integer and boolean outputs must match exactly
COMPARE_CHUNK = 1 << 26  # elements compared at once (256 MB of float32 per operand)
# A reference computed on a slice of its batch stands for the whole when it gives those rows of the whole's outputs
# to within this much of their largest magnitude (other kernels for another batch size round differently; a reference
# that mixes rows, a norm over the batch, differs by far more).
SLICE_TOLERANCE = 1e-4
# Norms computed in float32 are kept between these: below, squares of tiny elements may have underflowed (zeros
# must not pass for a reference of 1e-23s); above, they overflow. Outside, both norms are computed again in float64.
PLAIN_NORMS = (1e-10, 1e18)

# Floating dtypes by precision: a candidate answering in a lower one cuts the work it was asked to do.
PRECISION_RANK = {torch.float16: 1, torch.bfloat16: 1, torch.float32: 2, torch.float64: 3}


@dataclass
class Tolerance:
    atol: float
    rtol: float
    rel_error_bound: float

    @classmethod
    def for_dtype(
        cls, dtype: torch.dtype, atol: float | None, rtol: float | None, bound: float | None
    ) -> Tolerance:
        d_atol, d_rtol, d_bound = TOLERANCES.get(dtype, EXACT if not dtype.is_floating_point else TOLERANCES[torch.float32])
        return cls(
            atol if atol is not None else d_atol,
            rtol if rtol is not None else d_rtol,
            bound if bound is not None else d_bound,
        )


@dataclass
class Comparison:
    ok: bool
    max_abs_diff: float = 0.0
    rel_error: float = 0.0
    mismatch: Mismatch | None = None
    tolerance: Tolerance | None = None
    message: str = ""


def flatten_outputs(out: Any) -> list[Any]:
    """A forward returns a tensor or a tuple/list of them: give a flat list (nested containers kept as items)."""
    if isinstance(out, (tuple, list)):
        return list(out)
    return [out]


def tensors_in(value: Any) -> Iterator[torch.Tensor]:
    """The tensors in `value`, nested in lists and tuples at any depth."""
    if isinstance(value, torch.Tensor):
        yield value
    elif isinstance(value, (list, tuple)):
        for item in value:
            yield from tensors_in(item)


def tensor_bytes(values: Any) -> int:
    """The bytes of the tensors in `values`, however deep (`tensors_in`)."""
    return sum(t.numel() * t.element_size() for t in tensors_in(values))


def compare(
    ref_out: Any,
    cand_out: Any,
    trial: int,
    atol: float | None = None,
    rtol: float | None = None,
    bound: float | None = None,
) -> Comparison:
    refs, cands = flatten_outputs(ref_out), flatten_outputs(cand_out)
    if len(refs) != len(cands) or isinstance(ref_out, torch.Tensor) != isinstance(cand_out, torch.Tensor):
        return _fail(trial, 0, [], None, None, "type", f"{len(refs)} output(s) expected, got {_describe(cand_out)}")
    worst = Comparison(ok=True)
    for index, (ref, cand) in enumerate(zip(refs, cands)):
        result = compare_tensor(ref, cand, trial, index, atol, rtol, bound)
        if not result.ok:
            return result
        worst.max_abs_diff = max(worst.max_abs_diff, result.max_abs_diff)
        worst.rel_error = max(worst.rel_error, result.rel_error)
        worst.tolerance = worst.tolerance or result.tolerance
    return worst


def compare_sample(
    ref_out: Any,
    cand_out: Any,
    trial: int,
    atol: float | None,
    rtol: float | None,
    bound: float | None,
    elements: int,
    generator: torch.Generator,
) -> Comparison:
    """`compare` on the same `elements` random positions of each output: cheap enough for every timed call, and a
    stale or remembered output differs from the right one almost everywhere. Anything but pairs of same-shape
    tensors larger than the sample is compared in full."""
    refs, cands = flatten_outputs(ref_out), flatten_outputs(cand_out)
    sampled = len(refs) == len(cands) and isinstance(ref_out, torch.Tensor) == isinstance(cand_out, torch.Tensor)
    sampled = sampled and all(
        isinstance(r, torch.Tensor) and type(c) is torch.Tensor and r.shape == c.shape and r.dtype == c.dtype
        and r.device == c.device and r.numel() > elements for r, c in zip(refs, cands))
    if not sampled:
        return compare(ref_out, cand_out, trial, atol, rtol, bound)
    picked_ref, picked_cand = [], []
    for r, c in zip(refs, cands):
        where = torch.randint(r.numel(), (elements,), generator=generator, device=r.device)
        picked_ref.append(r.detach().reshape(-1)[where])
        picked_cand.append(c.detach().reshape(-1)[where])
    return compare(picked_ref, picked_cand, trial, atol, rtol, bound)


def compare_tensor(
    ref: Any, cand: Any, trial: int, index: int, atol: float | None, rtol: float | None, bound: float | None
) -> Comparison:
    if not isinstance(ref, torch.Tensor):  # a non-tensor reference output (rare): plain equality
        ok = type(cand) is type(ref) and cand == ref
        return Comparison(ok=True) if ok else _fail(trial, index, [], None, None, "value", "non-tensor output differs")
    if type(cand) is not torch.Tensor:
        return _fail(trial, index, [], None, None, "type", f"expected a torch.Tensor, got {type(cand).__name__}")
    for reason, want, got in (
        ("shape", tuple(ref.shape), tuple(cand.shape)),
        ("dtype", ref.dtype, cand.dtype),
        ("device", ref.device.type, cand.device.type),
    ):
        if want != got:
            return _fail(trial, index, [], None, None, reason, f"{reason} {got} where the reference has {want}")
    tol = Tolerance.for_dtype(ref.dtype, atol, rtol, bound)
    if ref.numel() == 0:
        return Comparison(ok=True, tolerance=tol)
    if not ref.dtype.is_floating_point and not ref.dtype.is_complex:
        bad = (ref != cand).reshape(-1)
        if bad.any():
            first = int(bad.nonzero()[0, 0])
            return _first_bad(ref, cand, first, int(bad.sum()), trial, index, "value", tol)
        return Comparison(ok=True, tolerance=tol)
    return _compare_floating(ref.detach(), cand.detach(), tol, trial, index)


def _compare_floating(ref: torch.Tensor, cand: torch.Tensor, tol: Tolerance, trial: int, index: int) -> Comparison:
    """Compare chunk by chunk (outputs of several GB must not need several times that in memory), in float32 for
    float32 and narrower outputs. Most answers are finite and close everywhere: `_close_chunk` confirms that with
    a few passes and one synchronisation; only a chunk it cannot confirm is scanned element by element, which
    finds the first offender (about three times the passes: the comparison was most of a trial's time on the GPU)."""
    ref_flat, cand_flat = ref.reshape(-1), cand.reshape(-1)
    nonfinite, far = _Tally(), _Tally()
    max_abs, diff_sq, ref_sq = 0.0, 0.0, 0.0
    work = torch.float64 if ref.dtype == torch.float64 else torch.float32
    for start in range(0, ref_flat.numel(), COMPARE_CHUNK):
        r = ref_flat[start:start + COMPARE_CHUNK].to(work)
        c = cand_flat[start:start + COMPARE_CHUNK].to(work)
        sums = _close_chunk(r, c, tol) or _scan_chunk(r, c, tol, start, nonfinite, far)
        max_abs, diff_sq, ref_sq = max(max_abs, sums[0]), diff_sq + sums[1], ref_sq + sums[2]
    diff_norm, ref_norm = math.sqrt(diff_sq), math.sqrt(ref_sq)
    rel = diff_norm / ref_norm if ref_norm > 0 else (0.0 if diff_norm == 0 else math.inf)
    if nonfinite.first is not None:
        result = _first_bad(ref, cand, nonfinite.first, nonfinite.count, trial, index, "nonfinite", tol)
    elif far.first is not None:
        result = _first_bad(ref, cand, far.first, far.count, trial, index, "value", tol)
    elif rel > tol.rel_error_bound:
        result = _fail(trial, index, [], None, None, "rel_error",
                       f"relative error {rel:.3g} exceeds the bound {tol.rel_error_bound:g}", tol)
    else:
        return Comparison(ok=True, max_abs_diff=max_abs, rel_error=rel, tolerance=tol)
    result.max_abs_diff, result.rel_error = max_abs, min(rel, 1e300)
    return result


def _close_chunk(r: torch.Tensor, c: torch.Tensor, tol: Tolerance) -> tuple[float, float, float] | None:
    """(max |c - r|, sum of (c - r)^2, sum of r^2) when every element of the chunk is finite and within
    tolerance, else None. The test is `isclose`'s own for finite values (|c - r| <= atol + |rtol * r|, computed
    the same way, and |c - r| finite), so it accepts nothing `isclose` rejects; a NaN or infinity anywhere fails it."""
    allowed = (r * tol.rtol).abs_().add_(tol.atol)
    actual = (c - r).abs_()
    within = (actual <= allowed).all()
    del allowed
    stats = torch.stack([within.to(r.dtype), actual.max(), torch.linalg.vector_norm(actual),
                         torch.linalg.vector_norm(r)]).tolist()
    if not (stats[0] and math.isfinite(stats[1])):  # isclose also asks |c - r| to be finite: inf <= inf
        return None
    diff_plain = stats[1] == 0 or PLAIN_NORMS[0] < stats[2] < PLAIN_NORMS[1]
    if not (diff_plain and PLAIN_NORMS[0] < stats[3] < PLAIN_NORMS[1]):  # squares past float32's range, either way
        stats[2:] = (float(torch.linalg.vector_norm(actual, dtype=torch.float64)),
                     float(torch.linalg.vector_norm(r, dtype=torch.float64)))
    return stats[1], stats[2] ** 2, stats[3] ** 2


def _scan_chunk(
    r: torch.Tensor, c: torch.Tensor, tol: Tolerance, start: int, nonfinite: _Tally, far: _Tally
) -> tuple[float, float, float]:
    """Element by element: tally the non-finite answers and those outside tolerance, and the same sums as
    `_close_chunk` over the elements where both sides are finite (norms accumulated in float64)."""
    finite = torch.isfinite(r)
    nonfinite.add(finite & ~torch.isfinite(c), start)
    far.add(~torch.isclose(c, r, rtol=tol.rtol, atol=tol.atol, equal_nan=True), start)
    zero = torch.zeros((), dtype=r.dtype, device=r.device)
    diff = torch.where(finite & torch.isfinite(c), (c - r).abs(), zero)
    return (float(diff.max()), float(torch.linalg.vector_norm(diff, dtype=torch.float64)) ** 2,
            float(torch.linalg.vector_norm(torch.where(finite, r, zero), dtype=torch.float64)) ** 2)


@dataclass
class _Tally:
    """Offending elements over all chunks: how many, and the flat index of the first."""

    first: int | None = None
    count: int = 0

    def add(self, mask: torch.Tensor, start: int) -> None:
        count = int(mask.sum())
        if count and self.first is None:
            self.first = start + int(mask.nonzero()[0, 0])
        self.count += count


def _first_bad(
    ref: torch.Tensor, cand: torch.Tensor, flat: int, count: int, trial: int, index: int, reason: str, tol: Tolerance
) -> Comparison:
    where = _unravel(flat, tuple(ref.shape))
    expected, actual = float(ref.reshape(-1)[flat].item()), float(cand.reshape(-1)[flat].item())
    message = f"{count} of {ref.numel()} elements differ; first at {where}: expected {expected:.6g}, got {actual:.6g}"
    return _fail(trial, index, where, expected, actual, reason, message, tol)


def _fail(
    trial: int,
    index: int,
    where: list[int],
    expected: float | None,
    actual: float | None,
    reason: str,
    message: str,
    tol: Tolerance | None = None,
) -> Comparison:
    mismatch = Mismatch(trial=trial, output=index, index=where, expected=expected, actual=actual, reason=reason)
    return Comparison(ok=False, mismatch=mismatch, tolerance=tol, message=message)


def _unravel(flat: int, shape: tuple[int, ...]) -> list[int]:
    index = []
    for size in reversed(shape):
        index.append(flat % size)
        flat //= size
    return list(reversed(index))


def _describe(value: Any) -> str:
    if isinstance(value, (tuple, list)):
        return f"a {type(value).__name__} of {len(value)}"
    return type(value).__name__


def degeneracy(first: torch.Tensor, second: torch.Tensor) -> str | None:
    """Why a task's reference barely depends on its inputs, judged from its outputs on two random input sets."""
    a, b = first.detach().double().flatten(), second.detach().double().flatten()
    scale = float(a.abs().max()) if a.numel() else 0.0
    if scale < 1e-6:
        return f"the reference output is (near) zero for random inputs (max |out| {scale:.2g})"
    if a.shape == b.shape:
        change = float((a - b).norm() / a.norm())
        if change < 1e-3:
            return f"the reference output barely changes with its inputs (relative change {change:.2g})"
    return None


# -- precision: errors against a float64 evaluation -------------------------------------------------------------

# Unit roundoff of the arithmetic a kernel may really have used, widest first: named in precision feedback.
ARITHMETIC = (("float64", 2.0 ** -53), ("float32", 2.0 ** -24), ("tf32 or float16", 2.0 ** -11),
              ("bfloat16", 2.0 ** -8))


def errors_against(exact: Any, ref_out: Any, cand_out: Any) -> tuple[float, float, torch.dtype] | None:
    """(candidate's error, reference's error, the outputs' dtype): the largest ||x - exact|| / ||exact|| over the
    floating outputs; None when no output is floating."""
    worst: tuple[float, float, torch.dtype] | None = None
    for e, r, c in zip(flatten_outputs(exact), flatten_outputs(ref_out), flatten_outputs(cand_out)):
        if not (isinstance(e, torch.Tensor) and isinstance(r, torch.Tensor) and r.dtype.is_floating_point):
            continue
        cand_err, ref_err = relative_error(c, e), relative_error(r, e)
        if worst is None or cand_err > worst[0]:
            worst = (cand_err, ref_err, r.dtype)
    return worst


def batch_rows(inputs: list[Any], outputs: Any, fraction: float, start_at: Callable[[int], int]) -> slice | None:
    """The rows (of dimension 0) a float64 evaluation can afford when all of it cannot (`fraction` < 1 of the bytes
    it needs): a slice of the batch, where the first input, every other input that is batched like it, and every
    output have the batch as their dimension 0. None where the tensors have no such batch. `start_at(n)` draws the
    slice's first row in [0, n). Whether the reference treats rows separately is checked by the caller."""
    tensors = [t for t in inputs if isinstance(t, torch.Tensor)]
    outs = flatten_outputs(outputs)
    if not tensors or tensors[0].dim() == 0 or not all(isinstance(o, torch.Tensor) for o in outs):
        return None
    batch = tensors[0].shape[0]
    if batch < 2 or not all(o.dim() > 0 and o.shape[0] == batch for o in outs):
        return None
    rows = max(1, min(batch - 1, int(batch * fraction)))
    start = start_at(batch - rows + 1)
    return slice(start, start + rows)


def rows_of(values: Any, rows: slice, batch: int) -> Any:
    """`values` (a list of inputs, or outputs) with every tensor batched on dimension 0 cut to `rows`."""
    def cut(v: Any) -> Any:
        return v[rows] if isinstance(v, torch.Tensor) and v.dim() > 0 and v.shape[0] == batch else v

    if isinstance(values, (list, tuple)):
        return type(values)(cut(v) for v in values)
    return cut(values)


def same_rows(part: Any, whole: Any, rows: slice, batch: int) -> bool:
    """Whether outputs computed on a slice of the batch equal those rows of the outputs of the whole (to float
    rounding): the reference treats its rows separately, and a slice stands for the whole."""
    for p, w in zip(flatten_outputs(part), flatten_outputs(rows_of(whole, rows, batch))):
        if not (isinstance(p, torch.Tensor) and isinstance(w, torch.Tensor)) or p.shape != w.shape:
            return False
        if p.dtype.is_floating_point and p.numel():
            scale = float(w.detach().abs().max())
            if not float((p.detach().double() - w.detach().double()).abs().max()) <= SLICE_TOLERANCE * scale:
                return False
        elif not torch.equal(p, w):
            return False
    return len(flatten_outputs(part)) == len(flatten_outputs(whole))


def relative_error(value: torch.Tensor, exact: torch.Tensor) -> float:
    """||value - exact|| / ||exact|| in float64, chunk by chunk (outputs of several GB)."""
    v, e = value.detach().reshape(-1), exact.detach().reshape(-1)
    diff_sq = ref_sq = 0.0
    for start in range(0, e.numel(), COMPARE_CHUNK):
        ec = e[start:start + COMPARE_CHUNK].to(torch.float64)
        vc = v[start:start + COMPARE_CHUNK].to(torch.float64)
        diff_sq += float(torch.linalg.vector_norm(vc - ec)) ** 2
        ref_sq += float(torch.linalg.vector_norm(ec)) ** 2
    if ref_sq == 0:
        return 0.0 if diff_sq == 0 else math.inf
    return math.sqrt(diff_sq / ref_sq)


def bits(error: float) -> float:
    """Correct bits that a relative error leaves."""
    return -math.log2(error) if error > 0 else 53.0


def arithmetic_like(error: float) -> str:
    """The arithmetic whose roundoff lies nearest an error of this size (on a log scale: the boundaries are the
    geometric means of neighbouring roundoffs; past bfloat16's by 8x, worse than it)."""
    for (name, roundoff), (_, narrower) in zip(ARITHMETIC, ARITHMETIC[1:] + (("", ARITHMETIC[-1][1] * 64),)):
        if error <= math.sqrt(roundoff * narrower):
            return name
    return "worse than bfloat16"
