"""The drift benchmark's bookkeeping (bench/drift_streams.py, bench/drift_policy.py): phase mixes,
regret against each phase's best static arm on a planted world, the systems' contracts, and
that the learned policy never reads the test split the streams draw from."""

from __future__ import annotations

import numpy as np
import pytest
from bench.drift_streams import (
    Calibration,
    OnlineSettings,
    PhaseSpec,
    Pool,
    StreamSpec,
    draw_phase,
    online_policy,
    phase_best,
    phase_counts,
    realise,
    regret,
    run_bandit,
    run_systems,
    searcher_per_phase,
    static_arm_for_mix,
)

from rl.routing.portfolio_bandit import SlidingWindowUCB


def _planted(n_per_group: int = 50, seed: int = 0) -> Pool:
    """Two groups: arm 0 is best on group a (reward 1 vs 0.5), arm 1 on group b; arm 2 is
    always 0.2. Features: the group as one number."""
    labels = np.array(["a"] * n_per_group + ["b"] * n_per_group)
    R = np.zeros((2 * n_per_group, 3))
    R[labels == "a"] = [1.0, 0.5, 0.2]
    R[labels == "b"] = [0.5, 1.0, 0.2]
    X = (labels == "b").astype(float)[:, None]
    ids = np.array([f"q{i}" for i in range(labels.size)])
    return Pool(R, X, labels, ids)


SHIFT = StreamSpec("planted", "planted", (PhaseSpec({"a": 0.9, "b": 0.1}),
                                          PhaseSpec({"a": 0.1, "b": 0.9})), 100)


def test_phase_counts_are_exact_and_sum_to_length():
    assert phase_counts({"a": 0.9, "b": 0.1}, 300) == {"a": 270, "b": 30}
    c = phase_counts({"x": 1, "y": 1, "z": 1}, 100)
    assert sum(c.values()) == 100 and sorted(c.values()) == [33, 33, 34]
    with pytest.raises(ValueError):
        phase_counts({"a": 0.0}, 10)


def test_draw_phase_mixes_groups_in_the_given_proportions():
    pool = _planted()
    idx = draw_phase(pool.labels, {"a": 0.1, "b": 0.9}, 200, np.random.default_rng(3))
    assert idx.size == 200
    assert np.sum(pool.labels[idx] == "a") == 20 and np.sum(pool.labels[idx] == "b") == 180
    # shuffled: the minority group is not all at the start or the end
    pos = np.flatnonzero(pool.labels[idx] == "a")
    assert pos.min() < 150 and pos.max() > 50
    with pytest.raises(ValueError):
        draw_phase(pool.labels, {"c": 1.0}, 10, np.random.default_rng(0))


def test_realise_draws_each_phase_from_its_pool_and_mix():
    pools = {"main": _planted()}
    real = realise(SHIFT, pools, seed=1)
    assert real.R.shape == (200, 3) and real.X.shape == (200, 1)
    assert np.array_equal(real.phase, np.repeat([0, 1], 100))
    # X is 1 for group b: 10% of phase 1, 90% of phase 2
    assert real.X[real.phase == 0].sum() == 10 and real.X[real.phase == 1].sum() == 90
    again = realise(SHIFT, pools, seed=1)
    assert np.array_equal(real.R, again.R)  # a seed gives the same stream
    assert not np.array_equal(realise(SHIFT, pools, seed=2).X, real.X)


def test_regret_is_against_each_phases_best_static_arm_in_hindsight():
    real = realise(SHIFT, {"main": _planted()}, seed=0)
    assert list(phase_best(real.R, real.phase)) == [0, 1]
    frozen = np.zeros(200, dtype=np.int64)  # arm 0 throughout
    r = regret(real.R, real.phase, frozen)
    assert r[real.phase == 0].sum() == pytest.approx(0.0)
    # phase 2: arm 1 is best; arm 0 loses 0.5 on the 90 b-queries, gains 0.5 on the 10 a's
    assert r[real.phase == 1].sum() == pytest.approx(90 * 0.5 - 10 * 0.5)
    oracle = np.where(real.X[:, 0] > 0, 1, 0)
    assert regret(real.R, real.phase, oracle)[real.phase == 1].sum() == pytest.approx(-5.0)


