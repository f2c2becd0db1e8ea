"""rl.stats.headroom on small hand-made reward matrices whose answers are known, and the
routing portfolio (rl.routing.portfolio; no evaluation)."""

from __future__ import annotations

import numpy as np
import pytest

from rag.errors import ConfigError
from rl.stats.headroom import (
    best_static,
    crossfit_segment_gain,
    equal_cost_oracle,
    fold_assignment,
    oracle_choice,
    pick,
    rung_spearman,
    segment_choice,
    segment_values,
)


def test_oracle_and_best_static():
    R = np.array([[1.0, 0.0], [0.0, 1.0], [0.5, 0.5], [0.2, 0.1]])
    assert best_static(R) == 0  # means 0.425 vs 0.4
    ch = oracle_choice(R)
    assert ch.tolist() == [0, 1, 0, 0]  # the tie in row 2 goes to the first column
    assert pick(R, ch).tolist() == [1.0, 1.0, 0.5, 0.2]
    headroom = pick(R, ch).mean() - R[:, best_static(R)].mean()
    assert headroom == pytest.approx(0.675 - 0.425)


def test_bad_matrix_is_refused():
    with pytest.raises(ConfigError):
        best_static(np.array([[1.0, np.nan]]))
    with pytest.raises(ConfigError):
        oracle_choice(np.array([1.0, 2.0]))


def test_equal_cost_oracle_bisects_to_the_switching_multiplier():
    # both queries prefer the costly column 0 (reward 1 at cost 10); column 1 costs 2.
    # Query 1 switches to column 1 once 1 - 10 mu < 0.9 - 2 mu, i.e. mu > 0.0125;
    # query 0 only past mu = 0.025. Budget 6 = (10 + 2) / 2 is met first at mu = 0.0125.
    R = np.array([[1.0, 0.8], [1.0, 0.9]])
    C = np.array([[10.0, 2.0], [10.0, 2.0]])
    ch, mu = equal_cost_oracle(R, C, budget=6.0)
    assert ch.tolist() == [0, 1]
    assert mu == pytest.approx(0.0125, rel=1e-6)
    assert pick(C, ch).mean() <= 6.0
    # the budget of the unconstrained oracle: no multiplier needed
    ch, mu = equal_cost_oracle(R, C, budget=10.0)
    assert (ch.tolist(), mu) == ([0, 0], 0.0)
    # a budget only the cheapest columns meet: everyone takes column 1
    ch, mu = equal_cost_oracle(R, C, budget=2.0)
    assert ch.tolist() == [1, 1] and mu > 0.025
    with pytest.raises(ConfigError):
        equal_cost_oracle(R, C, budget=1.0)  # below every query's cheapest column
    with pytest.raises(ConfigError):
        equal_cost_oracle(R, C[:, :1], budget=6.0)


def test_segment_best_in_sample():
    R = np.array([[1.0, 0.0], [0.8, 0.1], [0.0, 1.0], [0.1, 0.7]])
    labels = ["a", "a", "b", "b"]
    assert segment_choice(R, labels) == {"a": 0, "b": 1}
    vals = segment_values(R, labels, {"a": 0, "b": 1})
    assert vals.tolist() == [1.0, 0.8, 1.0, 0.7]
    assert vals.mean() - R[:, best_static(R)].mean() == pytest.approx(0.875 - 0.475)
    assert segment_values(R, ["a", "a", "c", "c"], {"a": 1}, fallback=0).tolist() == \
        [0.0, 0.1, 0.0, 0.1]
    with pytest.raises(ConfigError):
        segment_values(R, ["a", "a", "c", "c"], {"a": 1})


def test_fold_assignment_is_stratified_and_seeded():
    labels = ["a"] * 5 + ["b"] * 4
    f = fold_assignment(labels, 2, seed=3)
    assert f.tolist() == fold_assignment(labels, 2, seed=3).tolist()
    for s in ("a", "b"):
        counts = np.bincount(f[np.array(labels) == s], minlength=2)
        assert counts.min() >= 2 and counts.max() - counts.min() <= 1


