"""Which samples enter the loss: mismatch rejection (MRS), importance weights, profiling-based rejection (PRS).

Both rejections act after the advantages are computed: a rejected sample still counts in its group's baseline
and only leaves the loss, so rejecting never changes the baselines of the samples that stay.
"""

from __future__ import annotations

import torch

from drkernel.rl.advantages import ArrayLike, _bool_tensor, _float_tensor


def _masked_log_ratio(
    trainer_logp: ArrayLike, rollout_logp: ArrayLike, mask: ArrayLike
) -> tuple[torch.Tensor, torch.Tensor, torch.dtype]:
    """(log pi_trainer - log pi_rollout in float64, 0 off the mask; bool mask; trainer dtype), shapes checked."""
    trainer = _float_tensor(trainer_logp, "trainer_logp").detach()
    rollout = _float_tensor(rollout_logp, "rollout_logp").detach()
    valid = _bool_tensor(mask, "mask").to(trainer.device)
    if trainer.ndim != 2 or trainer.shape != rollout.shape or trainer.shape != valid.shape:
        raise ValueError(
            "trainer_logp, rollout_logp and mask must share one [B, L] shape, not "
            f"{tuple(trainer.shape)}, {tuple(rollout.shape)}, {tuple(valid.shape)}"
        )
    diff = trainer.double() - rollout.to(trainer.device).double()
    return torch.where(valid, diff, torch.zeros((), dtype=diff.dtype, device=diff.device)), valid, trainer.dtype


def mismatch_keep_mask(
    trainer_logp: ArrayLike,
    rollout_logp: ArrayLike,
    mask: ArrayLike,
    low: float = 0.999,
    high: float = 1.001,
    veto: float = 1e-4,
) -> torch.Tensor:
    """Mismatch Rejection Sampling (MRS): [B] bool, True for sequences whose rollout log-probs match the trainer's.

    The inference engine and the trainer compute slightly different probabilities; training on sequences where
    they disagree makes the update off-policy and destabilizes training. A sequence is kept when the geometric
    mean token ratio exp(mean_t (trainer - rollout)) over its masked tokens lies in [low, high] and no masked
    token has ratio exp(trainer - rollout) < veto (a token the trainer finds nearly impossible).
    A row with no masked token is kept: its mean ratio is 1 and there is nothing to veto. NaN log-probs on masked
    tokens reject the row.
    """
    if not 0 < low <= high:
        raise ValueError(f"need 0 < low <= high, not low={low!r}, high={high!r}")
    if veto < 0:
        raise ValueError(f"veto must be non-negative, not {veto!r}")
    log_ratio, valid, _ = _masked_log_ratio(trainer_logp, rollout_logp, mask)
    ratio = torch.exp(log_ratio.sum(-1) / valid.sum(-1).clamp(min=1))
    vetoed = (valid & (torch.exp(log_ratio) < veto)).any(-1)
    return (ratio >= low) & (ratio <= high) & ~vetoed


def truncated_importance_weights(
    trainer_logp: ArrayLike, rollout_logp: ArrayLike, mask: ArrayLike, cap: float = 2.0
) -> torch.Tensor:
    """Token-level truncated importance sampling: [B, L] weights min(exp(trainer - rollout), cap), 0 off the mask.

    The alternative to MRS that reweights instead of rejecting; the cap bounds the variance. Detached: the weights
    multiply the loss as constants.
    """
    if not cap > 0:
        raise ValueError(f"cap must be positive, not {cap!r}")
    log_ratio, valid, dtype = _masked_log_ratio(trainer_logp, rollout_logp, mask)
    return torch.where(valid, torch.exp(log_ratio).clamp(max=cap), torch.zeros_like(log_ratio)).to(dtype)


def sequence_importance_weights(
    trainer_logp: ArrayLike,
    rollout_logp: ArrayLike,
    mask: ArrayLike,
    cap: float = 2.0,
    geometric: bool = True,
) -> torch.Tensor:
    """Sequence-level truncated importance weights, [B]: min(ratio, cap), one weight for all tokens of a sequence.

    geometric=True: ratio = exp(mean of the masked log-ratios), the length-independent ratio that MRS tests.
    geometric=False: ratio = exp(sum), the exact sequence likelihood ratio, whose variance grows with length.
    A row with no masked token gets min(1, cap).
    """
    if not cap > 0:
        raise ValueError(f"cap must be positive, not {cap!r}")
    log_ratio, valid, dtype = _masked_log_ratio(trainer_logp, rollout_logp, mask)
    total = log_ratio.sum(-1)
    if geometric:
        total = total / valid.sum(-1).clamp(min=1)
    return torch.exp(total).clamp(max=cap).to(dtype)


def prs_keep_probability(
    coverage: ArrayLike, correct: ArrayLike, low: float = 0.3, high: float = 0.4
) -> torch.Tensor:
    """Profiling-based Rejection Sampling (PRS): probability of keeping each sample in the loss.

    clamp((coverage - low) / (high - low), 0, 1) for correct samples, 1 for the others: correct kernels that spend
    little GPU time in their own Triton code (lazy optimization) are dropped, so the policy is not reinforced for
    them, while failures keep teaching what not to do. A correct sample with missing (None/NaN) coverage gets 0,
    like the coverage reward: enable PRS only where profiling is meaningful (a GPU).
    """
    if not low < high:
        raise ValueError(f"need low < high, not low={low!r}, high={high!r}")
    cov = _float_tensor(coverage, "coverage")
    ok = _bool_tensor(correct, "correct").to(cov.device)
    if cov.ndim != 1 or cov.shape != ok.shape:
        raise ValueError(f"coverage and correct must share one [N] shape, not {tuple(cov.shape)}, {tuple(ok.shape)}")
    p = ((cov - low) / (high - low)).clamp(0.0, 1.0).nan_to_num(nan=0.0)
    return torch.where(ok, p, torch.ones_like(p))


def prs_keep_mask(
    coverage: ArrayLike,
    correct: ArrayLike,
    generator: torch.Generator | int,
    low: float = 0.3,
    high: float = 0.4,
) -> torch.Tensor:
    """[N] bool: a Bernoulli draw from `prs_keep_probability`, seeded by a torch.Generator (CPU) or an int seed.

    Compute advantages over all samples first, then drop the rejected ones from the loss only.
    """
    p = prs_keep_probability(coverage, correct, low, high)
    if isinstance(generator, int):
        generator = torch.Generator().manual_seed(generator)
    elif not isinstance(generator, torch.Generator):
        raise TypeError(f"generator must be a torch.Generator or an int seed, not {type(generator).__name__}")
    u = torch.rand(p.shape, generator=generator, dtype=torch.float64)
    return u.to(p.device) < p  # u lies in [0, 1): p = 1 always keeps, p = 0 never does