def test_static_arm_for_mix_weights_groups_by_the_mix():
    pool = _planted()
    assert static_arm_for_mix(pool.R, pool.labels, {"a": 0.9, "b": 0.1}) == 0
    assert static_arm_for_mix(pool.R, pool.labels, {"a": 0.1, "b": 0.9}) == 1


def test_searcher_is_charged_for_its_search_window_then_serves_the_winner():
    real = realise(SHIFT, {"main": _planted()}, seed=0)
    ch = searcher_per_phase(real.R, real.phase, 0, np.random.default_rng(0), rungs=(5, 20),
                            eta=3)
    assert np.all(ch[:100] == 0)  # phase 1: the offline choice
    window = 3 * 5 + 1 * 20  # 3 arms x 5 queries, then 1 survivor x 20
    assert set(ch[100:100 + 15]) == {0, 1, 2}  # every arm explored, and paid for
    assert np.all(ch[100 + window:] == 1)
    r = regret(real.R, real.phase, ch)
    assert r[100:100 + window].sum() > 0


def test_sliding_window_ucb_follows_a_change_of_the_best_arm():
    real = realise(SHIFT, {"main": _planted()}, seed=0)
    ch = run_bandit(real.R, SlidingWindowUCB(3, window=40, c=0.3, seed=0), 0.0, 1.0)
    assert np.mean(ch[60:100] == 0) > 0.6
    assert np.mean(ch[160:] == 1) > 0.6


def test_online_policy_corrects_a_stale_policy_and_logs_propensities():
    real = realise(SHIFT, {"main": _planted()}, seed=0)
    stale = np.tile([1.0, 0.5, 0.2], (200, 1))  # always predicts phase 1's world
    arms, props = online_policy(real.R, stale, np.random.default_rng(0),
                                OnlineSettings(epsilon=0.1, window=30, prior=2.0))
    assert np.all((props > 0) & (props <= 1))
    assert np.mean(arms[100:150] == 0) > np.mean(arms[150:] == 0)
    # without drift (scores exact) and no exploration it is the frozen argmax
    exact = real.R.copy()
    a2, p2 = online_policy(real.R, exact, np.random.default_rng(0), OnlineSettings(epsilon=0.0))
    assert np.array_equal(a2, np.argmax(exact, axis=1)) and np.all(p2 == 1.0)


def test_calibration_removes_a_known_bias_from_the_drift_signal():
    R = np.tile([0.6, 0.5], (40, 1))
    scores = R + np.array([0.3, 0.0])  # arm 0 always over-predicted by 0.3, arm 1 exact
    cal = Calibration.from_valid(R, scores, np.argmax(scores, axis=1))
    assert cal.greedy[0] == pytest.approx(-0.3) and cal.explored[1] == pytest.approx(0.0)
    arms, _ = online_policy(R, scores, np.random.default_rng(0), OnlineSettings(epsilon=0.0),
                            cal)
    assert np.all(arms == 0)  # the bias was there on valid too: no drift, no switch


def test_run_systems_returns_every_system_for_every_step():
    pool = _planted()
    real = realise(SHIFT, {"main": pool}, seed=0)
    out = run_systems(real, 0, lambda X: (X[:, 0] > 0).astype(int),
                      lambda X: np.column_stack([1 - X[:, 0], X[:, 0], 0 * X[:, 0]]),
                      lambda k, s: SlidingWindowUCB(k, seed=s), (0.0, 1.0), seed=0)
    assert set(out) == {"frozen-static", "searcher-per-phase", "sw-bandit", "router-policy",
                        "router-policy-online"}
    assert all(v.shape == (200,) for v in out.values())
    assert regret(real.R, real.phase, out["router-policy"]).sum() < 0  # the per-query oracle


