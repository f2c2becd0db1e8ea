"""rl.stats: bootstrap, permutation test, power analysis."""

import itertools
import math

import numpy as np
import pytest

from rag.errors import ConfigError
from rl.stats.bootstrap import bootstrap_mean_ci, paired_bootstrap, permutation_test
from rl.stats.power import power, required_sample_size

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
