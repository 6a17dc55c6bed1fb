"""Learning signals of Dr. Kernel: rewards, multi-turn advantages (TRLOO), rejection sampling and metrics.

Only torch and numpy are needed; see docs/algorithms.md for the formulas and when to use which.
"""

from drkernel.rl.advantages import grpo_advantages, reward_to_go, rloo_advantages, trloo_advantages
from drkernel.rl.kinds import AnswerKind, answer_kind
from drkernel.rl.metrics import (
    fast_p,
    fast_p_best_of_history,
    fast_p_last_turn,
    fast_p_per_turn,
    geometric_mean_speedup,
    pass_at_k,
)
from drkernel.rl.rejection import (
    mismatch_keep_mask,
    prs_keep_mask,
    prs_keep_probability,
    sequence_importance_weights,
    truncated_importance_weights,
)
from drkernel.rl.rewards import RewardConfig, measured_coverage, reward, rewards

__all__ = [
    "AnswerKind",
    "RewardConfig",
    "answer_kind",
    "fast_p",
    "fast_p_best_of_history",
    "fast_p_last_turn",
    "fast_p_per_turn",
    "geometric_mean_speedup",
    "measured_coverage",
    "grpo_advantages",
    "mismatch_keep_mask",
    "pass_at_k",
    "prs_keep_mask",
    "prs_keep_probability",
    "reward",
    "reward_to_go",
    "rewards",
    "rloo_advantages",
    "sequence_importance_weights",
    "trloo_advantages",
    "truncated_importance_weights",
]