def test_learned_policy_never_reads_the_test_split(monkeypatch):
    pytest.importorskip("sklearn")
    import bench.drift_policy as dp
    from bench.drift_data import Bundle
    from bench.drift_policy import fit_learned_policy, fit_router

    from rl.routing.router import RouterParams

    monkeypatch.setattr(dp, "ROUTER_GRID", (RouterParams(max_iter=20, max_leaf_nodes=7),
                                            RouterParams(max_iter=20, shrink=0.5)))

    rng = np.random.default_rng(0)

    def role(n):
        X = rng.normal(size=(n, 4))
        R = np.column_stack([X[:, 0], -X[:, 0], 0.1 * X[:, 1]])
        return X, R, np.ones_like(R)

    data = {r: role(n) for r, n in (("train", 120), ("valid", 60), ("test", 60))}
    ids = {"train": np.arange(120), "valid": np.arange(120, 180), "test": np.arange(180, 240)}
    b = Bundle("planted", ["a0", "a1", "a2"], {r: d[1] for r, d in data.items()},
               {r: d[2] for r, d in data.items()}, {r: d[0] for r, d in data.items()},
               {}, {r: ids[r].astype(str) for r in ids})
    assert not set(b.ids["test"]) & (set(b.ids["train"]) | set(b.ids["valid"]))
    ref = fit_learned_policy("router", b, seed=0)
    X_new = rng.normal(size=(30, 4))
    # poisoning the test split (NaN rewards, shuffled features) changes nothing: the router
    # raises on NaN rewards, so reading them would fail the fit
    b.R["test"] = np.full_like(b.R["test"], np.nan)
    b.X["test"] = b.X["test"][::-1]
    again = fit_learned_policy("router", b, seed=0)
    assert np.array_equal(ref.act(X_new), again.act(X_new))
    assert np.allclose(ref.scores(X_new), again.scores(X_new))
    with pytest.raises(Exception):  # noqa: B017 - the sentinel: NaN rewards are rejected
        fit_router(b.X["test"], b.R["test"], b.T["test"], b.X["valid"], b.R["valid"], None, 0)


def test_regret_ratio_is_unbounded_or_undefined_when_the_policy_has_no_regret():
    from bench.drift import _ratio_row

    frozen, policy = np.full(50, 0.2), np.full(50, 0.05)
    r = _ratio_row("s", "frozen-static / router-policy", frozen, policy, 2, 0)
    assert r["value"] == pytest.approx(4.0) and r["note"] == ""
    r = _ratio_row("s", "frozen-static / router-policy", frozen, -policy, 2, 0)
    assert r["value"] is None and r["note"].startswith("unbounded")
    for pol in (-policy, policy):  # frozen-static not hurt: no ratio, whatever the policy did
        r = _ratio_row("s", "frozen-static / router-policy", np.full(50, 1e-17), pol, 2, 0)
        assert r["value"] is None and r["note"].startswith("undefined")


def _with_extra(pool: Pool, served: np.ndarray) -> Pool:
    return Pool(pool.R, pool.X, pool.labels, pool.ids, {"ppo-policy": served})


def test_a_system_outside_the_arms_is_charged_its_own_rewards():
    from bench.drift_streams import regret_of_served

    pool = _planted()
    # copy 0 serves arm 0's reward on every query; copy 1 does 0.1 better than the best arm
    served = np.column_stack([pool.R[:, 0], pool.R.max(axis=1) + 0.1])
    real = realise(SHIFT, {"main": _with_extra(pool, served)}, seed=4)
    got = real.extra["ppo-policy"]
    assert got.shape == (200, 2)
    as_arm0 = regret(real.R, real.phase, np.zeros(200, dtype=np.int64))
    assert np.allclose(regret_of_served(real.R, real.phase, got[:, 0]), as_arm0)
    # copy 1 beats the phase's best arm by 0.1 where that arm is the query's best, 0.6 where
    # the minority group's arm is
    r1 = regret_of_served(real.R, real.phase, got[:, 1])
    best = phase_best(real.R, real.phase)[real.phase]
    minority = real.R[np.arange(200), best] < 1.0
    assert np.allclose(r1[~minority], -0.1) and np.allclose(r1[minority], -0.6)
    assert minority.sum() == 20
    # the same draws as a stream without the extra system
    assert np.array_equal(realise(SHIFT, {"main": pool}, seed=4).R, real.R)


