import math

import numpy as np
import pytest
import torch

from drkernel.rl import (
    mismatch_keep_mask,
    prs_keep_mask,
    prs_keep_probability,
    sequence_importance_weights,
    truncated_importance_weights,
)

LOG_1E5 = math.log(1e-5)

# rows of (trainer - rollout) log-prob differences and masks, with the MRS verdict at the defaults
CASES = [
    ([0.0, 0.0, 0.0], [1, 1, 1], True),  # identical: ratio 1
    ([0.002, 0.0, 0.0], [1, 1, 0], False),  # mean 0.001 -> ratio 1.0010005 > 1.001
    ([0.0005, 0.0005, 9.0], [1, 1, 0], True),  # ratio exp(0.0005); the unmasked outlier is ignored
    ([-0.0005, -0.0005, -0.5], [1, 1, 0], True),
    ([-0.002, 0.0, 0.0], [1, 1, 0], True),  # ratio exp(-0.001) = 0.9990005 >= 0.999
    ([-0.0021, 0.0, 0.0], [1, 1, 0], False),  # ratio exp(-0.00105) = 0.9989506 < 0.999
    ([math.nan, 5.0, -5.0], [0, 0, 0], True),  # no masked token: ratio 1, nothing to veto
    ([LOG_1E5, -LOG_1E5, 0.0], [1, 1, 1], False),  # mean 0 (ratio 1) but one token ratio 1e-5 < veto
    ([LOG_1E5, 0.0, 0.0], [0, 1, 1], True),  # the vetoing token is masked out
    ([math.nan, 0.0, 0.0], [1, 1, 1], False),  # NaN on a masked token rejects
]


def _batch(dtype=torch.float32):
    diff = torch.tensor([c[0] for c in CASES], dtype=torch.float64)
    rollout = torch.full_like(diff, -2.0)
    trainer = rollout + diff
    return trainer.to(dtype), rollout.to(dtype), torch.tensor([c[1] for c in CASES])


def test_mismatch_keep_mask_hand_cases():
    trainer, rollout, mask = _batch(torch.float64)
    keep = mismatch_keep_mask(trainer, rollout, mask)
    assert keep.dtype == torch.bool and keep.tolist() == [c[2] for c in CASES]
    # bool masks and numpy inputs give the same verdicts
    assert mismatch_keep_mask(trainer.numpy(), rollout.numpy(), mask.bool()).tolist() == keep.tolist()


def test_mismatch_thresholds_and_veto_off():
    trainer, rollout, mask = _batch(torch.float64)
    wide = mismatch_keep_mask(trainer, rollout, mask, low=0.99, high=1.01, veto=0.0)
    assert wide.tolist() == [True, True, True, True, True, True, True, True, True, False]
    # the veto alone: ratio 1e-5 passes a 1e-6 veto
    assert mismatch_keep_mask(trainer[7:8], rollout[7:8], mask[7:8], veto=1e-6).tolist() == [True]


def test_mismatch_bad_arguments():
    trainer, rollout, mask = _batch()
    with pytest.raises(ValueError, match="low <= high"):
        mismatch_keep_mask(trainer, rollout, mask, low=1.01, high=1.0)
    with pytest.raises(ValueError, match="low"):
        mismatch_keep_mask(trainer, rollout, mask, low=0.0)
    with pytest.raises(ValueError, match="veto"):
        mismatch_keep_mask(trainer, rollout, mask, veto=-1.0)
    with pytest.raises(ValueError, match="shape"):
        mismatch_keep_mask(trainer, rollout[:, :2], mask)
    with pytest.raises(ValueError, match="shape"):
        mismatch_keep_mask(trainer[0], rollout[0], mask[0])
    with pytest.raises(ValueError, match="0/1"):
        mismatch_keep_mask(trainer, rollout, mask * 2)


