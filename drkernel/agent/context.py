"""Which earlier turns a prompt shows (`--context`), and the chat messages built from them.

A long refinement cannot show every earlier turn: the context would outgrow the model's window. The paper's
sequential test-time scaling keeps a few earlier turns chosen by reward; `window:K` is what its code does (the K
consecutive turns with the highest summed reward), `topk:K` what its text says (the K best turns).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from drkernel.errors import UsageError

POLICY_KINDS = ("full", "last", "topk", "window")


@dataclass(frozen=True)
class ContextPolicy:
    """`full` shows every earlier turn; `last`, `topk` and `window` show at most `k` of them."""

    kind: str = "full"
    k: int | None = None

    def __post_init__(self) -> None:
        if self.kind not in POLICY_KINDS:
            raise UsageError(f"context policy must be one of {', '.join(POLICY_KINDS)}, not {self.kind!r}")
        if self.kind == "full" and self.k is not None:
            raise UsageError("the full context policy takes no K")
        if self.kind != "full" and (self.k is None or self.k < 1):
            raise UsageError(f"the {self.kind} context policy needs K >= 1, as in '{self.kind}:4'")

    @classmethod
    def parse(cls, text: str) -> ContextPolicy:
        """'full', 'last:K', 'topk:K' or 'window:K'."""
        kind, sep, k = text.strip().partition(":")
        if not sep:
            return cls(kind)
        if not k.strip().lstrip("-").isdigit():
            raise UsageError(f"K in {text!r} must be a whole number" if kind in POLICY_KINDS else
                             f"context policy must be one of {', '.join(POLICY_KINDS)}, not {kind!r}")
        return cls(kind, int(k))

    def __str__(self) -> str:
        return self.kind if self.k is None else f"{self.kind}:{self.k}"


@dataclass(frozen=True)
class ShownTurn:
    """What a later prompt can show of a turn: the model's answer, the feedback it got, and its reward."""

    response: str
    feedback: str
    reward: float


def select_context(rewards: Sequence[float], policy: ContextPolicy) -> list[int]:
    """0-based indices of the earlier turns (whose rewards are given, oldest first) to show, oldest first."""
    n = len(rewards)
    if policy.kind == "full" or n <= (policy.k or 0):
        return list(range(n))
    k = policy.k
    assert k is not None
    if policy.kind == "last":
        return list(range(n - k, n))
    if policy.kind == "topk":  # highest reward first; among equals the later turn first
        ranked = sorted(range(n), key=lambda i: (rewards[i], i), reverse=True)
        return sorted(ranked[:k])
    sums = [sum(rewards[start:start + k]) for start in range(n - k + 1)]
    best = max(range(len(sums)), key=lambda start: (sums[start], -start))  # ties: the earliest window
    return list(range(best, best + k))


def build_messages(
    first_prompt: str, earlier: Sequence[ShownTurn], policy: ContextPolicy
) -> tuple[list[dict[str, str]], list[int]]:
    """The chat for the next turn and the 1-based numbers of the earlier turns it shows (`context_turns`).

    The first user message is always the task; each shown turn follows as its answer and its feedback. No system
    prompt, as in the paper's setting.
    """
    shown = select_context([turn.reward for turn in earlier], policy)
    messages = [{"role": "user", "content": first_prompt}]
    for index in shown:
        messages.append({"role": "assistant", "content": earlier[index].response})
        messages.append({"role": "user", "content": earlier[index].feedback})
    return messages, [index + 1 for index in shown]