def test_a_stream_refuses_an_outside_system_missing_from_one_of_its_pools():
    pool = _planted()
    spec = StreamSpec("two-pools", "planted", (PhaseSpec({"a": 1.0}),
                                               PhaseSpec({"a": 1.0}, "price2")), 20)
    pools = {"main": _with_extra(pool, pool.R[:, :1]), "price2": pool}
    with pytest.raises(ValueError, match="ppo-policy"):
        realise(spec, pools, seed=0)


def test_run_stream_reports_the_targets_rows_for_the_outside_system(tmp_path):
    from bench.drift import run_stream
    from bench.drift_data import Bundle
    from bench.drift_policy import LearnedPolicy

    pool = _planted()
    # the outside system knows each query's group (as the per-query oracle): no regret, while
    # frozen arm 0 loses 0.5 a query on group b after the shift
    served = np.column_stack([pool.R.max(axis=1)] * 2)
    roles = ("train", "valid", "test")
    b = Bundle("planted", ["a0", "a1", "a2"], {r: pool.R for r in roles},
               {r: np.ones_like(pool.R) for r in roles}, {r: pool.X for r in roles},
               {r: {"type": pool.labels} for r in roles}, {r: pool.ids for r in roles})
    lp = LearnedPolicy(lambda X: np.zeros(len(X), dtype=np.int64),
                       lambda X: np.tile([1.0, 0.5, 0.2], (len(X), 1)), "arm 0 always")
    rows, detail = run_stream(SHIFT, "type", {"main": _with_extra(pool, served)}, b, lp,
                              lambda k, s: SlidingWindowUCB(k, seed=s), 2, 0,
                              tmp_path / "planted.png", OnlineSettings())
    gap = {r["phase"]: r["value"] for r in rows
           if r["system"] == "ppo-policy" and r["metric"] == "gap_to_phase_best"}
    assert gap[1] == pytest.approx(-0.05) and gap[2] == pytest.approx(-0.05)
    ratio = next(r for r in rows if r["system"] == "frozen-static / ppo-policy")
    assert ratio["value"] is None and ratio["note"].startswith("unbounded")
    assert ratio["frozen_regret"] == pytest.approx(0.4)  # 0.9 x 0.5 lost, 0.1 x 0.5 won
    assert "ppo-policy" in detail["cum_regret_end"] and (tmp_path / "planted.png").exists()


def test_drift_arms_add_formulation_arms_on_conversational_data_only():
    """bench/policy.py's formulation design in the drift benchmark: a dataset with earlier
    turns gets every non-abstaining portfolio arm again per formulation view; one without
    keeps the 30-arm portfolio and no views."""
    from types import SimpleNamespace

    from bench.drift_data import drift_arms

    from rag.types import Example
    from rl.kernel.settings import TunerSettings
    from rl.routing.portfolio import portfolio

    policy = TunerSettings.defaults()

    def ev(examples):
        return SimpleNamespace(data=SimpleNamespace(dataset=SimpleNamespace(examples=examples)))

    single = [Example(id="a", question="who?"), Example(id="b", question="when?")]
    arms, views = drift_arms(ev(single), policy)
    assert views == () and arms == portfolio(policy)
    conv = [*single, Example(id="c", question="and it?",
                             history=({"role": "user", "text": "the printer"},
                                      {"role": "agent", "text": "which one"}))]
    arms, views = drift_arms(ev(conv), policy)
    base = portfolio(policy)
    abstaining = sum("abstain" in c.prompt_id for _, c in base)
    assert views == ("last_two_user", "all_user")
    assert len(arms) == len(base) + len(views) * (len(base) - abstaining)  # 30 -> 84
    assert dict(arms)["graph-k3@all_user"].query_formulation == "all_user"
