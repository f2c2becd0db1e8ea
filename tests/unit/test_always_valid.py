"""rl.stats.always_valid: time-uniform coverage of the confidence sequence, its sample size,
CUPED's variance reduction."""

import numpy as np
import pytest

from rag.errors import ConfigError
from rl.stats.always_valid import (
    cuped,
    paired_cs,
    radius_factor,
    required_n,
    rho2_for,
    unpaired_cs,
)


def _running(x):
    n = np.arange(1, x.shape[1] + 1)
    return n, np.cumsum(x, axis=1), np.cumsum(x * x, axis=1)


def test_confidence_sequence_covers_at_every_look_at_once():
    rng = np.random.default_rng(0)
    x = rng.standard_normal((4000, 600)) * 0.3 + 0.1  # true mean 0.1
    n, s, ss = _running(x)
    _, lo, hi = paired_cs(n, s, ss, 0.05, rho2_for(300, 0.05))
    looks = n >= 20
    miss = np.any(((lo > 0.1) | (hi < 0.1))[:, looks], axis=1).mean()
    assert miss <= 0.05
    # the fixed-sample 95% interval read at every look misses far more often
    m = s / n
    se = np.sqrt(np.maximum(ss / n - m * m, 0) * n / np.maximum(n - 1, 1) / n)
    naive = np.any((np.abs(m - 0.1) > 1.96 * se)[:, looks], axis=1).mean()
    assert naive > 2 * miss and naive > 0.15


def test_unpaired_sequence_covers_the_difference():
    rng = np.random.default_rng(1)
    c = rng.standard_normal((2000, 300)) + 0.2
    s = rng.standard_normal((2000, 300))
    (n, sc, ssc), (_, s_s, ss_s) = _running(c), _running(s)
    d, lo, hi = unpaired_cs(n, sc, ssc, n, s_s, ss_s, 0.05, rho2_for(150, 0.05))
    looks = n >= 20
    assert np.any(((lo > 0.2) | (hi < 0.2))[:, looks], axis=1).mean() <= 0.05
    assert abs(float(np.mean(d[:, -1])) - 0.2) < 0.01


def test_radius_is_wider_than_one_look_and_tightest_near_its_plan():
    f = radius_factor(np.array([100, 1000, 10000]), 0.05, rho2_for(1000, 0.05))
    assert np.all(f > 1.96)
    assert f[1] < 3.1
    # tuned at 1000, the sequence is narrower at 1000 than one tuned at 100 or 10000
    at = [float(radius_factor(1000, 0.05, rho2_for(p, 0.05))) for p in (100, 1000, 10000)]
    assert at[1] < at[0] and at[1] < at[2]
    assert np.isinf(radius_factor(0, 0.05, 0.1))


def test_required_n_gives_about_the_power_it_promises():
    n = required_n(0.1, 1.0, 0.05, 0.8)
    assert 600 < n < 2000
    rng = np.random.default_rng(2)
    x = rng.standard_normal((2000, n)) + 0.1
    nn, s, ss = _running(x)
    _, lo, _ = paired_cs(nn, s, ss, 0.05, rho2_for(n, 0.05))
    power = np.any(lo[:, 19:] > 0, axis=1).mean()
    assert 0.75 <= power <= 0.95
    assert required_n(0.0, 1.0, 0.05) == 10_000_000
    assert required_n(0.1, 0.0, 0.05) == 2
    with pytest.raises(ConfigError, match="sd"):
        required_n(0.1, -1.0, 0.05)


def test_cuped_keeps_the_mean_and_removes_the_covariates_share_of_variance():
    rng = np.random.default_rng(3)
    x = rng.standard_normal(20000)
    y = 2.0 + 0.8 * x + 0.6 * rng.standard_normal(20000)  # corr² = 0.64
    adj, theta = cuped(y, x)
    assert theta == pytest.approx(0.8, abs=0.02)
    assert adj.mean() == pytest.approx(y.mean())
    assert adj.var() / y.var() == pytest.approx(0.36, abs=0.02)
    with pytest.raises(ConfigError, match="x"):
        cuped(y, x[:10])
