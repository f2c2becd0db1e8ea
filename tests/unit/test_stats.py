"""rl.stats: bootstrap, permutation test, power analysis, group sequential testing."""

import itertools
import math

import numpy as np
import pytest
from scipy.stats import norm

from rag.errors import ConfigError
from rl.stats.bootstrap import bootstrap_mean_ci, paired_bootstrap, permutation_test
from rl.stats.power import power, required_sample_size
from rl.stats.sequential import (
    SequentialTest,
    alpha_spending,
    classic_bounds,
    group_sequential_bounds,
)

# ----------------------------------------------------------------------------------- bootstrap


def test_bootstrap_ci_covers_the_true_mean_at_about_the_nominal_rate():
    rng = np.random.default_rng(1)
    hits = 0
    for _ in range(100):
        x = rng.normal(0.5, 0.2, size=100)
        res = bootstrap_mean_ci(x, n_resamples=2000, seed=int(rng.integers(1 << 30)))
        assert res.ci_low < res.mean_diff < res.ci_high
        hits += res.ci_low <= 0.5 <= res.ci_high
    assert 88 <= hits <= 99  # 95% nominal; the percentile bootstrap is slightly liberal


def test_bootstrap_is_deterministic_given_the_seed():
    x = np.random.default_rng(2).exponential(size=300).tolist()  # lists are accepted
    assert bootstrap_mean_ci(x, seed=7) == bootstrap_mean_ci(x, seed=7)
    assert bootstrap_mean_ci(x, seed=7) != bootstrap_mean_ci(x, seed=8)
    a, b = x[:150], x[150:]
    assert paired_bootstrap(a, b, seed=3) == paired_bootstrap(np.array(a), np.array(b), seed=3)


def test_identical_arrays_give_zero_difference_and_a_degenerate_ci():
    a = np.random.default_rng(3).random(50)
    res = paired_bootstrap(a, a.copy())
    assert (res.mean_diff, res.ci_low, res.ci_high, res.p_value, res.n) == (0.0, 0.0, 0.0, 1.0, 50)


def test_bootstrap_ci_matches_normal_theory_on_a_large_sample():
    x = np.random.default_rng(4).exponential(2.0, size=5000)  # skewed, but n is large
    res = bootstrap_mean_ci(x, n_resamples=4000, seed=0)
    half = 1.959964 * x.std(ddof=1) / math.sqrt(x.size)
    assert res.mean_diff == pytest.approx(x.mean())
    assert res.ci_low == pytest.approx(x.mean() - half, abs=0.06 * half)
    assert res.ci_high == pytest.approx(x.mean() + half, abs=0.06 * half)


def test_paired_bootstrap_direction_is_candidate_minus_baseline():
    rng = np.random.default_rng(5)
    base = rng.random(200)
    better = base + 0.05 + rng.normal(0, 0.05, 200)
    res = paired_bootstrap(base, better, n_resamples=5000)
    assert 0.04 < res.ci_low < res.mean_diff < res.ci_high < 0.065
    assert res.p_value == pytest.approx(2 / 5001)  # no resample crosses 0
    assert paired_bootstrap(better, base, n_resamples=5000).mean_diff == -res.mean_diff
    # a single observation is allowed: every resample equals it
    one = bootstrap_mean_ci([0.3])
    assert (one.ci_low, one.ci_high) == (0.3, 0.3)


@pytest.mark.parametrize("call, field", [
    (lambda: bootstrap_mean_ci([]), "x"),
    (lambda: bootstrap_mean_ci([1.0, float("nan")]), "x"),
    (lambda: bootstrap_mean_ci([[1.0, 2.0]]), "x"),
    (lambda: bootstrap_mean_ci([1.0, 2.0], ci=1.0), "ci"),
    (lambda: bootstrap_mean_ci([1.0, 2.0], n_resamples=0), "n_resamples"),
    (lambda: paired_bootstrap([1.0, 2.0], [1.0]), "b"),
    (lambda: paired_bootstrap([], [1.0]), "a"),
    (lambda: permutation_test([1.0, 2.0], [1.0, 2.0, 3.0], paired=True), "b"),
    (lambda: permutation_test([1.0], [], paired=False), "b"),
    (lambda: permutation_test([1.0], [2.0], n_permutations=-1), "n_permutations"),
])
def test_bad_input_names_the_argument(call, field):
    with pytest.raises(ConfigError) as err:
        call()
    assert err.value.field == field


