import math

import numpy as np
import pytest
import torch

from drkernel.rl import grpo_advantages, reward_to_go, rloo_advantages, trloo_advantages

# ---------------------------------------------------------------- reward_to_go


def test_reward_to_go_undiscounted_and_discounted():
    r = torch.tensor([1.0, 2.0, 3.0])
    assert reward_to_go(r).tolist() == [6.0, 5.0, 3.0]
    assert reward_to_go(r, gamma=0.5).tolist() == [2.75, 3.5, 3.0]  # 3; 2 + 1.5; 1 + 1.75
    assert reward_to_go(r, gamma=0.0).tolist() == [1.0, 2.0, 3.0]


def test_reward_to_go_batched_numpy_keeps_shape():
    r = np.arange(12, dtype=np.float64).reshape(2, 2, 3)
    out = reward_to_go(r)
    assert isinstance(out, torch.Tensor) and out.shape == (2, 2, 3) and out.dtype == torch.float64
    assert out[1, 0].tolist() == [6.0 + 7.0 + 8.0, 7.0 + 8.0, 8.0]


def test_reward_to_go_ragged_lengths_and_mask():
    r = torch.tensor([[1.0, 2.0, 3.0], [4.0, math.nan, 100.0], [1.0, 1.0, 1.0]])
    expected = [[6.0, 5.0, 3.0], [4.0, 0.0, 0.0], [0.0, 0.0, 0.0]]
    assert reward_to_go(r, lengths=[3, 1, 0]).tolist() == expected  # padding (even NaN) contributes nothing
    mask = torch.tensor([[1, 1, 1], [1, 0, 0], [0, 0, 0]])
    assert reward_to_go(r, mask=mask).tolist() == expected
    assert reward_to_go(r, gamma=0.5, lengths=torch.tensor([2, 1, 3])).tolist() == [
        [2.0, 2.0, 0.0],
        [4.0, 0.0, 0.0],
        [1.75, 1.5, 1.0],
    ]
    # a hole in the mask: the masked turn earns nothing and gets 0, later turns still count for earlier ones
    assert reward_to_go([1.0, 2.0, 3.0], mask=[True, False, True]).tolist() == [4.0, 0.0, 3.0]


def test_reward_to_go_bad_arguments():
    r = torch.ones(2, 3)
    with pytest.raises(ValueError, match="gamma"):
        reward_to_go(r, gamma=1.5)
    with pytest.raises(ValueError, match="either"):
        reward_to_go(r, mask=torch.ones(2, 3), lengths=[3, 3])
    with pytest.raises(ValueError, match="mask"):
        reward_to_go(r, mask=torch.ones(2, 2))
    with pytest.raises(ValueError, match="0/1"):
        reward_to_go(r, mask=torch.full((2, 3), 0.5))
    with pytest.raises(ValueError, match="lengths"):
        reward_to_go(r, lengths=[4, 1])
    with pytest.raises(ValueError, match="lengths"):
        reward_to_go(r, lengths=[1.5, 1.0])
    with pytest.raises(ValueError, match="lengths"):
        reward_to_go(r, lengths=[1])
    with pytest.raises(ValueError, match="turn axis"):
        reward_to_go(torch.tensor(1.0))


# ---------------------------------------------------------------- group baselines

# Two prompts, rows shuffled. Prompt "a": 3 trajectories, one stops after turn 0. Prompt "b": 1 trajectory.
#   ("a", 0): G = 1, 2, 3    ("a", 1): G = 4, 6    ("b", 0): G = 5    ("b", 1): G = 7
G = [4.0, 1.0, 5.0, 2.0, 7.0, 6.0, 3.0]
PROMPTS = ["a", "a", "b", "a", "b", "a", "a"]
TURNS = [1, 0, 0, 0, 1, 1, 0]


def test_trloo_hand_computed_ragged_groups_and_groups_of_one():
    # ("a", 0): 1 - (2+3)/2, 2 - (1+3)/2, 3 - (1+2)/2; ("a", 1): 4 - 6, 6 - 4; groups of one keep G.
    expected = [-2.0, -1.5, 5.0, 0.0, 7.0, 2.0, 1.5]
    assert trloo_advantages(G, PROMPTS, TURNS).tolist() == expected
    prompt_codes = torch.tensor([0 if p == "a" else 1 for p in PROMPTS])
    assert trloo_advantages(torch.tensor(G), prompt_codes, torch.tensor(TURNS)).tolist() == expected
    assert trloo_advantages(np.array(G), np.array(PROMPTS), np.array(TURNS)).tolist() == expected


