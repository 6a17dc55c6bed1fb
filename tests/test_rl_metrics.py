import itertools
import math
from fractions import Fraction

import numpy as np
import pytest
import torch

from drkernel.rl import (
    fast_p,
    fast_p_best_of_history,
    fast_p_last_turn,
    fast_p_per_turn,
    geometric_mean_speedup,
    pass_at_k,
)

# ---------------------------------------------------------------- Fast@p


def test_fast_p_counts_only_correct_and_measured_samples():
    speedups = [1.5, 0.9, 2.0, None, 3.0, math.nan]
    correct = [True, True, False, True, True, True]  # the 2.0x is incorrect: not fast
    assert fast_p(speedups, correct, 1.0) == pytest.approx(2 / 6)
    assert fast_p(speedups, correct, 1.5) == pytest.approx(2 / 6)  # >= p
    assert fast_p(speedups, correct, 2.0) == pytest.approx(1 / 6)
    assert fast_p(torch.tensor([1.2, 1.0]), torch.tensor([1, 1]), 1.2) == 0.5


# Four trajectories, up to three turns, p = 1.2:
#   row 0: three turns, fast at turn 1 only
#   row 1: two turns, fast at turns 0 and 1
#   row 2: one turn (incorrect 2.0x); its padding holds a "fast" turn that must be ignored
#   row 3: no valid turn at all, padding full of fast turns
SPEEDUPS = [[0.8, 1.3, 1.1], [1.5, 1.25, None], [2.0, 5.0, 1.0], [3.0, 3.0, 3.0]]
CORRECT = [[True, True, True], [True, True, False], [False, True, True], [True, True, True]]
TURN_MASK = [[1, 1, 1], [1, 1, 0], [1, 0, 0], [0, 0, 0]]


def test_fast_p_per_turn():
    out = fast_p_per_turn(SPEEDUPS, CORRECT, 1.2, TURN_MASK)
    assert out.dtype == torch.float64
    assert torch.allclose(out, torch.tensor([1 / 3, 2 / 2, 0 / 1], dtype=torch.float64))
    # without a mask every cell is a valid turn
    unmasked = fast_p_per_turn(SPEEDUPS, CORRECT, 1.2)
    assert torch.allclose(unmasked, torch.tensor([2 / 4, 4 / 4, 1 / 4], dtype=torch.float64))
    nobody = fast_p_per_turn([[2.0, 2.0]], [[True, True]], 1.2, [[1, 0]])
    assert nobody[0].item() == 1.0 and math.isnan(nobody[1].item())  # no trajectory reached turn 1


def test_fast_p_last_turn():
    # last valid turns: row 0 -> turn 2 (1.1x), row 1 -> turn 1 (1.25x), row 2 -> turn 0 (incorrect), row 3 -> none
    assert fast_p_last_turn(SPEEDUPS, CORRECT, 1.2, TURN_MASK) == pytest.approx(1 / 4)
    assert fast_p_last_turn(SPEEDUPS, CORRECT, 1.2) == pytest.approx(1 / 4)  # row 3's turn 2 is the only fast one
    # the last valid turn need not be a prefix end
    assert fast_p_last_turn([[2.0, 1.0, 2.0]], [[True, True, True]], 1.2, [[1, 1, 0]]) == 0.0


def test_fast_p_best_of_history():
    out = fast_p_best_of_history(SPEEDUPS, CORRECT, 1.2, TURN_MASK)
    assert torch.allclose(out, torch.tensor([1 / 4, 2 / 4, 2 / 4], dtype=torch.float64))
    unmasked = fast_p_best_of_history(SPEEDUPS, CORRECT, 1.2)
    assert torch.allclose(unmasked, torch.tensor([2 / 4, 4 / 4, 4 / 4], dtype=torch.float64))


def test_the_per_trajectory_hits_are_what_the_shares_average():
    from drkernel.rl.metrics import best_of_history_fast, last_turn_fast

    last = last_turn_fast(SPEEDUPS, CORRECT, 1.2, TURN_MASK)
    # row 0: turn 1 fast, turn 2 (1.1x) not; row 1: the last valid turn 1 (1.25x) stays last at budget 3
    assert last.tolist() == [[False, True, False], [True, True, True], [False, False, False], [False] * 3]
    best = best_of_history_fast(SPEEDUPS, CORRECT, 1.2, TURN_MASK)
    assert best.tolist() == [[False, True, True], [True, True, True], [False] * 3, [False] * 3]
    for t in range(3):
        speedups, correct, mask = ([row[: t + 1] for row in rows] for rows in (SPEEDUPS, CORRECT, TURN_MASK))
        assert fast_p_last_turn(speedups, correct, 1.2, mask) == pytest.approx(last[:, t].double().mean().item())
    assert torch.equal(fast_p_best_of_history(SPEEDUPS, CORRECT, 1.2, TURN_MASK), best.double().mean(0))


