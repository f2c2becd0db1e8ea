"""rl.routing.router: the supervised router (B3) and the per-segment lookup (B2)."""

from __future__ import annotations

import numpy as np
import pytest

from rag.config import RAGConfig
from rag.errors import ConfigError
from rl.routing.router import (
    ARM_FEATURE_NAMES,
    CV_MARGINS,
    MARGINS,
    RouterParams,
    SegmentLookup,
    SupervisedRouter,
    arm_features,
    decide,
    out_of_fold_scores,
    select_router,
    select_router_cv,
)
from rl.stats.headroom import pick


def _world(n: int, seed: int):
    """Arm 0 is best when x0 > 0, arm 1 otherwise; arm 2 is mediocre everywhere."""
    rng = np.random.default_rng(seed)
    X = rng.normal(size=(n, 3))
    R = np.column_stack([np.where(X[:, 0] > 0, 1.0, 0.0), np.where(X[:, 0] > 0, 0.0, 1.0),
                         np.full(n, 0.6)]) + rng.normal(scale=0.05, size=(n, 3))
    T = np.tile([100.0, 300.0, 50.0], (n, 1))
    return X, R, T


def test_router_learns_the_context_and_beats_static():
    X, R, T = _world(400, 0)
    Xt, Rt, _ = _world(400, 1)
    router, sel = select_router(X, R, Xt, Rt, T, grid=(RouterParams(max_iter=50),))
    got = pick(Rt, router.choose(Xt)).mean()
    assert got > Rt.mean(axis=0).max() + 0.2
    assert sel.best == 0 and sel.tried[0]["valid_reward"] == pytest.approx(got)


def test_pooled_router_learns_the_context_too():
    X, R, T = _world(300, 0)
    Xt, Rt, _ = _world(300, 1)
    arms = arm_features([RAGConfig(k=3), RAGConfig(k=8, variant="dense"),
                         RAGConfig(k=5, rerank="cosine")])
    assert arms.shape == (3, len(ARM_FEATURE_NAMES))
    r = SupervisedRouter(RouterParams(max_iter=100, pooled=True)).fit(X, R, T, arms)
    assert r.predict(Xt).shape == Rt.shape and r.n_arms == 3
    assert pick(Rt, r.choose(Xt)).mean() > Rt.mean(axis=0).max() + 0.2


def test_shrink_zero_is_the_best_static_arm():
    X, R, T = _world(200, 0)
    r = SupervisedRouter(RouterParams(max_iter=20, shrink=0.0)).fit(X, R, T)
    assert set(r.choose(X).tolist()) == {int(np.argmax(R.mean(axis=0)))}


def test_token_price_meets_the_budget():
    X, R, T = _world(300, 0)
    r = SupervisedRouter(RouterParams(max_iter=30)).fit(X, R, T)
    assert pick(T, r.choose(X, 0.0)).mean() > 150
    price = r.fit_token_price(X, T, budget=150.0)
    assert price > 0 and pick(T, r.choose(X)).mean() <= 150.0
    assert r.fit_token_price(X, T, budget=1e9) == 0.0


def test_router_rejects_bad_input():
    with pytest.raises(ConfigError):
        SupervisedRouter().fit(np.zeros((3, 2)), np.zeros((4, 2)))
    with pytest.raises(ConfigError):
        SupervisedRouter().predict(np.zeros((1, 2)))


def test_segment_lookup_with_fallback():
    R = np.array([[1.0, 0.0], [1.0, 0.0], [0.0, 1.0], [0.4, 0.6]])
    lk = SegmentLookup().fit(R, ["a", "a", "b", "b"])
    assert lk.table == {"a": 0, "b": 1}
    assert lk.choose(["b", "a", "unseen"]).tolist() == [1, 0, lk.fallback]