def test_trloo_keeps_groups_apart_and_dtype():
    # (prompt 0, turn 1) and (prompt 1, turn 0) must not merge
    out = trloo_advantages(torch.tensor([1.0, 2.0, 3.0, 5.0], dtype=torch.float32), [0, 1, 0, 1], [1, 0, 1, 0])
    assert out.dtype == torch.float32 and out.tolist() == [-2.0, -3.0, 2.0, 3.0]


def test_trloo_exact_with_large_offsets():
    # float32 input, float64 segment sums: the leave-one-out mean loses nothing to cancellation
    g = torch.tensor([1e6 + 1, 1e6 + 2, 1e6 + 4], dtype=torch.float32)
    assert trloo_advantages(g, [0, 0, 0], [0, 0, 0]).tolist() == [-2.0, -0.5, 2.5]


def test_trloo_matches_a_loop_on_random_ragged_groups():
    gen = torch.Generator().manual_seed(0)
    n = 500
    g = torch.randn(n, generator=gen, dtype=torch.float64)
    prompts = torch.randint(0, 30, (n,), generator=gen)
    turns = torch.randint(0, 4, (n,), generator=gen)
    rows = list(zip(g.tolist(), prompts.tolist(), turns.tolist()))
    expected = []
    for i, (gi, pi, ti) in enumerate(rows):
        others = [gj for j, (gj, pj, tj) in enumerate(rows) if j != i and (pj, tj) == (pi, ti)]
        expected.append(gi - (sum(others) / len(others) if others else 0.0))
    out = trloo_advantages(g, prompts, turns)
    assert torch.allclose(out, torch.tensor(expected, dtype=torch.float64), atol=1e-12, rtol=0)


def test_grpo_hand_computed():
    # ("a", 0): mean 2; ("a", 1): mean 5; a group of one is its own mean
    assert grpo_advantages(G, PROMPTS, TURNS).tolist() == [-1.0, -1.0, 0.0, 0.0, 0.0, 1.0, 1.0]
    # sample std: ("a", 0) -> 1, ("a", 1) -> sqrt(2), groups of one -> 0 (and A = 0 anyway)
    out = grpo_advantages(G, PROMPTS, TURNS, normalize_std=True, eps=1e-12)
    s = 1 / math.sqrt(2)
    assert torch.allclose(out, torch.tensor([-s, -1.0, 0.0, 0.0, 0.0, s, 1.0], dtype=torch.float64))
    out = grpo_advantages(G, PROMPTS, TURNS, normalize_std=True)
    assert out[1].item() == pytest.approx(-1 / (1 + 1e-6), abs=1e-12)
    # a constant group stays at 0 instead of amplifying rounding noise
    const = grpo_advantages([0.1, 0.1, 0.1], [0, 0, 0], [0, 0, 0], normalize_std=True)
    assert const.abs().max().item() < 1e-9


def test_grpo_is_trloo_scaled_by_n_minus_one_over_n_for_full_groups():
    gen = torch.Generator().manual_seed(1)
    for n in (2, 3, 8):
        g = torch.randn(6 * n, generator=gen, dtype=torch.float64)
        prompts = torch.arange(6).repeat_interleave(n)
        turns = torch.zeros(6 * n, dtype=torch.long)
        assert torch.allclose(grpo_advantages(g, prompts, turns), (n - 1) / n * trloo_advantages(g, prompts, turns))


def test_rloo_single_turn():
    assert rloo_advantages([1.0, 2.0, 3.0, 10.0], ["p", "p", "p", "q"]).tolist() == [-1.5, 0.0, 1.5, 10.0]
    assert rloo_advantages(torch.tensor([1.0, 3.0]), torch.tensor([7, 7])).tolist() == [-2.0, 2.0]


def test_empty_input():
    empty = torch.zeros(0)
    assert trloo_advantages(empty, [], []).shape == (0,)
    assert grpo_advantages(empty, torch.zeros(0, dtype=torch.long), [], normalize_std=True).shape == (0,)


def test_group_bad_arguments():
    with pytest.raises(ValueError, match="1-D"):
        trloo_advantages(torch.ones(2, 2), [0, 0], [0, 0])
    with pytest.raises(ValueError, match="prompt_ids"):
        trloo_advantages([1.0, 2.0], [0], [0, 0])
    with pytest.raises(ValueError, match="turn_ids"):
        grpo_advantages([1.0, 2.0], [0, 0], torch.zeros(3, dtype=torch.long))
    with pytest.raises(ValueError, match="eps"):
        grpo_advantages([1.0, 2.0], [0, 0], [0, 0], eps=0.0)
    with pytest.raises(ValueError, match="returns"):
        rloo_advantages(["x", "y"], [0, 0])
