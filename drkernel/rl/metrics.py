"""Evaluation metrics: Fast@p (single- and multi-turn), pass@k and the geometric-mean speedup.

A missing speedup (None, NaN: performance not measured) never counts as fast for p > 0, and incorrect samples never
count whatever speedup they report, so a hacked kernel cannot inflate a metric. p = 0 is KernelBench's fast_0, the
correct rate: every correct sample counts, measured or not.
Scalar summaries are returned as Python floats, per-turn and per-problem ones as float64 tensors.
"""

from __future__ import annotations

import math
import numbers

import torch

from drkernel.rl.advantages import ArrayLike, _bool_tensor, _float_tensor


def _fast(speedups: ArrayLike, correct: ArrayLike, p: float, ndim: int) -> torch.Tensor:
    """Bool tensor: correct and speedup >= p (NaN compares False; p = 0 is correct alone), shapes and p checked."""
    if not p >= 0:
        raise ValueError(f"p must be 0 or more, not {p!r}")
    s = _float_tensor(speedups, "speedups")
    ok = _bool_tensor(correct, "correct").to(s.device)
    if s.ndim != ndim or s.shape != ok.shape:
        raise ValueError(
            f"speedups and correct must share one {ndim}-D shape, not {tuple(s.shape)}, {tuple(ok.shape)}"
        )
    if s.numel() == 0:
        raise ValueError("no samples")
    return ok if p == 0 else ok & (s >= p)


def _turn_mask(turn_mask: ArrayLike | None, fast: torch.Tensor) -> torch.Tensor:
    if turn_mask is None:
        return torch.ones_like(fast)
    valid = _bool_tensor(turn_mask, "turn_mask").to(fast.device)
    if valid.shape != fast.shape:
        raise ValueError(f"turn_mask must have shape {tuple(fast.shape)}, not {tuple(valid.shape)}")
    return valid


def fast_p(speedups: ArrayLike, correct: ArrayLike, p: float) -> float:
    """Fast@p: share of ALL [N] samples that are correct with speedup >= p (KernelBench's fast_p; p = 0 is the correct rate)."""
    return _fast(speedups, correct, p, ndim=1).double().mean().item()


def fast_p_per_turn(
    speedups: ArrayLike, correct: ArrayLike, p: float, turn_mask: ArrayLike | None = None
) -> torch.Tensor:
    """[T] Fast@p of each turn over the trajectories that reached it (`turn_mask` [N, T]); NaN for an empty turn."""
    fast = _fast(speedups, correct, p, ndim=2)
    valid = _turn_mask(turn_mask, fast)
    return (fast & valid).sum(0).double() / valid.sum(0).double()


def last_turn_fast(
    speedups: ArrayLike, correct: ArrayLike, p: float, turn_mask: ArrayLike | None = None
) -> torch.Tensor:
    """[N, T] bool: with a budget of t turns, the trajectory's last valid turn <= t is correct and fast (no valid turn
    yet: not fast). The per-trajectory hits whose mean is `fast_p_last_turn`, for intervals over tasks."""
    fast = _fast(speedups, correct, p, ndim=2)
    valid = _turn_mask(turn_mask, fast)
    turns = torch.arange(fast.shape[1], device=fast.device).expand_as(fast)
    last = torch.where(valid, turns, -1).cummax(1).values
    return fast.gather(1, last.clamp(min=0)) & (last >= 0)


def fast_p_last_turn(
    speedups: ArrayLike, correct: ArrayLike, p: float, turn_mask: ArrayLike | None = None
) -> float:
    """Fast@p of each trajectory's last valid turn, over all N trajectories (one with no valid turn is not fast)."""
    return last_turn_fast(speedups, correct, p, turn_mask)[:, -1].double().mean().item()


def best_of_history_fast(
    speedups: ArrayLike, correct: ArrayLike, p: float, turn_mask: ArrayLike | None = None
) -> torch.Tensor:
    """[N, T] bool: some valid turn <= t of the trajectory is correct and fast (`fast_p_best_of_history`'s hits)."""
    fast = _fast(speedups, correct, p, ndim=2)
    return (fast & _turn_mask(turn_mask, fast)).int().cummax(1).values.bool()


def fast_p_best_of_history(
    speedups: ArrayLike, correct: ArrayLike, p: float, turn_mask: ArrayLike | None = None
) -> torch.Tensor:
    """[T] share of all N trajectories with some valid turn <= t correct and fast: best-of-history test-time scaling.

    A trajectory that ended before t keeps its best result, so the curve is non-decreasing.
    """
    return best_of_history_fast(speedups, correct, p, turn_mask).double().mean(0)


def pass_at_k(
    n: int | ArrayLike, c: int | ArrayLike, k: int | ArrayLike
) -> float | torch.Tensor:
    """Unbiased pass@k of problems with n samples of which c are correct: 1 - C(n-c, k) / C(n, k).

    Evaluated as 1 - prod_{i=n-c+1}^{n} (1 - k/i), which never forms the huge binomials (when n - c < k a factor is
    exactly 0 and the estimate is exactly 1). n, c and k broadcast; Python ints give a float, arrays a tensor.
    """
    scalar = all(isinstance(v, numbers.Integral) for v in (n, c, k))
    n_t, c_t, k_t = (torch.as_tensor(v) for v in (n, c, k))
    if any(t.is_floating_point() or t.is_complex() for t in (n_t, c_t, k_t)):
        raise ValueError("n, c and k must be integers")
    n_t, c_t, k_t = torch.broadcast_tensors(n_t.long(), c_t.long(), k_t.long())
    if bool(((c_t < 0) | (c_t > n_t)).any()) or bool(((k_t < 1) | (k_t > n_t)).any()):
        raise ValueError("need 0 <= c <= n and 1 <= k <= n")
    if n_t.numel() == 0:
        return torch.zeros(n_t.shape, dtype=torch.float64)
    i = torch.arange(1, int(n_t.max()) + 1, dtype=torch.float64)
    n_, c_, k_ = (t.unsqueeze(-1) for t in (n_t, c_t, k_t))
    factors = torch.where((i > n_ - c_) & (i <= n_), 1.0 - k_ / i, torch.ones((), dtype=torch.float64))
    estimate = 1.0 - factors.prod(-1)
    return estimate.item() if scalar else estimate


def geometric_mean_speedup(speedups: ArrayLike, correct: ArrayLike | None = None) -> float:
    """exp(mean log speedup) over the samples that are correct (when `correct` is given) with a finite positive
    speedup; NaN when there is none, so an empty set is never mistaken for a 1x speedup.
    """
    s = _float_tensor(speedups, "speedups").double()
    usable = torch.isfinite(s) & (s > 0)
    if correct is not None:
        ok = _bool_tensor(correct, "correct").to(s.device)
        if ok.shape != s.shape:
            raise ValueError(f"correct must have the shape of speedups {tuple(s.shape)}, not {tuple(ok.shape)}")
        usable &= ok
    if not bool(usable.any()):
        return math.nan
    return math.exp(s[usable].log().mean().item())
