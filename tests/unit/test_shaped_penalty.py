"""PPO's shaped gate penalty (`RewardSpec.shaped_reward`): a gate missed by a little costs a
little, a gate missed by >= 10% costs the full λ, passing gates cost nothing, and the reward
itself (what reports and incumbents use) keeps its cliff."""

import numpy as np
import pytest

from rl.kernel.reward import SHAPING_BAND, RewardSpec, StepMetrics
from rl.kernel.settings import Thresholds, TunerSettings


def _spec():
    return RewardSpec.from_settings(TunerSettings.defaults(),
                                    Thresholds(faithfulness=0.8, relevancy=0.5,
                                               p95_latency_ms=100.0))


def _m(f, r, p95, se=0.0):
    return StepMetrics(f, r, p95, 200.0, se)


def test_shaped_penalty_grows_with_the_violation_and_saturates():
    spec = _spec()
    lam = spec.weights.lambda_
    ok = _m(0.9, 0.6, 50.0)
    c = spec.continuous(0.9, 0.6, 50.0, 200.0)
    assert spec.shaped_reward(ok) == pytest.approx(c) == pytest.approx(spec.reward(ok)[0])
    # F 2% short of its 0.8 floor: 0.2 of a gate (the cliff charges a whole one)
    near = _m(0.8 * 0.98, 0.6, 50.0)
    c_near = spec.continuous(0.8 * 0.98, 0.6, 50.0, 200.0)
    assert spec.shaped_reward(near) == pytest.approx(c_near - lam * 0.02 / SHAPING_BAND)
    assert spec.reward(near)[0] == pytest.approx(c_near - lam)
    # p95 30% over the ceiling and R 50% short: two full gates
    far = _m(0.9, 0.25, 130.0)
    assert spec.shaped_reward(far) == pytest.approx(
        spec.continuous(0.9, 0.25, 130.0, 200.0) - 2 * lam)


def test_shaped_reward_ignores_instability_and_vectorises():
    spec = _spec()
    unstable = _m(0.9, 0.6, 50.0, se=1.0)
    assert spec.shaped_reward(unstable) > spec.reward(unstable)[0]
    m = StepMetrics(np.array([0.9, 0.784]), np.array([0.6, 0.6]), np.array([50.0, 50.0]),
                    np.array([200.0, 200.0]), np.array([0.0, 0.0]))
    got = spec.shaped_reward(m)
    assert got.shape == (2,)
    assert got[0] == pytest.approx(spec.shaped_reward(_m(0.9, 0.6, 50.0)))
    assert got[1] == pytest.approx(spec.shaped_reward(_m(0.784, 0.6, 50.0)))
