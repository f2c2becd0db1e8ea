"""bench/router_embedding.py without data: the principal components it adds (fitted on the
fitting rows only) and the adoption rule fixed before its run."""

from __future__ import annotations

import numpy as np
from bench.router_embedding import PAIRED, principal_components, project, verdict


def test_components_are_orthonormal_and_fitted_on_the_given_rows_only():
    rng = np.random.default_rng(0)
    E = rng.normal(size=(60, 12)) * np.r_[5.0, np.linspace(1.0, 0.1, 11)]  # one dominant axis
    fit = E[:40]
    mu, axes = principal_components(fit, 4)
    assert axes.shape == (4, 12)
    np.testing.assert_allclose(axes @ axes.T, np.eye(4), atol=1e-10)
    np.testing.assert_allclose(mu, fit.mean(axis=0))
    Z = project(fit, (mu, axes))
    assert Z.dtype == np.float32 and Z.shape == (40, 4)
    np.testing.assert_allclose(Z.mean(axis=0), 0.0, atol=1e-5)
    var = Z.var(axis=0)
    assert np.all(np.diff(var) <= 1e-6)  # the first axis carries the most variance
    assert abs(axes[0, 0]) > 0.9  # ... and it is the first coordinate's direction
    # rows the components were not fitted on are projected with the fitted mean and axes
    held = project(E[40:], (mu, axes))
    np.testing.assert_allclose(held, ((E[40:] - mu) @ axes.T).astype(np.float32), rtol=1e-6)
    # fitting on other rows gives another mean: nothing is fitted on held-out rows silently
    assert not np.allclose(principal_components(E, 4)[0], mu)


def _row(ds: str, value: float, lo: float, hi: float) -> dict:
    return {"dataset": ds, "system": PAIRED, "metric": "delta_reward", "value": value,
            "ci_low": lo, "ci_high": hi, "n": 10}


def test_the_rule_needs_a_positive_mean_and_no_dataset_significantly_worse():
    ds = ["a", "b", "c"]
    ok = [_row("a", 0.01, -0.01, 0.03), _row("b", 0.0, -0.02, 0.02),
          _row("c", -0.001, -0.01, 0.008)]
    assert verdict(ok, ds) == (np.mean([0.01, 0.0, -0.001]), [], True)
    worse = ok[:2] + [_row("c", -0.004, -0.008, -0.001)]  # mean still > 0, but c is worse
    mean, bad, adopt = verdict(worse, ds)
    assert mean > 0 and bad == ["c"] and not adopt
    flat = [_row(d, 0.0, -0.01, 0.01) for d in ds]  # no gain is no adoption
    assert verdict(flat, ds)[2] is False
