import math

import pytest
import torch

from drkernel.rl import RewardConfig, reward, rewards
from drkernel.schema import EvalResult, Profile, Status


def _result(correct=True, speedup=None, coverage=None, meaningful=True, status=None, hack_reasons=()):
    profile = None if coverage is None and not meaningful else Profile(coverage=coverage, meaningful=meaningful)
    return EvalResult(
        status=status or (Status.CORRECT.value if correct else Status.INCORRECT.value),
        correct=correct,
        speedup=speedup,
        profile=profile,
        hack_reasons=list(hack_reasons),
    )


PR = RewardConfig(profiling_reward=True)


@pytest.mark.parametrize(
    "result, config, expected",
    [
        (_result(speedup=1.0), None, 1.0),
        (_result(speedup=2.0), None, 1.5),
        (_result(speedup=0.5), None, 0.75),
        (_result(speedup=3.0), None, 2.0),
        (_result(speedup=10.0), None, 2.0),  # capped at 3x
        (_result(speedup=math.inf), None, 2.0),
        (_result(speedup=None), None, 0.5),  # performance not measured: base only
        (_result(speedup=math.nan), None, 0.5),
        (_result(speedup=1.0, coverage=0.8), None, 1.0),  # coverage ignored with PR off
        (_result(speedup=1.0, coverage=0.8), PR, 1.4),
        (_result(speedup=1.0, coverage=1.7), PR, 1.5),  # coverage clamped to [0, 1]
        (_result(speedup=1.0, coverage=0.8, meaningful=False), PR, 1.0),  # launch counts only: coverage 0
        (_result(speedup=1.0, coverage=None, meaningful=True), PR, 1.0),
        (_result(speedup=1.0, coverage=None, meaningful=False), PR, 1.0),  # no profile at all
        (_result(speedup=2.0), RewardConfig(base=1.0, speedup_weight=0.25, speedup_cap=1.5), 1.375),
    ],
)
def test_reward_values(result, config, expected):
    assert reward(result, config) == pytest.approx(expected, abs=1e-12)
    if result.speedup is None or math.isfinite(result.speedup):  # JSON has no infinity: to_dict makes it null
        assert reward(result.to_dict(), config) == pytest.approx(expected, abs=1e-12)


LOG_AT_CAP = 0.5 + 0.5 * (1 + math.log2(3))


@pytest.mark.parametrize(
    "speedup, expected",
    [
        (1.0, 1.0),  # agrees with linear at 1x and 2x
        (2.0, 1.5),
        (1.5, 0.5 + 0.5 * (1 + math.log2(1.5))),
        (0.5, 0.5),  # 2x slower or worse: base only, never below a correct kernel's base
        (0.25, 0.5),
        (0.0, 0.5),
        (3.0, LOG_AT_CAP),
        (8.0, LOG_AT_CAP),
    ],
)
def test_log_transform(speedup, expected):
    assert reward(_result(speedup=speedup), RewardConfig(speedup_transform="log")) == pytest.approx(expected)


@pytest.mark.parametrize(
    "result",
    [
        _result(correct=False, speedup=50.0, coverage=1.0, status=Status.HACKED.value, hack_reasons=["timing"]),
        _result(correct=False, speedup=2.0, status=Status.INCORRECT.value),
        _result(correct=False, speedup=None, status=Status.COMPILE_ERROR.value),
        # a status that claims success does not override the flag
        _result(correct=False, speedup=2.0, status=Status.CORRECT.value),
        # inconsistent records that carry a hacking verdict earn nothing either
        _result(correct=True, speedup=50.0, status=Status.HACKED.value),
        _result(correct=True, speedup=50.0, hack_reasons=["stream"]),
    ],
)
def test_no_credit_without_correctness(result):
    for config in (None, PR, RewardConfig(speedup_transform="log")):
        assert reward(result, config) == 0.0
        assert reward(result.to_dict(), config) == 0.0


def test_reward_on_json_round_trip_and_minimal_dict():
    result = _result(speedup=2.0, coverage=0.5)
    assert reward(EvalResult.from_json(result.to_json()), PR) == pytest.approx(1.75)
    assert reward({"correct": True, "speedup": 2.0}) == 1.5
    assert reward({"correct": True, "speedup": 2.0, "profile": None}, PR) == 1.5


def test_rewards_vectorized():
    out = rewards([_result(speedup=1.0), {"correct": False, "speedup": 9.0}, _result(speedup=None)])
    assert isinstance(out, torch.Tensor) and out.dtype == torch.get_default_dtype()
    assert out.tolist() == [1.0, 0.0, 0.5]
    assert rewards([], dtype=torch.float64).shape == (0,)


def test_bad_arguments():
    with pytest.raises(ValueError):
        RewardConfig(speedup_cap=0.0)
    with pytest.raises(ValueError):
        RewardConfig(speedup_transform="sqrt")
    with pytest.raises(ValueError):
        reward({"speedup": 2.0})
    with pytest.raises(TypeError):
        reward(1.5)


def test_measured_coverage_reads_profiles_and_dicts_alike():
    from drkernel.rl import measured_coverage
    from drkernel.schema import Profile

    assert measured_coverage(None) is None
    assert measured_coverage({"coverage": 0.4, "meaningful": False}) is None  # CPU: launch counts only
    assert measured_coverage({"coverage": float("nan"), "meaningful": True}) is None
    assert measured_coverage({"coverage": 0.4, "meaningful": True}) == 0.4
    assert measured_coverage(Profile(coverage=0.25, meaningful=True)) == 0.25
    assert measured_coverage(Profile(coverage=1.5, meaningful=True)) == 1.0
