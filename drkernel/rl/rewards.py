"""Scalar rewards from evaluation results.

Credit is earned only by results whose `correct` flag is true: a failed, wrong or hacked kernel gets 0 however
fast it claims to be, because a speedup measured on a cheating kernel is exactly what reward hacking exploits.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Literal

import torch

from drkernel.schema import EvalResult, Status

_TRANSFORMS = ("linear", "log")


@dataclass(frozen=True)
class RewardConfig:
    """Weights of the reward `base + speedup term (+ coverage term)` given to correct kernels.

    speedup_transform:
      "linear": speedup_weight * min(speedup, speedup_cap), the paper's default.
      "log":    speedup_weight * max(0, 1 + log2(min(speedup, speedup_cap))): every doubling of the speedup earns the
                same increment, a 2x slowdown or worse earns only the base. It agrees with "linear" at speedups 1
                and 2, so the two scales are comparable.
    profiling_reward (PR): adds coverage_weight * coverage, the share of GPU time spent in the candidate's own
    Triton kernels, so that a kernel that moves only a trivial op into Triton ("lazy optimization") earns less.
    """

    base: float = 0.5
    speedup_weight: float = 0.5
    speedup_cap: float = 3.0
    coverage_weight: float = 0.5
    profiling_reward: bool = False
    speedup_transform: Literal["linear", "log"] = "linear"

    def __post_init__(self) -> None:
        if not self.speedup_cap > 0:
            raise ValueError(f"speedup_cap must be positive, not {self.speedup_cap!r}")
        if self.speedup_transform not in _TRANSFORMS:
            raise ValueError(f"speedup_transform must be one of {_TRANSFORMS}, not {self.speedup_transform!r}")


def _fields(result: EvalResult | Mapping[str, Any]) -> tuple[bool, str, list[str], Any, Any]:
    """(correct, status, hack_reasons, speedup, profile) of an EvalResult or of its `to_dict()` form."""
    if isinstance(result, EvalResult):
        return result.correct, result.status, result.hack_reasons, result.speedup, result.profile
    if isinstance(result, Mapping):
        if "correct" not in result:
            raise ValueError("result has no 'correct' field; expected EvalResult.to_dict() output")
        return (
            result["correct"],
            result.get("status", ""),
            result.get("hack_reasons") or [],
            result.get("speedup"),
            result.get("profile"),
        )
    raise TypeError(f"result must be an EvalResult or a dict, not {type(result).__name__}")


def measured_coverage(profile: Any) -> float | None:
    """Coverage in [0, 1] of a result's profile (a `Profile` or its dict form); None when it is missing, NaN or not
    meaningful (no GPU: launch counts only). Rewards, PRS and reports all read coverage this way."""
    if profile is None:
        return None
    if isinstance(profile, Mapping):
        coverage, meaningful = profile.get("coverage"), profile.get("meaningful", False)
    else:
        coverage, meaningful = profile.coverage, profile.meaningful
    if not meaningful or coverage is None or math.isnan(coverage):
        return None
    return min(max(float(coverage), 0.0), 1.0)


def _speedup_term(speedup: float, config: RewardConfig) -> float:
    capped = min(max(speedup, 0.0), config.speedup_cap)  # +inf is capped like any large speedup
    if config.speedup_transform == "linear":
        return config.speedup_weight * capped
    return config.speedup_weight * max(0.0, 1.0 + math.log2(capped)) if capped > 0 else 0.0


def reward(result: EvalResult | Mapping[str, Any], config: RewardConfig | None = None) -> float:
    """Reward of one evaluation.

    0 unless `correct` is true (and, defensively, the record carries no hacking verdict, should a producer set
    both). A correct result earns `base` plus the speedup term; with no speedup (performance not measured, or NaN)
    it earns `base` only. With `profiling_reward` on it also earns `coverage_weight * coverage`, where a missing or
    not meaningful coverage counts as 0: unmeasured work is not rewarded.
    """
    config = config or RewardConfig()
    correct, status, hack_reasons, speedup, profile = _fields(result)
    if not correct or status == Status.HACKED or hack_reasons:
        return 0.0
    value = config.base
    if speedup is not None and not math.isnan(speedup):
        value += _speedup_term(float(speedup), config)
    if config.profiling_reward:
        value += config.coverage_weight * (measured_coverage(profile) or 0.0)
    return value


def rewards(
    results: Iterable[EvalResult | Mapping[str, Any]],
    config: RewardConfig | None = None,
    dtype: torch.dtype | None = None,
) -> torch.Tensor:
    """`reward` of each result as a 1-D tensor, ready for `reward_to_go` or the advantage estimators."""
    return torch.tensor([reward(r, config) for r in results], dtype=dtype or torch.get_default_dtype())
