"""`rl.routing.train.tv_oof`: the out-of-fold predictions every equal-cost price is fitted on —
the CV's own (`Selection.oof`), or, for a selection pickled before that field existed (a
resumed `policy train --learner ppo` run), the same numbers recomputed with the same folds."""

from __future__ import annotations

import dataclasses
from types import SimpleNamespace

import numpy as np
import pytest

pytest.importorskip("sklearn")


def test_a_selection_without_oof_gets_the_same_scores_recomputed():
    from rag.config import RAGConfig
    from rl.routing.router import RouterParams, arm_features, select_router_cv
    from rl.routing.train import tv_oof

    rng = np.random.default_rng(0)
    n = 120
    X = rng.normal(size=(n, 3))
    R = np.column_stack([X[:, 0], -X[:, 0], 0.1 * X[:, 1]]) + 0.2 * rng.normal(size=(n, 3))
    T = np.tile([100.0, 300.0, 50.0], (n, 1))
    configs = [RAGConfig(variant="bm25", k=3), RAGConfig(variant="dense", k=8),
               RAGConfig(variant="hybrid", k=2)]
    groups = [f"c{i // 3}" for i in range(n)]

    router, sel = select_router_cv(X, R, T, groups, grid=(RouterParams(max_iter=20),),
                                   arms=arm_features(configs))
    prep = SimpleNamespace(X_tv=X, tv=lambda k: {"R": R, "T": T}[k], configs=configs,
                           tv_groups=groups, X={"train": X[:70], "valid": X[70:]})
    assert tv_oof(prep, router, sel) is sel.oof
    legacy = dataclasses.replace(sel, oof=None)
    assert np.allclose(tv_oof(prep, router, legacy), sel.oof)
    # priced on the valid rows' out-of-fold scores, those scores' choices keep the budget
    from rl.routing.router import decide
    from rl.stats.headroom import pick

    budget = float(T[70:, 0].mean())
    unpriced = pick(T[70:], decide(sel.oof[70:], 0.0, router.arm_tokens, router.margin,
                                   router.static_arm)).mean()
    price = router.fit_token_price(None, T[70:], budget, scores=sel.oof[70:])
    spent = pick(T[70:], decide(sel.oof[70:], price, router.arm_tokens, router.margin,
                                router.static_arm)).mean()
    assert unpriced > budget and price > 0 and spent <= budget