def test_out_of_fold_scores_never_see_their_own_rows_or_group():
    from rl.routing.router import out_of_fold_scores
    from rl.stats.headroom import group_folds

    X, R, T = _world(300, 4)
    groups = [f"conv{i // 3}" for i in range(300)]  # conversations of 3 queries
    folds = group_folds(groups, 5, seed=0)
    for g in set(groups):  # a conversation never straddles folds
        assert len({int(folds[i]) for i in range(300) if groups[i] == g}) == 1
    assert max(np.bincount(folds)) - min(np.bincount(folds)) <= 3  # balanced
    p = RouterParams(max_iter=50)
    S = out_of_fold_scores(p, X, R, T, None, groups, 5, seed=0)
    # rewriting fold 0's rewards cannot move fold 0's scores (they come from the other folds)
    R2 = R.copy()
    R2[folds == 0] = -R2[folds == 0]
    S2 = out_of_fold_scores(p, X, R2, T, None, groups, 5, seed=0)
    assert np.allclose(S[folds == 0], S2[folds == 0]) and not np.allclose(S, S2)
    # out of fold, the router still learns the context (arm 0 iff x0 > 0)
    assert np.mean(S.argmax(axis=1)[:, None] == np.where(X[:, :1] > 0, 0, 1)) > 0.9
    with pytest.raises(ConfigError, match="2 groups cannot fill 5 folds"):
        group_folds(["a", "b"] * 10, 5)


def test_router_features_pick_what_the_priced_router_picks():
    from rl.routing.router import ROUTER_FEATURE_NAMES, router_features

    X, R, T = _world(200, 5)
    configs = [RAGConfig(variant="bm25", k=3), RAGConfig(variant="dense", k=8),
               RAGConfig(variant="hybrid", k=2)]
    router = SupervisedRouter(RouterParams(max_iter=50)).fit(X, R, T)
    for price in (0.0, 0.01):
        picks, F = router_features(router.predict(X), price, router.arm_tokens, 2,
                                   arm_features(configs))
        assert np.array_equal(picks, router.choose(X, price))
        assert F.shape == (200, len(ROUTER_FEATURE_NAMES))
        S = router.predict(X)
        assert np.allclose(F[:, 0], S[np.arange(200), picks])  # predicted reward of the pick
        assert np.allclose(F[:, 2], F[:, 0] - S[:, 2])  # its gain over the static arm
        assert np.all(F[:, 3] >= 0)  # margin over the runner-up
    # a high token price sends every query to the cheapest arm (arm 2, 50 tokens)
    picks, F = router_features(router.predict(X), 1.0, router.arm_tokens, 2, arm_features(configs))
    assert set(picks) == {2} and np.allclose(F[:, 4], np.log1p(50.0))


def test_decide_keeps_the_static_arm_unless_the_gain_clears_the_margin():
    pred = np.array([[0.50, 0.53, 0.40], [0.50, 0.60, 0.40], [0.50, 0.45, 0.40]])
    tokens = np.zeros(3)
    assert decide(pred, 0.0, tokens).tolist() == [1, 1, 0]  # plain argmax
    assert decide(pred, 0.0, tokens, 0.05, static_arm=2).tolist() == [1, 1, 0]
    assert decide(pred, 0.0, tokens, 0.05, static_arm=0).tolist() == [0, 1, 0]
    assert decide(pred, 0.0, tokens, np.inf, static_arm=0).tolist() == [0, 0, 0]
    # the margin is on priced scores: a token price can erase a gain
    assert decide(pred, 1e-3, np.array([0.0, 100.0, 0.0]), 0.0, 0).tolist() == [0, 0, 0]


def test_cv_selection_switches_where_the_context_pays_and_not_on_noise():
    X, R, T = _world(300, 0)
    Xt, Rt, _ = _world(300, 1)
    grid = (RouterParams(max_iter=40),)
    router, sel = select_router_cv(X, R, T, grid=grid, margins=MARGINS, folds=3)
    assert router.static_arm == int(np.argmax(R.mean(axis=0)))
    assert router.margin < np.inf and len(sel.tried) == 7  # one entry per margin
    assert pick(Rt, router.choose(Xt)).mean() > Rt.mean(axis=0).max() + 0.2
    assert sel.tried[sel.best]["cv_reward"] == max(t["cv_reward"] for t in sel.tried)
    # rewards that are pure noise around a best arm: CV keeps that arm nearly everywhere
    rng = np.random.default_rng(3)
    Rn = np.array([0.6, 0.5, 0.5]) + rng.normal(scale=0.3, size=(300, 3))
    noisy, _ = select_router_cv(X, Rn, T, grid=grid, margins=MARGINS, folds=3)
    assert noisy.static_arm == 0
    assert (noisy.choose(Xt) == 0).mean() > 0.9


