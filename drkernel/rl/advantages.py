"""Returns and group-baseline advantages for multi-turn RL.

Rows are flattened (sample, turn) pairs: row i has a return G_i, the id of its prompt and its turn index. A group
is one (prompt, turn) pair, so trajectories of different lengths simply make later-turn groups smaller.
All group statistics are segment sums (`index_add_`) computed in float64, so a leave-one-out mean is exact up to
float64 rounding whatever the group sizes.

The `_float_tensor` and `_bool_tensor` converters are shared by the other `drkernel.rl` modules.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Union

import numpy as np
import torch

ArrayLike = Union[torch.Tensor, np.ndarray, Sequence[Any]]


def _float_tensor(x: ArrayLike, name: str) -> torch.Tensor:
    """Floating tensor view of `x`; None entries of lists become NaN. Floating tensors keep their dtype and device."""
    if isinstance(x, torch.Tensor):
        t = x
    else:
        arr = np.asarray(x)
        if arr.dtype == object:
            try:
                arr = np.where(np.equal(arr, None), np.nan, arr).astype(np.float64)
            except (TypeError, ValueError) as exc:
                raise ValueError(f"{name} must hold numbers or None: {exc}") from None
        elif arr.dtype.kind not in "biuf":
            raise ValueError(f"{name} must hold numbers, not {arr.dtype}")
        t = torch.as_tensor(arr)
    return t if t.is_floating_point() else t.to(torch.get_default_dtype())


def _bool_tensor(x: ArrayLike, name: str) -> torch.Tensor:
    """Bool tensor of a bool or 0/1 input; any other value is an error rather than a silent truthiness test."""
    t = x if isinstance(x, torch.Tensor) else torch.as_tensor(np.asarray(x))
    if t.dtype != torch.bool:
        if not bool(((t == 0) | (t == 1)).all()):
            raise ValueError(f"{name} must be boolean or 0/1")
        t = t != 0
    return t


def _codes(ids: ArrayLike, name: str, n: int) -> torch.Tensor:
    """Dense int64 codes 0..K-1 of `n` ids (numbers, strings or any hashable values)."""
    if isinstance(ids, torch.Tensor) or (isinstance(ids, np.ndarray) and ids.dtype.kind in "biuf"):
        t = torch.as_tensor(ids)
        if t.shape != (n,):
            raise ValueError(f"{name} must have shape ({n},), not {tuple(t.shape)}")
        return torch.unique(t.cpu(), return_inverse=True)[1]
    values = list(ids)
    if len(values) != n:
        raise ValueError(f"{name} must have {n} entries, not {len(values)}")
    index: dict[Any, int] = {}
    return torch.tensor([index.setdefault(v, len(index)) for v in values], dtype=torch.int64)


def _group_index(n: int, prompt_ids: ArrayLike, turn_ids: ArrayLike | None) -> torch.Tensor:
    """Dense group index of each row, a group being one (prompt, turn) pair."""
    prompts = _codes(prompt_ids, "prompt_ids", n)
    if turn_ids is None:
        return prompts
    turns = _codes(turn_ids, "turn_ids", n)
    return torch.unique(prompts * (int(turns.max()) + 1 if n else 1) + turns, return_inverse=True)[1]


def _group_sum(values: torch.Tensor, group: torch.Tensor) -> torch.Tensor:
    """Sum of `values` over each row's group, broadcast back to the rows."""
    num_groups = int(group.max()) + 1 if group.numel() else 0
    sums = torch.zeros(num_groups, dtype=values.dtype, device=values.device)
    return sums.index_add_(0, group.to(values.device), values)[group.to(values.device)]


def _returns_and_groups(
    returns: ArrayLike, prompt_ids: ArrayLike, turn_ids: ArrayLike | None
) -> tuple[torch.Tensor, torch.dtype, torch.Tensor, torch.Tensor]:
    """(returns as float64, the caller's dtype to give back, group index, group size) with the shapes checked."""
    g = _float_tensor(returns, "returns")
    if g.ndim != 1:
        raise ValueError(f"returns must be 1-D (one row per sample and turn), not shape {tuple(g.shape)}")
    group = _group_index(g.shape[0], prompt_ids, turn_ids)
    g64 = g.double()
    return g64, g.dtype, group, _group_sum(torch.ones_like(g64), group)


