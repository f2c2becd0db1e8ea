"""B4 LinUCB from ε-greedy logs, the drifting-world UCBs, the policy protocol and the
decision-log OPE error (rl.routing.base, rl.routing.portfolio_bandit,
rl.routing.decision_log)."""

from __future__ import annotations

import numpy as np
import pytest

from rag.config import RAGConfig
from rag.errors import ConfigError
from rl.routing.base import (
    Exploring,
    PerQueryPolicy,
    RouterPolicy,
    load_policy,
    sample_arms,
    save_policy,
)
from rl.routing.decision_log import (
    DecisionLog,
    epsilon_greedy_probs,
    log_epsilon_greedy,
    ope_error,
    true_value,
)
from rl.routing.portfolio_bandit import (
    DiscountedUCB,
    LinUCB,
    LinUCBPolicy,
    SlidingWindowUCB,
    select_linucb,
)

M = 3


def _world(n: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """A planted linear choice: arm 0 is best when x0 > 0.5, arm 1 when x0 < -0.5, arm 2 (a
    safe middle arm) in between; Bernoulli rewards."""
    rng = np.random.default_rng(seed)
    X = rng.normal(size=(n, 4))
    mean = np.column_stack([0.5 + 0.3 * X[:, 0], 0.5 - 0.3 * X[:, 0], np.full(n, 0.55)])
    mean = np.clip(mean, 0.02, 0.98)
    return X, (rng.random(mean.shape) < mean).astype(float), mean


def _configs(m: int = M) -> list[RAGConfig]:
    return [RAGConfig().replace(k=k) for k in (1, 2, 3, 4, 5)[:m]]


def test_linucb_learns_planted_linear_choice_from_epsilon_greedy_logs():
    X, R, mean = _world(6000, 0)
    rng = np.random.default_rng(1)
    logs = log_epsilon_greedy(X, R, np.full(len(X), 2), 0.3, rng)
    assert logs.propensity.min() >= 0.3 / M - 1e-12
    model = LinUCB(M, X.shape[1], l2=1.0).fit(logs.x, logs.arm, logs.reward, logs.propensity)
    Xt, _, mt = _world(2000, 2)
    pol = LinUCBPolicy(model, _configs(), beta=0.0)
    ch = pol.act(Xt)
    oracle = mt.argmax(axis=1)
    clear = np.abs(Xt[:, 0]) > 1.0  # where one arm is clearly best
    assert (ch[clear] == oracle[clear]).mean() > 0.9
    value = mt[np.arange(len(ch)), ch].mean()
    assert value > mt[:, 2].mean() + 0.08  # beats the logging policy's static arm


def test_linucb_pessimism_keeps_unexplored_arms_out_and_selection_uses_valid():
    X, R, mean = _world(3000, 3)
    logs = log_epsilon_greedy(X, R, np.full(len(X), 2), 0.1, np.random.default_rng(4))
    Xv, Rv, mv = _world(1000, 5)
    pol, tried = select_linucb(logs.x, logs.arm, logs.reward, logs.propensity, Xv, mv,
                               _configs())
    assert len(tried) == 18 and isinstance(pol, PerQueryPolicy)
    assert max(t["valid_reward"] for t in tried) == pytest.approx(
        mv[np.arange(len(Xv)), pol.act(Xv)].mean())
    # with a huge pessimism weight the well-logged base arm wins everywhere
    assert np.all(LinUCBPolicy(pol.model, _configs(), beta=1e3).act(Xv) == 2)


def test_linucb_online_select_update_explores_then_exploits():
    X, R, mean = _world(3000, 6)
    model = LinUCB(M, X.shape[1], alpha=0.5)
    model.set_scaler(X, 0.5)
    picks = []
    for i in range(len(X)):
        a = model.select(X[i])
        model.update(X[i], a, R[i, a])
        picks.append(a)
    picks = np.array(picks)
    late = slice(2000, 3000)
    assert set(np.unique(picks[:200])) == {0, 1, 2}
    assert (picks[late] == mean[late].argmax(axis=1)).mean() > 0.7


def test_linucb_mean_and_width_are_ridge_estimates_and_follow_updates():
    """mean = zᵀA⁻¹b + offset and width = sqrt(zᵀA⁻¹z) per arm, against a direct solve; the
    cached inverse and θ are refreshed after an update."""
    X, R, _ = _world(400, 2)
    model = LinUCB(M, X.shape[1], alpha=0.5)
    model.set_scaler(X, 0.5)
    model.fit(X, np.arange(len(X)) % M, R[np.arange(len(X)), np.arange(len(X)) % M])

    def direct(x):
        z = model._z(x[None])[0]
        return (np.array([z @ np.linalg.solve(model.A[k], model.b[k]) for k in range(M)])
                + model.offset,
                np.sqrt([z @ np.linalg.solve(model.A[k], z) for k in range(M)]))

    mean, width = model.mean_width(X[:3])
    for i in range(3):
        np.testing.assert_allclose(mean[i], direct(X[i])[0], rtol=1e-9, atol=1e-12)
        np.testing.assert_allclose(width[i], direct(X[i])[1], rtol=1e-9, atol=1e-12)
    before = model.mean_width(X[:1])
    model.update(X[0], 1, 5.0)
    after = model.mean_width(X[:1])
    assert after[0][0, 1] != before[0][0, 1] and after[1][0, 1] < before[1][0, 1]
    np.testing.assert_allclose(after[0][0], direct(X[0])[0], rtol=1e-9, atol=1e-12)


@pytest.mark.parametrize("cls,kw", [(DiscountedUCB, {"gamma": 0.98}),
                                    (SlidingWindowUCB, {"window": 200})])
def test_drift_ucb_tracks_a_switch_of_the_best_arm(cls, kw):
    rng = np.random.default_rng(0)
    means = np.array([[0.8, 0.5, 0.4], [0.3, 0.5, 0.8]])
    ucb = cls(3, c=0.3, **kw)
    picks = []
    for t in range(4000):
        phase = 0 if t < 2000 else 1
        a = ucb.select()
        ucb.update(a, float(rng.random() < means[phase, a]))
        picks.append(a)
    picks = np.array(picks)
    assert (picks[1500:2000] == 0).mean() > 0.8
    assert (picks[3500:4000] == 2).mean() > 0.8


def test_plain_ucb_gamma_one_is_slow_after_the_switch():
    rng = np.random.default_rng(0)
    means = np.array([[0.8, 0.5, 0.4], [0.3, 0.5, 0.8]])
    ucb = DiscountedUCB(3, gamma=1.0, c=0.3)
    picks = []
    for t in range(4000):
        a = ucb.select()
        ucb.update(a, float(rng.random() < means[int(t >= 2000), a]))
        picks.append(a)
    assert (np.array(picks[2000:2300]) == 2).mean() < 0.5


def test_drift_ucb_rejects_bad_settings():
    with pytest.raises(ConfigError):
        DiscountedUCB(3, gamma=0.0)
    with pytest.raises(ConfigError):
        SlidingWindowUCB(3, window=0)


def test_epsilon_greedy_min_propensity_and_sampling():
    P = epsilon_greedy_probs(np.array([0, 1, 2, 1]), 5, 0.1)
    assert np.allclose(P.sum(axis=1), 1.0)
    assert P.min() == pytest.approx(0.1 / 5)
    assert P[0, 0] == pytest.approx(0.9 + 0.02)
    with pytest.raises(ConfigError):
        epsilon_greedy_probs(np.array([0]), 5, 0.05)
    rng = np.random.default_rng(0)
    arms, prop = sample_arms(np.tile(P[1], (20000, 1)), rng)
    assert np.bincount(arms, minlength=5) / 20000 == pytest.approx(P[1], abs=0.01)
    assert np.allclose(prop, P[1][arms])


def test_ope_error_is_small_on_a_long_log_and_logs_round_trip(tmp_path):
    X, R, mean = _world(400, 7)
    rng = np.random.default_rng(8)
    logs = log_epsilon_greedy(X, mean, np.full(len(X), 2), 0.3, rng, n_rounds=40000)
    target = epsilon_greedy_probs(mean.argmax(axis=1), M, 1.0)  # uniform target
    greedy = np.eye(M)[mean.argmax(axis=1)]
    for probs in (target, greedy):
        truth = true_value(probs, mean)
        out = ope_error(probs[logs.qidx], logs, truth)
        assert set(out) == {"ips", "snips", "dr"}
        assert out["dr"]["abs_error"] < 0.01 and out["dr"]["covered"]
    back = DecisionLog.read_jsonl(logs.write_jsonl(tmp_path / "log.jsonl"))
    assert np.array_equal(back.arm, logs.arm) and np.allclose(back.x, logs.x)
    assert back.config_hash[:3] == logs.config_hash[:3]


def test_router_policy_exploring_and_policy_dir_round_trip(tmp_path):
    from rl.routing.router import RouterParams, SupervisedRouter

    X, R, _ = _world(200, 9)
    pol = RouterPolicy(SupervisedRouter(RouterParams(max_iter=10)).fit(X, R), _configs())
    assert isinstance(pol, PerQueryPolicy)
    assert np.array_equal(pol.probs(X).argmax(axis=1), pol.act(X))
    ex = Exploring(pol, 0.2)
    assert ex.probs(X).min() == pytest.approx(0.2 / M)
    with pytest.raises(ConfigError):
        Exploring(pol, 0.05)
    d = save_policy(LinUCBPolicy(LinUCB(M, 4).fit(X, np.arange(200) % M, np.ones(200)),
                                 _configs()), tmp_path / "p", base_config=RAGConfig(),
                    names=["a", "b", "c"], epsilon=0.15)
    got = load_policy(d)
    assert got.names == ["a", "b", "c"] and got.epsilon == 0.15 and len(got.policy_id) == 12
    assert np.array_equal(got.policy.act(X), LinUCBPolicy(got.policy.model, _configs()).act(X))
    with pytest.raises(ConfigError):
        load_policy(tmp_path / "nothing")


def test_candidate_aware_exploration_keeps_the_floor_and_gives_the_candidate_its_share():
    from rl.routing.base import explore_mix, one_hot

    served = one_hot(np.array([0, 0, 1, 2]), 5)
    cand = one_hot(np.array([3, 0, 4, 2]), 5)
    P = explore_mix(served, 0.1, cand, 0.2)
    assert np.allclose(P.sum(axis=1), 1.0)
    assert P.min() == pytest.approx(0.1 / 5)  # the uniform floor is unchanged
    assert P[0, 3] == pytest.approx(0.2 + 0.02)  # the candidate's choice: >= its share
    assert P[0, 0] == pytest.approx(0.7 + 0.02)  # the served choice: 1 - eps - share
    assert P[1, 0] == pytest.approx(0.9 + 0.02)  # both agree
    assert np.allclose(explore_mix(served, 0.1), epsilon_greedy_probs(
        np.array([0, 0, 1, 2]), 5, 0.1))  # share 0 = plain epsilon-greedy
    for kw, field in (({"candidate_share": 0.6}, "candidate_share"),
                      ({"candidate_share": 0.2, "candidate_probs": None}, "candidate_share"),
                      ({"candidate_share": 0.2, "candidate_probs": cand[:, :4]}, "candidate")):
        args = {"candidate_probs": cand, **kw}
        with pytest.raises(ConfigError) as e:
            explore_mix(served, 0.1, **args)
        assert e.value.field == field
    with pytest.raises(ConfigError) as e:
        explore_mix(served, 0.7, cand, 0.5)
    assert e.value.field == "epsilon"


def test_exploring_with_a_candidate_checks_its_arms():
    from rl.routing.router import RouterParams, SupervisedRouter

    X, R, _ = _world(200, 9)
    pol = RouterPolicy(SupervisedRouter(RouterParams(max_iter=10)).fit(X, R), _configs())
    other = RouterPolicy(SupervisedRouter(RouterParams(max_iter=20)).fit(X, R[:, ::-1]),
                         _configs())
    ex = Exploring(pol, 0.1, other, 0.25)
    P = ex.probs(X)
    assert np.allclose(P.sum(axis=1), 1.0) and P.min() >= 0.1 / M - 1e-12
    rows = np.arange(len(X))
    assert (P[rows, other.act(X)] >= 0.25 + 0.1 / M - 1e-12).all()
    assert np.array_equal(ex.act(X), pol.act(X))  # greedy stays the served policy's
    shifted = RouterPolicy(pol.router, [c.replace(k=c.k + 1) for c in _configs()])
    with pytest.raises(ConfigError) as e:
        Exploring(pol, 0.1, shifted, 0.25)
    assert e.value.field == "candidate" and "first difference at arm 0" in e.value.message
    with pytest.raises(ConfigError) as e:
        Exploring(pol, 0.1, None, 0.25)
    assert e.value.field == "candidate_share"


def test_a_candidate_aware_log_estimates_the_candidate_far_better():
    """The same world and log length: the candidate's IPS and DR errors from a log that gives
    it 10% of the rounds are several times smaller than from a log that only explores it
    through the uniform epsilon (weights up to 1/0.1 instead of M/eps = 30)."""
    rng0 = np.random.default_rng(11)
    n, m = 300, 10
    X = rng0.normal(size=(n, 4))
    mean = np.clip(0.4 + 0.15 * X @ rng0.normal(size=(4, m)) / 2, 0.02, 0.98)
    cand = np.eye(m)[mean.argmax(axis=1)]
    truth = true_value(cand, mean)
    greedy = np.full(n, int(mean.mean(axis=0).argmax()))
    err = {"uniform": [], "candidate": []}
    for d in range(12):
        rng = np.random.default_rng([d, 3])
        R = (rng.random(mean.shape) < mean).astype(float)
        for name, share in (("uniform", 0.0), ("candidate", 0.1)):
            logs = log_epsilon_greedy(X, R, greedy, 0.1, np.random.default_rng([d, 4]),
                                      n_rounds=3000, candidate_probs=cand,
                                      candidate_share=share)
            if share:
                assert logs.propensity[logs.arm == cand.argmax(axis=1)[logs.qidx]].min() \
                    >= 0.1 - 1e-12
            out = ope_error(cand[logs.qidx], logs, true_value(cand, R))
            err[name].append([out["ips"]["abs_error"], out["dr"]["abs_error"]])
    u, c = np.mean(err["uniform"], axis=0), np.mean(err["candidate"], axis=0)
    assert truth > 0.4
    assert (c * 2.5 < u).all(), (u, c)
    with pytest.raises(ConfigError) as e:
        log_epsilon_greedy(X, mean, greedy, 0.1, rng0, candidate_probs=cand[:5],
                           candidate_share=0.1)
    assert e.value.field == "candidate_probs"
