"""Monte Carlo check that TRLOO gives an unbiased multi-turn policy gradient and GRPO a (N-1)/N-shrunk one.

A two-turn softmax policy over 4 actions: turn 1 draws a1 ~ softmax(theta1), turn 2 draws a2 ~ softmax(theta2[a1]).
Rewards r1[a1] and r2[a1, a2] come per turn; turn 1 is credited with the reward-to-go r1 + r2. The exact gradient
of J = E[r1 + r2] comes from enumerating all 16 action pairs. Each group holds N trajectories of one prompt; the
estimate of a group is mean_i sum_t A_{i,t} grad log pi(a_{i,t}), and groups are i.i.d., so their spread gives
the standard error.

Reproduce the numbers of docs/algorithms.md with `.venv/bin/python tests/test_rl_policy_gradient.py`.
"""

from __future__ import annotations

import functools

import torch

from drkernel.rl import grpo_advantages, reward_to_go, trloo_advantages

DTYPE = torch.float64
THETA1 = torch.tensor([0.6, -0.4, 0.2, 0.0], dtype=DTYPE)
THETA2 = torch.tensor(
    [[0.3, -0.2, 0.5, 0.0], [-0.5, 0.4, 0.1, 0.2], [0.0, 0.7, -0.3, -0.1], [0.2, 0.0, 0.0, 0.6]], dtype=DTYPE
)
# Kernel-like rewards: 0 for a failure, 0.5 + 0.5 * speedup for a correct kernel.
R1 = torch.tensor([0.0, 1.0, 1.25, 0.75], dtype=DTYPE)
R2 = torch.tensor(
    [[1.0, 1.75, 1.75, 1.75], [0.75, 1.75, 2.0, 1.0], [1.75, 1.5, 2.0, 0.0], [2.0, 1.0, 2.0, 1.0]], dtype=DTYPE
)
STOP_ACTION = 0  # in the ragged variant a trajectory whose turn-1 action is 0 ends after turn 1
SEED = 2602


def exact_gradient(ragged: bool = False) -> torch.Tensor:
    """d/d(theta1, theta2) of E[r1 + r2], by enumeration; [20] = 4 turn-1 then 16 turn-2 components."""
    theta1, theta2 = THETA1.clone().requires_grad_(), THETA2.clone().requires_grad_()
    pi1, pi2 = torch.softmax(theta1, 0), torch.softmax(theta2, 1)
    reaches_turn2 = torch.ones(4, dtype=DTYPE)
    if ragged:
        reaches_turn2[STOP_ACTION] = 0
    value = (pi1 * (R1 + reaches_turn2 * (pi2 * R2).sum(1))).sum()
    g1, g2 = torch.autograd.grad(value, (theta1, theta2))
    return torch.cat([g1, g2.reshape(-1)])


def sample_group_estimates(n: int, groups: int, seed: int = SEED, ragged: bool = False) -> dict[str, torch.Tensor]:
    """[groups, 20] per-group gradient estimates of TRLOO and GRPO (self-inclusive mean, no std)."""
    gen = torch.Generator().manual_seed(seed)
    pi1, pi2 = torch.softmax(THETA1, 0), torch.softmax(THETA2, 1)
    b = groups * n
    a1 = torch.multinomial(pi1, b, replacement=True, generator=gen)
    a2 = torch.multinomial(pi2[a1], 1, generator=gen).squeeze(1)
    turn_mask = torch.ones(b, 2, dtype=torch.bool)
    if ragged:
        turn_mask[:, 1] = a1 != STOP_ACTION
    returns = reward_to_go(torch.stack([R1[a1], R2[a1, a2]], 1), mask=turn_mask)  # [b, 2]

    # grad log softmax(theta)[a] = onehot(a) - softmax(theta); turn 2 only touches row a1 of theta2.
    eye = torch.eye(4, dtype=DTYPE)
    score1 = eye[a1] - pi1
    score2 = torch.zeros(b, 4, 4, dtype=DTYPE)
    score2[torch.arange(b), a1] = eye[a2] - pi2[a1]
    scores = [score1, score2.reshape(b, 16)]

    prompt = torch.arange(groups).repeat_interleave(n)  # one prompt per group
    rows = turn_mask.reshape(-1)  # flattened (sample, turn) rows that exist
    prompt_ids = prompt.repeat_interleave(2)[rows]
    turn_ids = torch.arange(2).repeat(b)[rows]
    out = {}
    for name, estimator in (("trloo", trloo_advantages), ("grpo", grpo_advantages)):
        adv = torch.zeros(b * 2, dtype=DTYPE)
        adv[rows] = estimator(returns.reshape(-1)[rows], prompt_ids, turn_ids)
        adv = adv.reshape(b, 2)
        grad = torch.cat([adv[:, :1] * scores[0], adv[:, 1:] * scores[1]], 1)  # absent turn 2: A = 0
        out[name] = grad.reshape(groups, n, 20).mean(1)
    return out


