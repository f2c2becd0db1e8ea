"""bench/group_sequential.py, the scalar baseline of bench/promotion.py: Lan-DeMets spending
functions and boundaries against their formulas, published tables and simulated null data."""

import math

import numpy as np
import pytest
from bench.group_sequential import alpha_spending, group_sequential_bounds
from scipy.stats import norm

from rag.errors import ConfigError


def test_spending_functions_match_their_formulas():
    t = np.array([0.0, 0.2, 0.5, 1.0])
    obf = alpha_spending(t, 0.025, "obrien_fleming")
    assert obf[0] == 0.0 and obf[-1] == pytest.approx(0.025)
    assert obf[2] == pytest.approx(2 * norm.sf(norm.ppf(1 - 0.0125) / math.sqrt(0.5)))
    poc = alpha_spending(t, 0.025, "pocock")
    assert poc[2] == pytest.approx(0.025 * math.log(1 + (math.e - 1) * 0.5))
    assert np.all(np.diff(obf) > 0) and np.all(poc > obf - 1e-15)  # OBF spends late
    assert alpha_spending(0.5, 0.05, "pocock") == pytest.approx(0.05 * math.log(1 + 0.859141))
    with pytest.raises(ConfigError, match="kind"):
        alpha_spending(0.5, 0.05, "haybittle")
    with pytest.raises(ConfigError, match="t"):
        alpha_spending(1.5, 0.05)


# Lan-DeMets boundaries for 5 equal looks, two-sided 0.05 (ldbounds / Jennison & Turnbull);
# the one-sided 0.025 design has the same upper boundaries to 3 decimals.
LD_OBF = [4.877, 3.357, 2.680, 2.290, 2.031]
LD_POCOCK = [2.438, 2.427, 2.410, 2.397, 2.386]


@pytest.mark.parametrize("sided, alpha", [(2, 0.05), (1, 0.025)])
def test_lan_demets_boundaries_match_published_values(sided, alpha):
    obf = group_sequential_bounds(5, alpha, "obrien_fleming", sided=sided)
    poc = group_sequential_bounds(5, alpha, "pocock", sided=sided)
    assert obf.z == pytest.approx(LD_OBF, abs=0.01)
    assert poc.z == pytest.approx(LD_POCOCK, abs=0.01)
    assert obf.alpha_spent[-1] == pytest.approx(alpha) == poc.alpha_spent[-1]
    assert obf.information == pytest.approx([0.2, 0.4, 0.6, 0.8, 1.0])


def test_a_single_look_is_the_fixed_sample_test():
    assert group_sequential_bounds(1, 0.05, sided=1).z[0] == pytest.approx(1.644854, abs=1e-6)
    assert group_sequential_bounds([1.0], 0.05, "pocock", 2).z[0] == pytest.approx(1.959964,
                                                                                  abs=1e-6)


def _null_z(information, n_trials, n_per_look, seed, known_sd):
    """z-statistics at the looks for cumulative N(0, 1) null data, (n_trials, n_looks)."""
    rng = np.random.default_rng(seed)
    looks = np.round(np.asarray(information) * n_per_look * len(information)).astype(int)
    d = rng.normal(size=(n_trials, looks[-1]))
    sd = [np.ones(n_trials) if known_sd else d[:, :m].std(axis=1, ddof=1) for m in looks]
    return np.stack([d[:, :m].mean(axis=1) / s * math.sqrt(m) for m, s in zip(looks, sd,
                                                                               strict=True)], 1)


def _rate(z, bounds, sided):
    stat = z if sided == 1 else np.abs(z)
    return float(np.mean(np.any(stat >= np.asarray(bounds), axis=1)))


@pytest.mark.parametrize("kind", ["obrien_fleming", "pocock"])
def test_sequential_bounds_hold_the_type_one_error_and_naive_peeking_does_not(kind):
    bounds = group_sequential_bounds(5, 0.05, kind, sided=2)
    # known variance: the z-statistics are exactly a Brownian motion at the looks
    exact = _rate(_null_z(bounds.information, 20_000, 40, 0, True), bounds.z, 2)
    assert abs(exact - 0.05) <= 0.0046  # 3 Monte-Carlo sd at 20,000 trials
    # estimated variance (what a canary's t-like z does): a little liberal (t, not normal, tails)
    z = _null_z(bounds.information, 4000, 100, 1, False)
    assert _rate(z, bounds.z, 2) <= 0.05 + 0.012
    assert _rate(z, [1.959964] * 5, 2) > 0.10  # naive peeking; theory: 0.142 for 5 looks
    uneven = group_sequential_bounds([0.3, 0.55, 1.0], 0.025, kind, sided=1)
    z1 = _null_z(uneven.information, 20_000, 60, 2, True)
    assert abs(_rate(z1, uneven.z, 1) - 0.025) <= 0.0033
    assert _rate(z1, [1.959964] * 3, 1) > 0.04


@pytest.mark.parametrize("kwargs, field", [
    ({"information": 5, "alpha": 0.0}, "alpha"),
    ({"information": [0.5, 0.4, 1.0]}, "information"),
    ({"information": [0.0, 1.0]}, "information"),
    ({"information": 0}, "information"),
    ({"information": 3, "kind": "linear"}, "kind"),
    ({"information": 3, "sided": 0}, "sided"),
])
def test_bounds_reject_bad_input(kwargs, field):
    with pytest.raises(ConfigError) as err:
        group_sequential_bounds(**kwargs)
    assert err.value.field == field