def test_crossfit_keeps_a_real_segment_effect():
    # segment a always prefers column 0, b column 1: whatever half chooses, the choice holds;
    # the static choice (column 0 on ties) loses 1 on every b query -> gain 0.5 on average
    R = np.array([[1.0, 0.0]] * 4 + [[0.0, 1.0]] * 4)
    labels = ["a"] * 4 + ["b"] * 4
    gain = crossfit_segment_gain(R, labels, n_folds=2, repeats=5, seed=0)
    assert gain.tolist() == [0.0] * 4 + [1.0] * 4


def test_crossfit_removes_an_in_sample_effect_that_is_noise():
    # in-sample, choosing per segment gains +0.025 (a: column 0, b: column 1), but each
    # segment's two queries disagree, so a choice made on one query never helps the other
    R = np.array([[1.0, 0.0], [0.0, 0.9], [0.0, 1.0], [0.9, 0.0]])
    labels = ["a", "a", "b", "b"]
    in_sample = segment_values(R, labels, segment_choice(R, labels)).mean() \
        - R[:, best_static(R)].mean()
    assert in_sample == pytest.approx(0.025)
    gain = crossfit_segment_gain(R, labels, n_folds=2, repeats=10, seed=0)
    assert gain.mean() <= 0.0


def test_rung_spearman():
    rng = np.random.default_rng(0)
    # every query ranks the configs the same way: any subset gives the full ranking
    R = np.arange(6.0)[None, :] + rng.normal(size=(40, 1))
    rho = rung_spearman(R, 5, n_subsets=7, seed=1)
    assert rho.shape == (7,) and np.allclose(rho, 1.0)
    # the full split itself agrees perfectly even with noisy rows
    noisy = rng.normal(size=(40, 6))
    assert np.allclose(rung_spearman(noisy, 40, n_subsets=3), 1.0)
    # a score that reverses the order on subsets only
    full = np.arange(40)

    def score(idx):
        return -np.arange(6.0) if idx.size < 40 else np.arange(6.0)

    assert np.allclose(rung_spearman(noisy, 10, n_subsets=2, score=score), -1.0)
    assert np.array_equal(score(full), np.arange(6.0))
    with pytest.raises(ConfigError):
        rung_spearman(noisy, 41)


def test_portfolio_is_fixed_and_spread():
    from rl.kernel.settings import TunerSettings
    from rl.routing.portfolio import PORTFOLIO, portfolio

    policy = TunerSettings.defaults()
    cfgs = portfolio(policy)
    assert 24 <= len(cfgs) <= 32
    assert cfgs[0][1] == policy.base_config()  # the static default comes first
    assert len({c.config_hash for _, c in cfgs}) == len(cfgs)
    assert len({n for n, _ in PORTFOLIO}) == len(PORTFOLIO)
    assert {c.variant for _, c in cfgs} == {"bm25", "dense", "hybrid", "graph"}
    assert {c.normalisation for _, c in cfgs} == {"minmax", "zscore", "rrf"}
    assert {c.rerank for _, c in cfgs} == {"none", "cosine"}
    assert {c.prompt_id for _, c in cfgs} == {"cite_concise", "cite_concise_abstain"}
    assert min(c.k for _, c in cfgs) == 1 and max(c.k for _, c in cfgs) == 32



def test_formulation_arms_add_each_non_abstaining_arm_per_other_formulation():
    from rl.kernel.settings import TunerSettings
    from rl.routing.portfolio import portfolio, with_formulations

    base = portfolio(TunerSettings.defaults())
    extra = ("search-best-known", base[1][1].replace(k=7))
    arms = with_formulations([*base, extra], ("last_two_user", "all_user"),
                             skip={"search-best-known"})
    abstaining = sum("abstain" in c.prompt_id for _, c in base)
    assert len(arms) == len(base) + 1 + 2 * (len(base) - abstaining)  # 31 -> 85
    assert arms[:len(base) + 1] == [*base, extra]
    assert len({c.config_hash for _, c in arms}) == len(arms)
    named = dict(arms)
    assert named["graph-k3@all_user"] == named["graph-k3"].replace(query_formulation="all_user")
    assert not any(n.startswith(("search-best-known@", "hybrid-k3-abstain@")) for n, _ in arms)
    assert with_formulations(base, ()) == base
    # an arm already on a formulation gets the others, "last_turn" meaning None
    own = [("x", base[0][1].replace(query_formulation="all_user"))]
    got = with_formulations(own, ("last_turn", "all_user"))
    assert [n for n, _ in got] == ["x", "x@last_turn"]
    assert got[1][1].query_formulation is None