def test_cv_takes_conversation_groups_and_refuses_bad_margins_and_groups():
    X, R, T = _world(120, 0)
    groups = [f"c{i // 4}" for i in range(120)]  # conversations of 4 queries
    router, _ = select_router_cv(X, R, T, groups, grid=(RouterParams(max_iter=20),),
                                 margins=(0.0,), folds=3)
    assert router.margin == 0.0
    with pytest.raises(ConfigError, match="margins"):
        select_router_cv(X, R, T, margins=(-0.1,))
    with pytest.raises(ConfigError, match="groups"):
        select_router_cv(X, R, T, groups[:10])


def test_token_price_is_the_lowest_feasible_even_when_spend_is_not_monotone():
    """Arm 0 (static) spends the budget exactly; arm 1 is cheaper on average but dearer on
    these queries; arm 2 is dear everywhere. Unpriced, a few queries go to arm 2 and overspend;
    a small price returns them to the static arm (feasible); a larger one sends everything to
    arm 1, which overspends here, up to the bound. Bisection from the bound alone never finds
    the feasible window in between."""
    X = np.zeros((4, 1))
    T = np.array([[100.0, 120.0, 300.0]] * 4)
    r = SupervisedRouter()
    r._k, r.arm_mean = 3, np.zeros(3)
    r.arm_tokens = np.array([100.0, 50.0, 300.0])  # arm 1 looks cheap on average
    r.static_arm, r.margin = 0, 0.01
    pred = np.array([[0.5, 0.45, 0.60], [0.5, 0.45, 0.50], [0.5, 0.45, 0.50],
                     [0.5, 0.45, 0.50]])
    r.predict = lambda X_: pred  # the price search only needs predictions
    price = r.fit_token_price(X, T, budget=100.0)
    assert pick(T, r.choose(X, price)).tolist() == [100.0] * 4  # all static: feasible
    # the lowest feasible: arm 2's priced gain (0.1 - 200 p) just reaches the margin
    assert price == pytest.approx(0.09 / 200, rel=1e-6)


def test_cv_defaults_to_plain_argmax_and_keeps_the_winners_out_of_fold_scores():
    """The default margins are `CV_MARGINS` (0: plain argmax, the rule the retired
    router_selection study chose, docs/results.md);
    `Selection.oof` is the chosen parameters' out-of-fold predictions, the same numbers
    `out_of_fold_scores` gives with the same folds."""
    X, R, T = _world(200, 0)
    groups = [f"c{i // 4}" for i in range(200)]
    grid = (RouterParams(max_iter=20), RouterParams(max_iter=40, shrink=0.5))
    router, sel = select_router_cv(X, R, T, groups, grid=grid, folds=3)
    assert CV_MARGINS == (0.0,) and router.margin == 0.0 and len(sel.tried) == 2
    assert sel.oof.shape == R.shape
    again = out_of_fold_scores(grid[sel.best], X, R, T, None, groups, 3, 0)
    assert np.allclose(sel.oof, again)
    # in-sample predictions of the refitted router are closer to the rewards than out of fold
    insample = router.predict(X)
    assert np.abs(insample - R).mean() < np.abs(sel.oof - R).mean()


def test_token_price_on_given_scores_ignores_the_router_s_own_predictions():
    """`fit_token_price(scores=)` decides with the scores given (e.g. out of fold): scores
    that favour the dear arm need a price, the router's own (which favour the cheap one) none;
    scores of the wrong shape are refused."""
    r = SupervisedRouter()
    r._k, r.arm_mean = 2, np.zeros(2)
    r.arm_tokens = np.array([100.0, 300.0])
    X = np.zeros((4, 1))
    r.predict = lambda X_: np.array([[0.9, 0.5]] * len(X_))  # own: the cheap arm 0 wins
    T = np.array([[100.0, 300.0]] * 4)
    assert r.fit_token_price(X, T, 100.0) == 0.0
    dear = np.array([[0.5, 0.9]] * 4)  # out of fold, the dear arm 1 looks better
    price = r.fit_token_price(None, T, 100.0, scores=dear)
    assert price > 0 and r.token_price == price
    assert (decide(dear, price, r.arm_tokens) == 0).all()
    assert (decide(dear, price * 0.9, r.arm_tokens) == 1).all()  # the lowest feasible
    with pytest.raises(ConfigError, match="scores"):
        r.fit_token_price(None, T, 100.0, scores=dear[:2])
