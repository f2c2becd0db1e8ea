"""The per-query policy protocol of the Serve app's router (rl.routing.base): ε-greedy and
candidate-aware exploration, their propensities, policy directories, and what a
candidate-aware log buys off-policy evaluation (rl.stats.ope)."""

from __future__ import annotations

import numpy as np
import pytest

from rag.config import RAGConfig
from rag.errors import ConfigError
from rl.routing.base import (
    Exploring,
    PerQueryPolicy,
    RouterPolicy,
    explore_mix,
    load_policy,
    one_hot,
    sample_arms,
    save_policy,
)
from rl.stats.ope import BanditLog, doubly_robust, ips

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


def test_epsilon_greedy_min_propensity_and_sampling():
    P = explore_mix(one_hot(np.array([0, 1, 2, 1]), 5), 0.1)
    assert np.allclose(P.sum(axis=1), 1.0)
    assert P.min() == pytest.approx(0.1 / 5)
    assert P[0, 0] == pytest.approx(0.9 + 0.02)
    rng = np.random.default_rng(0)
    arms, prop = sample_arms(np.tile(P[1], (20000, 1)), rng)
    assert np.bincount(arms, minlength=5) / 20000 == pytest.approx(P[1], abs=0.01)
    assert np.allclose(prop, P[1][arms])


def test_router_policy_exploring_and_policy_dir_round_trip(tmp_path):
    from rl.routing.router import RouterParams, SupervisedRouter

    X, R, _ = _world(200, 9)
    pol = RouterPolicy(SupervisedRouter(RouterParams(max_iter=10)).fit(X, R), _configs())
    assert isinstance(pol, PerQueryPolicy)
    assert np.array_equal(pol.probs(X).argmax(axis=1), pol.act(X))
    ex = Exploring(pol, 0.2)
    assert ex.probs(X).min() == pytest.approx(0.2 / M)
    assert Exploring(pol, 0.0).probs(X).min() == 0.0  # the user's rate, none included
    with pytest.raises(ConfigError):
        Exploring(pol, 1.05)
    d = save_policy(pol, tmp_path / "p", base_config=RAGConfig(), names=["a", "b", "c"],
                    epsilon=0.15)
    got = load_policy(d)
    assert got.names == ["a", "b", "c"] and got.epsilon == 0.15 and len(got.policy_id) == 12
    assert np.array_equal(got.policy.act(X), pol.act(X))
    with pytest.raises(ConfigError):
        load_policy(tmp_path / "nothing")


def test_candidate_aware_exploration_keeps_the_floor_and_gives_the_candidate_its_share():
    served = one_hot(np.array([0, 0, 1, 2]), 5)
    cand = one_hot(np.array([3, 0, 4, 2]), 5)
    P = explore_mix(served, 0.1, cand, 0.2)
    assert np.allclose(P.sum(axis=1), 1.0)
    assert P.min() == pytest.approx(0.1 / 5)  # the uniform floor is unchanged
    assert P[0, 3] == pytest.approx(0.2 + 0.02)  # the candidate's choice: >= its share
    assert P[0, 0] == pytest.approx(0.7 + 0.02)  # the served choice: 1 - eps - share
    assert P[1, 0] == pytest.approx(0.9 + 0.02)  # both agree
    assert np.allclose(explore_mix(served, 0.1, cand, 0.0),
                       explore_mix(served, 0.1))  # share 0 = plain epsilon-greedy
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
    through the uniform epsilon (weights up to 1/0.1 instead of M/eps = 100)."""
    rng0 = np.random.default_rng(11)
    n, m = 300, 10
    X = rng0.normal(size=(n, 4))
    mean = np.clip(0.4 + 0.15 * X @ rng0.normal(size=(4, m)) / 2, 0.02, 0.98)
    cand = np.eye(m)[mean.argmax(axis=1)]
    served = one_hot(np.full(n, int(mean.mean(axis=0).argmax())), m)
    err = {"uniform": [], "candidate": []}
    for d in range(12):
        rng = np.random.default_rng([d, 3])
        R = (rng.random(mean.shape) < mean).astype(float)
        truth = float(np.mean(np.sum(cand * R, axis=1)))
        q = np.random.default_rng([d, 4]).integers(0, n, size=3000)  # a stream of requests
        for name, share in (("uniform", 0.0), ("candidate", 0.1)):
            P = explore_mix(served[q], 0.1, cand[q], share)
            arm, prop = sample_arms(P, np.random.default_rng([d, 5]))
            if share:
                assert prop[arm == cand.argmax(axis=1)[q]].min() >= 0.1 - 1e-12
            log = BanditLog(arm, prop, R[q, arm], X[q])
            est = [ips(log, cand[q]), doubly_robust(log, cand[q])]
            err[name].append([abs(e.value - truth) for e in est])
    u, c = np.mean(err["uniform"], axis=0), np.mean(err["candidate"], axis=0)
    assert (c * 2.5 < u).all(), (u, c)
    with pytest.raises(ConfigError) as e:
        explore_mix(served, 0.1, cand[:5], 0.1)
    assert e.value.field == "candidate"