# --------------------------------------------------------------------------------- permutation


def test_permutation_p_is_small_for_a_clear_shift():
    rng = np.random.default_rng(6)
    a = rng.normal(0.0, 1.0, 40)
    b = a + 0.5 + rng.normal(0, 0.3, 40)
    assert permutation_test(a, b, n_permutations=5000) == pytest.approx(1 / 5001)
    c = rng.normal(1.5, 1.0, 40)
    assert permutation_test(a, c, n_permutations=5000, paired=False) < 0.001
    assert permutation_test(a, b, seed=4) == permutation_test(a, b, seed=4)


def test_paired_permutation_p_matches_exact_enumeration():
    d = np.random.default_rng(7).normal(0.7, 1.0, 10)
    signs = np.array(list(itertools.product([-1.0, 1.0], repeat=10)))
    exact = np.mean(np.abs(signs @ d) >= abs(d.sum()) - 1e-12)
    mc = permutation_test(np.zeros(10), d, n_permutations=20_000, seed=0)
    assert 0.02 < exact < 0.5
    assert mc == pytest.approx(exact, abs=0.01)


@pytest.mark.parametrize("paired", [True, False])
def test_permutation_p_is_roughly_uniform_under_the_null(paired):
    rng = np.random.default_rng(8)
    ps = np.array([permutation_test(rng.normal(size=20), rng.normal(size=20),
                                    n_permutations=1000, seed=i, paired=paired)
                   for i in range(200)])
    assert 0.02 <= np.mean(ps <= 0.05) <= 0.09
    assert 0.40 <= np.mean(ps <= 0.5) <= 0.60


# ------------------------------------------------------------------------------ power analysis


def test_sample_size_matches_the_textbook_formula():
    # ceil(((1.959964 + 0.841621) * 0.1 / 0.03) ** 2) = ceil(87.21) = 88
    assert required_sample_size(0.03, 0.1, alpha=0.05, power=0.8) == 88
    assert required_sample_size(-0.03, 0.1) == 88  # the sign of the effect is irrelevant
    assert required_sample_size(0.03, 0.2) == 349
    assert required_sample_size(0.03, 0.1, paired=False) == 175  # per group: ceil(2 * 87.21)
    assert required_sample_size(0.03, 0.1, sided=1) == 69  # ceil(((1.645 + 0.842) / 0.3)^2)
    assert power(88, 0.03, 0.1) >= 0.8 > power(87, 0.03, 0.1)
    assert power(88, 0.03, 0.1) == pytest.approx(0.8035, abs=1e-3)
    assert power(10_000, 0.03, 0.1) == pytest.approx(1.0)


def test_power_matches_a_simulated_paired_z_test():
    rng = np.random.default_rng(9)
    d = rng.normal(0.03, 0.1, size=(4000, 88))
    z = d.mean(axis=1) / (d.std(axis=1, ddof=1) / math.sqrt(88))
    assert np.mean(np.abs(z) >= 1.959964) == pytest.approx(power(88, 0.03, 0.1), abs=0.03)


@pytest.mark.parametrize("kwargs, field", [
    ({"delta": 0.0, "sd": 0.1}, "delta"),
    ({"delta": 0.03, "sd": 0.0}, "sd"),
    ({"delta": 0.03, "sd": 0.1, "alpha": 1.0}, "alpha"),
    ({"delta": 0.03, "sd": 0.1, "power": 0.0}, "power"),
    ({"delta": 0.03, "sd": 0.1, "sided": 3}, "sided"),
])
def test_sample_size_rejects_bad_input(kwargs, field):
    with pytest.raises(ConfigError) as err:
        required_sample_size(**kwargs)
    assert err.value.field == field


# ----------------------------------------------------------------------- sequential: boundaries


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


