"""The learning signal of one training step, from the judged turns of a whole generation batch.

Rows are (trajectory, turn) pairs gathered from every process; a trajectory's group is its prompt, which TRL's
sampler places as `num_generations` consecutive rows of the global batch. Returns are reward-to-go (gamma 1),
advantages come from `drkernel.rl` over the whole group, then the void-turn rule, PRS and MRS decide which turns
stay in the loss. Rejected turns still count in their group's baseline (see drkernel.rl.rejection).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from drkernel.rl import (
    grpo_advantages,
    mismatch_keep_mask,
    prs_keep_mask,
    reward_to_go,
    rloo_advantages,
    trloo_advantages,
)

ESTIMATORS = ("trloo", "grpo", "grpo_std", "rloo")
DROP_REASONS = ("mrs", "prs", "void_turn")


@dataclass(frozen=True)
class JudgedTurn:
    """One judged turn of one trajectory: what the advantage and the rejection rules need."""

    trajectory: int  # global row of the trajectory in the generation batch
    turn: int  # 1-based
    reward: float
    correct: bool
    coverage: float | None  # share of GPU time in the candidate's own kernels; None where not measured


@dataclass(frozen=True)
class TurnSignal:
    """What the loss sees of one turn, and why it is out of the loss when it is."""

    prompt_id: int
    sample: int
    turn: int
    reward: float
    ret: float
    advantage: float
    dropped: tuple[str, ...]  # every rule that left the turn out of the loss, in the order of DROP_REASONS

    @property
    def kept(self) -> bool:
        return not self.dropped

    @property
    def why_not(self) -> str | None:
        return self.dropped[0] if self.dropped else None


def group_of(trajectory: int, num_generations: int) -> tuple[int, int]:
    """(prompt id, sample) of a global row: TRL's RepeatSampler repeats each prompt `num_generations` times in a row,
    and processes hold consecutive slices, so the gathered order keeps each group contiguous."""
    return trajectory // num_generations, trajectory % num_generations


def turn_returns(turns: Sequence[JudgedTurn]) -> list[float]:
    """Reward-to-go (gamma 1) of each turn within its trajectory, in the order of `turns`."""
    by_trajectory: dict[int, list[int]] = {}
    for index, turn in enumerate(turns):
        by_trajectory.setdefault(turn.trajectory, []).append(index)
    out = [0.0] * len(turns)
    for indices in by_trajectory.values():
        indices.sort(key=lambda i: turns[i].turn)
        returns = reward_to_go(torch.tensor([turns[i].reward for i in indices], dtype=torch.float64))
        for i, value in zip(indices, returns.tolist()):
            out[i] = value
    return out


def advantages(returns: Sequence[float], prompt_ids: Sequence[int], turn_ids: Sequence[int], estimator: str) -> list[float]:
    """trloo and grpo baseline within a (prompt, turn) group; rloo within the prompt, all turns together. grpo_std
    also divides by the group's std, as GRPO usually does: without it GRPO's advantages are TRLOO's times (K-1)/K
    for a group of K, a constant Adam's update cancels (docs/miniature.md)."""
    g = torch.tensor(returns, dtype=torch.float64)
    if estimator == "trloo":
        return trloo_advantages(g, prompt_ids, turn_ids).tolist()
    if estimator in ("grpo", "grpo_std"):
        return grpo_advantages(g, prompt_ids, turn_ids, normalize_std=estimator == "grpo_std").tolist()
    if estimator == "rloo":
        return rloo_advantages(g, prompt_ids).tolist()
    raise ValueError(f"advantage estimator must be one of {', '.join(ESTIMATORS)}, not {estimator!r}")


def void_turns(turns: Sequence[JudgedTurn]) -> list[bool]:
    """True for a turn with reward <= 0 after an earlier turn of its trajectory had reward > 0: breaking a working
    kernel is not a lesson the policy should learn from the feedback loop, so the paper leaves such turns out."""
    best_before: dict[int, float] = {}
    out = [False] * len(turns)
    for index in sorted(range(len(turns)), key=lambda i: (turns[i].trajectory, turns[i].turn)):
        t = turns[index]
        earlier = best_before.get(t.trajectory, float("-inf"))
        out[index] = t.reward <= 0 and earlier > 0
        best_before[t.trajectory] = max(earlier, t.reward)
    return out


def step_signals(
    turns: Sequence[JudgedTurn],
    num_generations: int,
    estimator: str = "trloo",
    void_turn: bool = True,
    prs: bool = False,
    prs_seed: int = 0,
    prs_low: float = 0.3,
    prs_high: float = 0.4,
    mrs_keep: Sequence[bool] | None = None,
) -> list[TurnSignal]:
    """The signal of each turn of the batch, in the order of `turns`.

    `mrs_keep` is MRS's verdict per turn (None: MRS off). PRS draws with a generator seeded by `prs_seed`, over the
    turns in the order given, so the same batch and seed drop the same turns.
    """
    groups = [group_of(t.trajectory, num_generations) for t in turns]
    returns = turn_returns(turns)
    adv = advantages(returns, [g[0] for g in groups], [t.turn for t in turns], estimator)
    void = void_turns(turns) if void_turn else [False] * len(turns)
    if prs and turns:
        coverage = [float("nan") if t.coverage is None else t.coverage for t in turns]
        prs_kept = prs_keep_mask(coverage, [t.correct for t in turns], prs_seed, prs_low, prs_high).tolist()
    else:
        prs_kept = [True] * len(turns)
    mrs_kept = list(mrs_keep) if mrs_keep is not None else [True] * len(turns)
    if len(mrs_kept) != len(turns):
        raise ValueError(f"mrs_keep has {len(mrs_kept)} entries for {len(turns)} turns")
    out = []
    for i, t in enumerate(turns):
        dropped = tuple(r for r, hit in zip(DROP_REASONS, (not mrs_kept[i], not prs_kept[i], void[i])) if hit)
        out.append(TurnSignal(groups[i][0], groups[i][1], t.turn, t.reward, returns[i], adv[i], dropped))
    return out


def mrs_turn_keep(
    trainer_logp: torch.Tensor,
    rollout_logp: torch.Tensor,
    rows: Sequence[int],
    turn_masks: torch.Tensor,
    low: float = 0.999,
    high: float = 1.001,
    veto: float = 1e-4,
) -> list[bool]:
    """MRS verdict of each turn: turn n is row `rows[n]` of the [B, L] log-probs restricted to `turn_masks[n]`, the
    0/1 [L] mask of its generated tokens, so each turn is tested on its own tokens as a sample of its own."""
    if not len(rows):
        return []
    index = torch.as_tensor(list(rows), dtype=torch.long, device=trainer_logp.device)
    return mismatch_keep_mask(trainer_logp[index], rollout_logp[index], turn_masks, low, high, veto).tolist()


def kept_fraction(signals: Sequence[TurnSignal], reason: str) -> float:
    """Share of turns that `reason` kept, whatever the other rules did (1.0 for an empty batch or a rule that is off)."""
    if reason not in DROP_REASONS:
        raise ValueError(f"unknown reason {reason!r}")
    if not signals:
        return 1.0
    return sum(reason not in s.dropped for s in signals) / len(signals)
