"""rl.stats.ope on the seeded bandit simulator (tests/support/bandit_world.py), where the true
policy value is known."""

import numpy as np
import pytest
from tests.support.bandit_world import BanditSimulator

from rag.errors import ConfigError
from rl.stats.ope import (
    BanditLog,
    cross_fit_q,
    direct_method,
    doubly_robust,
    doubly_robust_difference,
    estimate_all,
    fit_reward_model,
    ips,
    snips,
)


@pytest.fixture(scope="module")
def sim():
    return BanditSimulator(n_actions=5, dim=5, seed=0)


@pytest.fixture(scope="module")
def replications(sim):
    """100 seeded logged data sets of 1000 rounds, every estimator on each, plus the truth."""
    policy = sim.target_policy(0.5)
    truth = sim.true_value(policy)
    runs = []
    for seed in range(100):
        d = sim.sample(1000, seed=seed)
        pi = policy(d.x)
        est = estimate_all(_log(d), pi, seed=seed)
        est["dr_oracle"] = doubly_robust(_log(d), pi, q_hat=sim.expected_reward(d.x))
        runs.append(est)
    return truth, runs


def _log(d):
    """The simulator's sample as the estimators' BanditLog."""
    return BanditLog(d.a, d.p, d.r, d.x)


def _column(runs, name, field="value"):
    return np.array([getattr(r[name], field) for r in runs])


# ---------------------------------------------------------------------------------- simulator


def test_simulator_is_seeded_and_logs_exact_propensities(sim):
    d = sim.sample(20_000, seed=1)
    again = BanditSimulator(seed=0).sample(20_000, seed=1)
    assert np.array_equal(d.a, again.a) and np.array_equal(d.r, again.r)
    assert not np.array_equal(d.a, sim.sample(20_000, seed=2).a)
    assert np.allclose(d.pi0.sum(axis=1), 1.0)
    assert np.array_equal(d.p, d.pi0[np.arange(d.n), d.a])
    assert d.p.min() >= sim.epsilon / sim.n_actions - 1e-12
    # actions are drawn from pi0: empirical frequencies match the mean propensities
    freq = np.bincount(d.a, minlength=5) / d.n
    assert freq == pytest.approx(d.pi0.mean(axis=0), abs=0.01)
    assert set(np.unique(d.r)) == {0.0, 1.0}


def test_true_value_matches_the_logged_average_reward(sim):
    d = sim.sample(50_000, seed=3)
    se = d.r.std() / np.sqrt(d.n)
    assert abs(d.r.mean() - sim.true_value(sim.logging_policy)) < 3 * se
    good, greedy = sim.target_policy(0.5), sim.target_policy(0.01)
    uniform = sim.true_value(lambda x: np.full((x.shape[0], 5), 0.2))
    assert uniform < sim.true_value(sim.logging_policy) < sim.true_value(good)
    assert sim.true_value(good) < sim.true_value(greedy)
    assert uniform == pytest.approx(sim.expected_reward(sim.eval_x).mean())


# ---------------------------------------------------------------------------------- estimators


def test_estimates_are_within_a_few_standard_errors_of_the_truth(sim):
    policy = sim.target_policy(0.5)
    truth = sim.true_value(policy)
    d = sim.sample(20_000, seed=4)
    est = estimate_all(_log(d), policy(d.x))
    for name in ("ips", "snips", "dr"):
        e = est[name]
        assert abs(e.value - truth) < 3 * e.se, name
        assert e.ci_low < e.value < e.ci_high and e.n == 20_000
        assert e.ci_high - e.value == pytest.approx(1.959964 * e.se)
        assert 0 < e.ess < e.n
    assert abs(est["dm"].value - truth) < 0.03  # a linear model of a logistic truth: biased
    assert est["dm"].ess is None
    assert truth - sim.true_value(sim.logging_policy) > 0.1  # the target really is different


def test_confidence_intervals_cover_at_about_the_nominal_rate(replications):
    truth, runs = replications
    for name in ("ips", "snips", "dr", "dr_oracle"):
        lo, hi = _column(runs, name, "ci_low"), _column(runs, name, "ci_high")
        coverage = np.mean((lo <= truth) & (truth <= hi))
        assert coverage >= 0.85, (name, coverage)
        assert abs(_column(runs, name).mean() - truth) < 0.01, name  # (nearly) unbiased


