"""What kind of answer a judged turn is, in the terms of the paper's story (docs/miniature.md): lazy, partial,
unfused or fused when it passed, failed otherwise. RL with PR and PRS should move answers from the first kinds to
the last; the trainer logs their shares per step and `drkernel report` per turn."""

from __future__ import annotations

from collections.abc import Mapping
from enum import Enum
from typing import Any

from drkernel.rl.rewards import measured_coverage
from drkernel.schema import HackReason, Status

PARTIAL_COVERAGE = 0.5  # under this share of the GPU time in its own kernels, a correct answer is partial


class AnswerKind(str, Enum):
    LAZY = "lazy"  # hacked as `lazy_kernel`: its own kernels do next to none of the work
    PARTIAL = "partial"  # correct, its own kernels under PARTIAL_COVERAGE of the GPU time
    UNFUSED = "unfused"  # correct and covering, several kernels of its own
    FUSED = "fused"  # correct and covering, one kernel of its own
    UNMEASURED = "unmeasured"  # correct, but its coverage (no GPU) or its own kernels were not recorded
    FAILED = "failed"  # incorrect, an error, another hack, or no code

    def __str__(self) -> str:
        return self.value


def answer_kind(result: Mapping[str, Any] | None) -> AnswerKind:
    """The kind of a judged turn from its result's dict (None: the answer held no code). Fused and unfused are told
    apart by the number of distinct own kernels: those the correctness trials launched (`profile.launches`), or, in
    results recorded without them, the own kernels among the profile's top kernels."""
    if not result:
        return AnswerKind.FAILED
    if result.get("status") == Status.HACKED and HackReason.LAZY_KERNEL.value in (result.get("hack_reasons") or ()):
        return AnswerKind.LAZY
    if not result.get("correct"):
        return AnswerKind.FAILED
    profile = result.get("profile")
    coverage = measured_coverage(profile)
    if coverage is None:
        return AnswerKind.UNMEASURED
    if coverage < PARTIAL_COVERAGE:
        return AnswerKind.PARTIAL
    kernels = len(_own_kernels(profile))
    return AnswerKind.FUSED if kernels == 1 else AnswerKind.UNFUSED if kernels > 1 else AnswerKind.UNMEASURED


def failure_reasons(result: Mapping[str, Any] | None) -> list[str]:
    """Why a judged turn failed, from its result's dict: its hack reasons, else its error's kind (`Mismatch`,
    `SandboxError`, a signal...); none for a correct turn or an answer without code. What a run's samples log keeps,
    so that its crashes and hacks can be told apart afterwards."""
    if not result:
        return []
    error = result.get("error")
    kind = error.get("kind") if isinstance(error, Mapping) else None
    return [str(r) for r in result.get("hack_reasons") or ()] or ([str(kind)] if kind else [])


def _own_kernels(profile: Any) -> set[str]:
    if not isinstance(profile, Mapping):
        return set()
    launches = profile.get("launches")
    if isinstance(launches, Mapping) and launches:
        return {str(name) for name in launches}
    kernels = profile.get("kernels")
    if not isinstance(kernels, list):
        return set()
    return {str(k.get("name")) for k in kernels if isinstance(k, Mapping) and k.get("own")}