def _leave_one_out(returns: ArrayLike, prompt_ids: ArrayLike, turn_ids: ArrayLike | None) -> torch.Tensor:
    """G_i minus the mean of the other rows of its group: (group sum - G_i) / (size - 1); 0 baseline alone."""
    g, dtype, group, size = _returns_and_groups(returns, prompt_ids, turn_ids)
    others = (_group_sum(g, group) - g) / (size - 1).clamp(min=1)
    return (g - torch.where(size > 1, others, torch.zeros_like(g))).to(dtype)


def reward_to_go(
    rewards: ArrayLike,
    gamma: float = 1.0,
    mask: ArrayLike | None = None,
    lengths: ArrayLike | None = None,
) -> torch.Tensor:
    """G_t = r_t + gamma * G_{t+1} along the last axis of `rewards` ([..., T], one reward per turn).

    Turn t is credited with what happens after it, which is what makes the per-turn policy gradient unbiased.
    For ragged trajectories pass a 0/1 `mask` ([..., T]) or `lengths` ([...], a prefix of valid turns): masked
    turns contribute no reward and get G = 0.
    """
    r = _float_tensor(rewards, "rewards")
    if r.ndim < 1:
        raise ValueError("rewards must have a turn axis [..., T]")
    if not 0.0 <= gamma <= 1.0:
        raise ValueError(f"gamma must lie in [0, 1], not {gamma!r}")
    if mask is not None and lengths is not None:
        raise ValueError("pass either mask or lengths, not both")
    if lengths is not None:
        n = lengths if isinstance(lengths, torch.Tensor) else torch.as_tensor(np.asarray(lengths))
        if n.is_floating_point() or n.dtype == torch.bool or n.shape != r.shape[:-1]:
            raise ValueError(f"lengths must be integers of shape {tuple(r.shape[:-1])}, not {n.dtype} {tuple(n.shape)}")
        if bool(((n < 0) | (n > r.shape[-1])).any()):
            raise ValueError(f"lengths must lie in [0, {r.shape[-1]}]")
        mask = torch.arange(r.shape[-1], device=r.device) < n.to(r.device).unsqueeze(-1)
    valid = torch.ones_like(r, dtype=torch.bool) if mask is None else _bool_tensor(mask, "mask").to(r.device)
    if valid.shape != r.shape:
        raise ValueError(f"mask must have the shape of rewards {tuple(r.shape)}, not {tuple(valid.shape)}")
    zero = torch.zeros((), dtype=r.dtype, device=r.device)
    r = torch.where(valid, r, zero)  # where, not a product: NaN padding must not leak in
    out = torch.empty_like(r)
    running = torch.zeros_like(r[..., 0])
    for t in range(r.shape[-1] - 1, -1, -1):  # T is the number of turns: a handful
        running = r[..., t] + gamma * running
        out[..., t] = running
    return torch.where(valid, out, zero)


def trloo_advantages(returns: ArrayLike, prompt_ids: ArrayLike, turn_ids: ArrayLike) -> torch.Tensor:
    """Turn-level leave-one-out: A_i = G_i - mean of G_j over the other rows of i's (prompt, turn) group.

    The baseline never contains G_i, so it is independent of sample i's actions and the policy gradient stays
    unbiased (see docs/algorithms.md). A group of one has no baseline: A_i = G_i.
    """
    return _leave_one_out(returns, prompt_ids, turn_ids)


def rloo_advantages(rewards: ArrayLike, prompt_ids: ArrayLike) -> torch.Tensor:
    """Single-turn RLOO: TRLOO with every row in turn 0, i.e. A_i = r_i - mean of the other samples of its prompt."""
    return _leave_one_out(rewards, prompt_ids, None)


def grpo_advantages(
    returns: ArrayLike,
    prompt_ids: ArrayLike,
    turn_ids: ArrayLike,
    normalize_std: bool = False,
    eps: float = 1e-6,
) -> torch.Tensor:
    """GRPO: A_i = G_i - mean of its (prompt, turn) group INCLUDING G_i, optionally over (group std + eps).

    Provided for comparison: the self-inclusive mean scales the expected gradient by (K-1)/K for a group of K
    (so a group of one gets A = 0). The std is the sample (Bessel-corrected) std, as torch.std, and 0 for a group
    of one.
    """
    if not eps > 0:  # with eps = 0 a constant group's rounding noise would be blown up to O(1) advantages
        raise ValueError(f"eps must be positive, not {eps!r}")
    g, dtype, group, size = _returns_and_groups(returns, prompt_ids, turn_ids)
    centered = g - _group_sum(g, group) / size
    if normalize_std:
        var = _group_sum(centered.square(), group) / (size - 1).clamp(min=1)
        centered = centered / (var.sqrt() + eps)
    return centered.to(dtype)