def test_doubly_robust_has_lower_variance_than_ips_with_a_good_reward_model(replications):
    _, runs = replications
    sd = {name: _column(runs, name).std() for name in ("ips", "snips", "dr", "dr_oracle")}
    assert sd["dr"] < 0.8 * sd["ips"]
    assert sd["dr_oracle"] < 0.8 * sd["ips"]
    assert _column(runs, "dr", "se").mean() < _column(runs, "ips", "se").mean()
    # the reported standard errors track the actual spread of the estimates
    for name in sd:
        assert _column(runs, name, "se").mean() == pytest.approx(sd[name], rel=0.25), name


def test_logging_policy_as_target_gives_unit_weights(sim):
    d = sim.sample(500, seed=5)
    for est in (ips(_log(d), d.pi0), snips(_log(d), d.pi0)):
        assert est.value == pytest.approx(d.r.mean())
        assert est.ess == pytest.approx(500)


def test_clipping_caps_weights_and_trades_bias_for_variance(sim):
    d = sim.sample(2000, seed=6)
    pi = sim.target_policy(0.2)(d.x)
    raw = ips(_log(d), pi)
    assert ips(_log(d), pi, clip=1e9) == raw
    clipped = ips(_log(d), pi, clip=2.0)
    assert clipped.value < raw.value and clipped.se < raw.se and clipped.ess > raw.ess
    assert doubly_robust(_log(d), pi, clip=2.0).ess == pytest.approx(clipped.ess)


def test_direct_method_with_the_true_reward_function_is_exact_up_to_context_noise(sim):
    policy = sim.target_policy(0.5)
    d = sim.sample(5000, seed=7)
    q = sim.expected_reward(d.x)
    dm = direct_method(BanditLog(d.a, None, d.r), policy(d.x), q_hat=q)
    assert dm.value == pytest.approx(np.mean(np.sum(policy(d.x) * q, axis=1)))
    assert abs(dm.value - sim.true_value(policy)) < 3 * dm.se


# -------------------------------------------------------------------------------- reward model


def test_ridge_reward_model_recovers_a_linear_reward_per_action():
    rng = np.random.default_rng(8)
    x = rng.normal(size=(300, 3))
    a = rng.integers(0, 2, 300)  # action 2 is never logged
    beta = np.array([[0.1, -0.05, 0.02], [0.0, 0.08, 0.0]])
    r = 0.5 + np.sum(x * beta[a], axis=1) + 0.1 * a
    model = fit_reward_model(x, a, r, n_actions=3, l2=0.0)
    assert model.coef[:2] == pytest.approx(beta, abs=1e-9)
    assert model.intercept[:2] == pytest.approx([0.5, 0.6], abs=1e-9)
    q = model(x)
    assert q.shape == (300, 3)
    assert q[np.arange(300), a] == pytest.approx(r, abs=1e-9)
    assert q[:, 2] == pytest.approx(r.mean())  # unseen action: overall mean
    far = model(np.array([[100.0, 0.0, 0.0]]))
    assert far[0, 0] == pytest.approx(r.max())  # clipped to the observed reward range
    shrunk = fit_reward_model(x, a, r, n_actions=3, l2=1e4)
    assert np.abs(shrunk.coef).sum() < np.abs(model.coef).sum()


def test_cross_fitting_never_uses_a_rounds_own_reward(sim):
    d = sim.sample(400, seed=9)
    q = cross_fit_q(d.x, d.a, d.r, 5, n_folds=4, seed=1)
    assert np.array_equal(q, cross_fit_q(d.x, d.a, d.r, 5, n_folds=4, seed=1))
    for i in (0, 17, 399):
        r2 = d.r.copy()
        r2[i] = 1.0 - r2[i]
        q2 = cross_fit_q(d.x, d.a, r2, 5, n_folds=4, seed=1)
        assert np.array_equal(q2[i], q[i])  # its prediction is unchanged...
        assert not np.array_equal(q2, q)  # ...while the other folds' models did change


# ---------------------------------------------------------------------------------- validation


def _data():
    a = np.array([0, 1, 1, 0])
    p = np.array([0.5, 0.5, 0.25, 0.75])
    r = np.array([1.0, 0.0, 1.0, 0.5])
    pi = np.array([[0.2, 0.8]] * 4)
    return a, p, r, pi