def test_classic_pocock_and_obrien_fleming_match_published_values():
    poc = classic_bounds(5, 0.05, "pocock", sided=2)
    assert poc.z == pytest.approx([2.413] * 5, abs=0.005)
    obf = classic_bounds(5, 0.05, "obrien_fleming", sided=2)
    assert obf.z == pytest.approx([4.562, 3.226, 2.634, 2.281, 2.040], abs=0.005)
    assert obf.alpha_spent[-1] == pytest.approx(0.05)


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
    # estimated variance (what SequentialTest does): a little liberal (t, not normal, tails)
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


# ------------------------------------------------------------------------ sequential: the test


def test_sequential_test_agrees_with_the_vectorised_boundaries():
    bounds = group_sequential_bounds(4, 0.05, "obrien_fleming", sided=1)
    rng = np.random.default_rng(10)
    rejected = 0
    for _ in range(40):
        d = rng.normal(0.25, 1.0, 200)
        test = SequentialTest(4, alpha=0.05)
        for k, m in enumerate([50, 100, 150, 200]):
            res = test.look(d[:m])
            z = d[:m].mean() / d[:m].std(ddof=1) * math.sqrt(m)
            assert (res.look, res.n, res.z) == (k + 1, m, pytest.approx(z))
            assert res.boundary == pytest.approx(bounds.z[k])
            assert res.reject == (z >= bounds.z[k])
            if res.reject:
                rejected += 1
                break
        assert test.stopped
    assert 20 <= rejected <= 40  # power against a 0.25 sd effect at n = 200 is ~0.9


def test_sequential_test_refuses_looks_beyond_the_plan_and_after_stopping():
    rng = np.random.default_rng(11)
    test = SequentialTest(3, alpha=0.05, kind="pocock")
    d = rng.normal(0.0, 1.0, 90)
    results = [test.look(d[:m]) for m in (30, 60, 90)]
    assert not any(r.reject for r in results)
    assert results[-1].alpha_spent == pytest.approx(0.05)
    with pytest.raises(ConfigError) as err:
        test.look(rng.normal(size=120))
    assert err.value.field == "look"

    strong = SequentialTest(3)
    first = strong.look(np.full(20, 0.1) + rng.normal(0, 0.01, 20))
    assert first.reject and first.z > 30 and first.boundary > 3
    with pytest.raises(ConfigError, match="rejected"):
        strong.look(rng.normal(size=40))


def test_sequential_test_recomputes_boundaries_for_off_plan_looks():
    test = SequentialTest(n_per_look=[100, 200, 300], alpha=0.025)
    assert test.plan.information == pytest.approx([1 / 3, 2 / 3, 1.0])
    d = np.random.default_rng(12).normal(0.0, 1.0, 300)
    first = test.look(d[:150])  # half the information, not a third
    final = test.look(d)  # the last planned look spends all of alpha
    expected = group_sequential_bounds([0.5, 1.0], 0.025, sided=1)
    assert (first.information, final.information) == (0.5, 1.0)
    assert [first.boundary, final.boundary] == pytest.approx(expected.z, abs=1e-6)
    assert final.alpha_spent == pytest.approx(0.025)
    assert test.stopped and len(test.history) == 2  # n_max reached at the second of 3 looks


def test_sequential_test_two_sided_and_bad_input():
    test = SequentialTest(2, alpha=0.05, kind="pocock", alternative="two-sided")
    res = test.look(np.full(30, -0.2) + np.random.default_rng(13).normal(0, 0.1, 30))
    assert res.reject and res.z < 0
    assert res.boundary == pytest.approx(2.157, abs=0.01)  # Lan-DeMets Pocock, 2 looks
    for call, field in [
        (lambda: SequentialTest(3, alternative="less"), "alternative"),
        (lambda: SequentialTest(3, alpha=1.5), "alpha"),
        (lambda: SequentialTest(n_per_look=[100, 50]), "n_per_look"),
        (lambda: SequentialTest(3).look([0.1]), "diffs_so_far"),
        (lambda: SequentialTest(n_per_look=[10, 20.5, 30]), "n_per_look"),
        (lambda: SequentialTest(3, n_per_look=[10, 20, 30]), "n_per_look"),
    ]:
        with pytest.raises(ConfigError) as err:
            call()
        assert err.value.field == field
    shrinking = SequentialTest(3)
    shrinking.look(np.random.default_rng(0).normal(size=30))
    with pytest.raises(ConfigError, match="every difference"):
        shrinking.look(np.zeros(10))
