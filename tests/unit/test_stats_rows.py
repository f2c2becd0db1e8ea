"""Result rows (`rl.stats.rows`): the schema, the paired intervals, and the one rule for
non-finite numbers."""

from __future__ import annotations

import math

import numpy as np
import pytest

from rag.errors import ConfigError
from rl.stats.bootstrap import bootstrap_mean_ci, paired_bootstrap
from rl.stats.rows import cost_pct, delta_row, metric_row, plain_row, ratio_row

KEYS = ["dataset", "system", "metric", "value", "ci_low", "ci_high", "n"]


def test_metric_row_schema_and_interval():
    x = np.random.default_rng(0).normal(0.5, 0.1, 200)
    r = metric_row("d", "s", "Reward", x, seed=3)
    assert list(r) == KEYS and r["metric"] == "reward" and r["n"] == 200
    b = bootstrap_mean_ci(x, seed=3)
    assert (r["value"], r["ci_low"], r["ci_high"]) == (b.mean_diff, b.ci_low, b.ci_high)
    assert r["ci_low"] < r["value"] < r["ci_high"]
    assert plain_row("d", "s", "N", 4, 4) == {"dataset": "d", "system": "s", "metric": "n",
                                              "value": 4.0, "ci_low": None, "ci_high": None,
                                              "n": 4}


def test_delta_row_is_the_paired_bootstrap_of_got_minus_base():
    rng = np.random.default_rng(1)
    base = rng.random(150)
    got = base + 0.05 + rng.normal(0, 0.01, 150)
    r = delta_row("d", "a - b", "delta_reward", base, got, seed=2)
    p = paired_bootstrap(base, got, seed=2)
    assert r["value"] == pytest.approx(p.mean_diff, abs=1e-15)
    assert (r["ci_low"], r["ci_high"], r["n"]) == (p.ci_low, p.ci_high, 150)
    assert 0.04 < r["ci_low"] < r["ci_high"] < 0.06
    with pytest.raises(ConfigError):
        delta_row("d", "s", "m", base, got[:-1])


def test_non_finite_values_give_a_nan_interval_not_an_error_or_a_drop():
    x = np.array([0.2, np.nan, 0.4])
    r = metric_row("d", "s", "m", x)
    assert math.isnan(r["value"]) and math.isnan(r["ci_low"]) and math.isnan(r["ci_high"])
    assert r["n"] == 3
    d = delta_row("d", "s", "m", np.array([1.0, 2.0]), np.array([1.0, np.inf]))
    assert d["value"] == math.inf and math.isnan(d["ci_low"])
    one = metric_row("d", "s", "m", [0.7])
    assert (one["value"], one["ci_low"], one["ci_high"]) == (0.7, 0.7, 0.7)


def test_ratio_row_drops_only_non_finite_resamples():
    # half the queries cost nothing in the baseline: some resamples have a zero denominator
    den = np.array([0.0, 0.0, 0.0, 10.0])
    num = np.array([1.0, 1.0, 1.0, 12.0])
    r = ratio_row("d", "s", "delta_cost_pct", num, den, cost_pct, seed=0)
    assert r["value"] == pytest.approx(100.0 * (15 / 10 - 1.0))
    assert np.isfinite(r["ci_low"]) and np.isfinite(r["ci_high"])
    assert r["ci_low"] <= r["value"] <= r["ci_high"]
    none = ratio_row("d", "s", "m", num, np.zeros(4), cost_pct, seed=0)
    assert math.isnan(none["ci_low"]) and math.isnan(none["ci_high"])
    assert not np.isfinite(none["value"])
    assert cost_pct(110.0, 100.0) == pytest.approx(10.0)