def test_truncated_importance_weights():
    trainer = torch.tensor([[math.log(0.5), math.log(3.0), 7.0], [0.0, 0.0, 0.0]], requires_grad=True)
    rollout = torch.zeros(2, 3)
    mask = torch.tensor([[1, 1, 0], [0, 0, 0]])
    w = truncated_importance_weights(trainer, rollout, mask)
    assert w.dtype == torch.float32 and not w.requires_grad
    assert torch.allclose(w, torch.tensor([[0.5, 2.0, 0.0], [0.0, 0.0, 0.0]]))
    uncapped = truncated_importance_weights(trainer, rollout, mask, cap=5.0)
    assert torch.allclose(uncapped[0, :2], torch.tensor([0.5, 3.0]))
    with pytest.raises(ValueError, match="cap"):
        truncated_importance_weights(trainer, rollout, mask, cap=0.0)


def test_sequence_importance_weights():
    trainer = torch.tensor(
        [[math.log(4.0), 0.0, -9.0], [math.log(0.25), 0.0, 0.0], [1.0, 2.0, 3.0]], dtype=torch.float64
    )
    rollout = torch.zeros(3, 3, dtype=torch.float64)
    mask = torch.tensor([[1, 1, 0], [1, 1, 1], [0, 0, 0]])
    # geometric: exp(mean) = 2, 0.25 ** (1/3), 1 (empty row); product: 4 -> capped 3, 0.25, 1
    geo = sequence_importance_weights(trainer, rollout, mask, cap=3.0)
    assert torch.allclose(geo, torch.tensor([2.0, 0.25 ** (1 / 3), 1.0], dtype=torch.float64))
    prod = sequence_importance_weights(trainer, rollout, mask, cap=3.0, geometric=False)
    assert torch.allclose(prod, torch.tensor([3.0, 0.25, 1.0], dtype=torch.float64))
    assert sequence_importance_weights(trainer, rollout, mask, cap=0.5)[2].item() == 0.5


def test_prs_keep_probability_boundaries():
    coverage = [0.3, 0.35, 0.4, 0.2, 0.9, None, math.nan, 0.1, math.nan]
    correct = [True, True, True, True, True, False, False, False, True]
    p = prs_keep_probability(coverage, correct)
    # 0.3 -> 0, 0.35 -> 0.5, 0.4 -> 1, below -> 0, above -> 1; incorrect -> 1 whatever the coverage;
    # a correct sample without coverage -> 0
    assert torch.allclose(p, torch.tensor([0.0, 0.5, 1.0, 0.0, 1.0, 1.0, 1.0, 1.0, 0.0], dtype=torch.float64))
    assert p[0].item() == 0.0 and p[2].item() == 1.0
    t = prs_keep_probability(torch.tensor([0.35, 0.5]), torch.tensor([1, 1]), low=0.25, high=0.45)
    assert t.dtype == torch.float32 and torch.allclose(t, torch.tensor([0.5, 1.0]))


def test_prs_keep_mask_is_seeded_and_respects_probability():
    n = 20_000
    coverage = torch.cat([torch.full((n,), 0.35), torch.full((n,), 0.3), torch.full((n,), 0.4), torch.zeros(n)])
    correct = torch.cat([torch.ones(3 * n, dtype=torch.bool), torch.zeros(n, dtype=torch.bool)])
    keep = prs_keep_mask(coverage, correct, 123)
    assert keep.dtype == torch.bool and keep.shape == (4 * n,)
    assert torch.equal(keep, prs_keep_mask(coverage, correct, torch.Generator().manual_seed(123)))
    assert not torch.equal(keep, prs_keep_mask(coverage, correct, 124))
    assert abs(keep[:n].double().mean().item() - 0.5) < 4 * 0.5 / n**0.5
    assert not keep[n : 2 * n].any() and keep[2 * n :].all()  # p = 0 never kept, p = 1 (and incorrect) always


def test_prs_bad_arguments():
    with pytest.raises(ValueError, match="low < high"):
        prs_keep_probability([0.5], [True], low=0.4, high=0.3)
    with pytest.raises(ValueError, match="low < high"):
        prs_keep_probability([0.5], [True], low=0.4, high=0.4)
    with pytest.raises(ValueError, match="shape"):
        prs_keep_probability([0.5, 0.2], [True])
    with pytest.raises(ValueError, match="0/1"):
        prs_keep_probability(np.array([0.5]), np.array([2]))
    with pytest.raises(TypeError, match="generator"):
        prs_keep_mask([0.5], [True], generator="seed")