@pytest.mark.parametrize("change, field", [
    ({"p": [0.5, 0.0, 0.25, 0.75]}, "p"),
    ({"p": [0.5, 1.5, 0.25, 0.75]}, "p"),
    ({"p": [0.5, 0.5, 0.25]}, "p"),
    ({"a": [0, 1, 2, 0]}, "a"),
    ({"a": [0, 1, -1, 0]}, "a"),
    ({"a": [0, 0.5, 1, 0]}, "a"),
    ({"r": [1.0, 0.0, 1.0]}, "r"),
    ({"r": [1.0, np.nan, 1.0, 0.0]}, "r"),
    ({"pi": [[0.2, 0.7]] * 4}, "pi"),
    ({"pi": [[1.2, -0.2]] * 4}, "pi"),
    ({"pi": [0.2, 0.8]}, "pi"),
    ({"pi": np.zeros((0, 2))}, "pi"),
])
@pytest.mark.parametrize("estimator", [ips, snips, doubly_robust])
def test_bad_logged_data_raises_config_error_naming_the_argument(estimator, change, field):
    a, p, r, pi = _data()
    args = {"a": a, "p": p, "r": r, "pi": pi, **change}
    kwargs = {"q_hat": np.full((4, 2), 0.5)} if estimator is doubly_robust else {}
    with pytest.raises(ConfigError) as err:
        estimator(BanditLog(args["a"], args["p"], args["r"]), args["pi"], **kwargs)
    assert err.value.field == field


def test_bad_options_raise_config_error_naming_the_argument():
    a, p, r, pi = _data()
    x = np.arange(8.0).reshape(4, 2)
    for call, field in [
        (lambda: ips(BanditLog(a, p, r), pi, clip=0.0), "clip"),
        (lambda: snips(BanditLog(a, p, r), pi, ci=1.0), "ci"),
        (lambda: ips(BanditLog(a, None, r), pi), "p"),
        (lambda: doubly_robust(BanditLog(a, p, r), pi), "x"),
        (lambda: doubly_robust(BanditLog(a, p, r), pi, q_hat=np.zeros((4, 3))), "q_hat"),
        (lambda: doubly_robust(BanditLog(a, p, r, x), pi, n_folds=1), "n_folds"),
        (lambda: doubly_robust(BanditLog(a, p, r, x[:3]), pi), "x"),
        (lambda: direct_method(BanditLog(a, None, r), pi), "x"),
        (lambda: fit_reward_model(x, a, r, n_actions=0), "n_actions"),
        (lambda: fit_reward_model(x, a, r, n_actions=2, l2=-1.0), "l2"),
        (lambda: fit_reward_model(x, a, r, n_actions=2)(np.zeros((2, 3))), "x"),
        (lambda: snips(BanditLog(a, p, r),
                       np.array([[0.0, 1.0], [1.0, 0.0], [1.0, 0.0], [0.0, 1.0]])),
         "pi"),  # zero probability on every logged action
        (lambda: BanditSimulator(n_actions=1), "n_actions"),
        (lambda: BanditSimulator(epsilon=0.0), "epsilon"),
        (lambda: BanditSimulator(n_eval=10).true_value(lambda x: np.ones((x.shape[0], 2))),
         "policy"),
    ]:
        with pytest.raises(ConfigError) as err:
            call()
        assert err.value.field == field
    # the same data with valid options works
    est = doubly_robust(BanditLog(a, p, r, x), pi, n_folds=2)
    assert np.isfinite(est.value) and est.n == 4


def test_paired_dr_difference_covers_the_true_difference_and_is_tighter(sim):
    """V(a) − V(b) from one log: the values are the two DR estimates (one reward model), and the
    paired CI (per-round differences) covers the true difference at about the nominal rate while
    being narrower than adding the two estimates' own standard errors in quadrature."""
    pa, pb = sim.target_policy(0.5), sim.target_policy(0.8)
    true_diff = sim.true_value(pa) - sim.true_value(pb)
    covered, narrower = [], []
    for seed in range(40):
        d = sim.sample(1000, seed=100 + seed)
        ea, eb, diff = doubly_robust_difference(_log(d), pa(d.x), pb(d.x), seed=seed)
        assert diff.value == pytest.approx(ea.value - eb.value)
        assert ea.value == pytest.approx(doubly_robust(_log(d), pa(d.x), seed=seed).value)
        covered.append(diff.ci_low <= true_diff <= diff.ci_high)
        narrower.append(diff.se < np.hypot(ea.se, eb.se))
    assert np.mean(covered) >= 0.85 and np.mean(narrower) >= 0.9
    with pytest.raises(ConfigError):
        doubly_robust_difference(_log(d), pa(d.x), pb(d.x)[:, :3])