def test_fast_0_is_the_correct_rate_measured_or_not():
    speedups = [1.5, 0.1, 2.0, None, math.nan, 0.0]
    correct = [True, True, False, True, True, False]
    assert fast_p(speedups, correct, 0) == pytest.approx(4 / 6)
    assert fast_p(speedups, correct, 0.0) == fast_p([None] * 6, correct, 0)
    assert torch.equal(fast_p_per_turn(SPEEDUPS, CORRECT, 0, TURN_MASK),
                       torch.tensor([2 / 3, 2 / 2, 1 / 1], dtype=torch.float64))
    assert fast_p_last_turn(SPEEDUPS, CORRECT, 0, TURN_MASK) == pytest.approx(2 / 4)
    assert torch.equal(fast_p_best_of_history(SPEEDUPS, CORRECT, 0, TURN_MASK),
                       torch.tensor([2 / 4, 2 / 4, 2 / 4], dtype=torch.float64))


def test_fast_p_bad_arguments():
    for p in (-0.5, -1.0, math.nan):
        with pytest.raises(ValueError, match="p must be 0 or more"):
            fast_p([1.0], [True], p)
    with pytest.raises(ValueError, match="shape"):
        fast_p([1.0, 2.0], [True], 1.0)
    with pytest.raises(ValueError, match="1-D"):
        fast_p(SPEEDUPS, CORRECT, 1.0)
    with pytest.raises(ValueError, match="2-D"):
        fast_p_per_turn([1.0], [True], 1.0)
    with pytest.raises(ValueError, match="turn_mask"):
        fast_p_best_of_history(SPEEDUPS, CORRECT, 1.0, [[1, 1]])
    with pytest.raises(ValueError, match="no samples"):
        fast_p([], [], 1.0)
    with pytest.raises(ValueError, match="numbers"):
        fast_p(["fast"], [True], 1.0)


# ---------------------------------------------------------------- pass@k


def _brute_force_pass_at_k(n: int, c: int, k: int) -> float:
    """Share of the k-subsets of n samples (the first c correct) that hold at least one correct sample."""
    subsets = list(itertools.combinations(range(n), k))
    return sum(any(j < c for j in s) for s in subsets) / len(subsets)


def test_pass_at_k_matches_brute_force():
    cases = [(n, c, k) for n in range(1, 8) for c in range(n + 1) for k in range(1, n + 1)]
    n, c, k = (np.array(column) for column in zip(*cases))
    estimate = pass_at_k(n, c, k)
    assert isinstance(estimate, torch.Tensor) and estimate.shape == (len(cases),)
    expected = torch.tensor([_brute_force_pass_at_k(*case) for case in cases], dtype=torch.float64)
    assert torch.allclose(estimate, expected, atol=1e-12, rtol=0)


def test_pass_at_k_scalars_broadcasting_and_large_n():
    assert pass_at_k(10, 3, 2) == pytest.approx(1 - 21 / 45)
    assert pass_at_k(5, 0, 3) == 0.0 and pass_at_k(5, 3, 3) == 1.0  # n - c < k: every draw holds a correct one
    assert pass_at_k([4, 4, 4], [0, 1, 4], 1).tolist() == [0.0, 0.25, 1.0]
    n, c, k = 1000, 10, 100  # C(1000, 100) ~ 6e139: the product form never builds it
    exact = 1 - Fraction(math.comb(n - c, k), math.comb(n, k))
    assert pass_at_k(n, c, k) == pytest.approx(float(exact), rel=1e-12)


def test_pass_at_k_bad_arguments():
    for n, c, k in ((3, 4, 1), (3, -1, 1), (3, 1, 0), (3, 1, 4)):
        with pytest.raises(ValueError, match="0 <= c <= n"):
            pass_at_k(n, c, k)
    with pytest.raises(ValueError, match="integers"):
        pass_at_k(3.0, 1, 1)


# ---------------------------------------------------------------- geometric mean


def test_geometric_mean_speedup():
    assert geometric_mean_speedup([2.0, 8.0]) == pytest.approx(4.0)
    speedups = [2.0, 100.0, 8.0, None, math.nan, 0.0, -1.0, math.inf]
    correct = [True, False, True, True, True, True, True, True]
    assert geometric_mean_speedup(speedups, correct) == pytest.approx(4.0)
    assert geometric_mean_speedup(torch.tensor([0.5, 2.0])) == pytest.approx(1.0)
    assert math.isnan(geometric_mean_speedup([3.0, None], [False, True]))  # nothing usable
    assert math.isnan(geometric_mean_speedup([]))
    with pytest.raises(ValueError, match="shape"):
        geometric_mean_speedup([1.0, 2.0], [True])