@functools.lru_cache(maxsize=None)
def monte_carlo(n: int, groups: int, seed: int = SEED, ragged: bool = False) -> dict[str, object]:
    """Estimates, standard errors and the projection ratio <estimate, exact> / |exact|^2 with its standard error."""
    exact = exact_gradient(ragged)
    result: dict[str, object] = {"n": n, "groups": groups, "seed": seed, "ragged": ragged, "exact": exact}
    for name, per_group in sample_group_estimates(n, groups, seed, ragged).items():
        ratios = per_group @ exact / exact.dot(exact)  # per group, so the ratio gets a standard error too
        result[name] = {
            "estimate": per_group.mean(0),
            "se": per_group.std(0) / groups**0.5,
            "ratio": ratios.mean().item(),
            "ratio_se": (ratios.std() / groups**0.5).item(),
        }
    return result


GROUPS = 40_000


def _max_z(estimate: torch.Tensor, target: torch.Tensor, se: torch.Tensor) -> float:
    """Largest |estimate - target| in standard errors; a component with no spread must match exactly."""
    random = se > 0
    if not torch.equal(estimate[~random], target[~random]):
        return float("inf")
    return ((estimate - target).abs()[random] / se[random]).max().item()


def test_exact_gradient_is_clearly_nonzero():
    assert (exact_gradient().abs() > 1e-2).all()
    ragged = exact_gradient(ragged=True)
    stopped = torch.zeros(20, dtype=torch.bool)
    stopped[4 + 4 * STOP_ACTION : 8 + 4 * STOP_ACTION] = True  # theta2[STOP_ACTION] is never used
    assert (ragged[stopped] == 0).all() and (ragged[~stopped].abs() > 1e-2).all()


def test_trloo_is_unbiased():
    for n in (2, 4):
        mc = monte_carlo(n, GROUPS)
        est = mc["trloo"]
        assert _max_z(est["estimate"], mc["exact"], est["se"]) < 4, n
        assert abs(est["ratio"] - 1) < 4 * est["ratio_se"], n


def test_trloo_is_unbiased_with_ragged_trajectories():
    mc = monte_carlo(4, GROUPS, ragged=True)
    est = mc["trloo"]
    assert _max_z(est["estimate"], mc["exact"], est["se"]) < 4
    assert abs(est["ratio"] - 1) < 4 * est["ratio_se"]


def test_grpo_is_shrunk_by_n_minus_one_over_n():
    for n in (2, 4):
        mc = monte_carlo(n, GROUPS)
        est, shrink = mc["grpo"], (n - 1) / n
        assert _max_z(est["estimate"], shrink * mc["exact"], est["se"]) < 4, n
        assert abs(est["ratio"] - shrink) < 4 * est["ratio_se"], n
        # ... and clearly not the exact gradient: the bias is many standard errors wide.
        assert (1 - est["ratio"]) > 10 * est["ratio_se"], n
        assert _max_z(est["estimate"], mc["exact"], est["se"]) > 10, n


def _ratio(estimate: torch.Tensor, exact: torch.Tensor) -> float:
    return (estimate.dot(exact) / exact.dot(exact)).item()


def _report() -> None:
    torch.set_printoptions(precision=4, linewidth=160, sci_mode=False)
    for n, ragged in ((2, False), (4, False), (4, True)):
        mc = monte_carlo(n, GROUPS, ragged=ragged)
        print(f"\nN={n} groups={GROUPS} seed={SEED} ragged={ragged}")
        print("exact gradient  ", mc["exact"])
        for name in ("trloo", "grpo"):
            est = mc[name]
            print(f"{name:5s} estimate  ", est["estimate"])
            print(f"{name:5s} std error ", est["se"])
            turn1, turn2 = (_ratio(est["estimate"][part], mc["exact"][part]) for part in (slice(0, 4), slice(4, 20)))
            print(
                f"{name:5s} ratio <est,exact>/|exact|^2 = {est['ratio']:.4f} +- {est['ratio_se']:.4f}"
                f"  (turn 1: {turn1:.4f}, turn 2: {turn2:.4f};"
                f" max |z| vs exact: {_max_z(est['estimate'], mc['exact'], est['se']):.1f})"
            )
        print(f"(N-1)/N = {(n - 1) / n:.4f}")


if __name__ == "__main__":
    _report()
