"""The residual PPO policy's view of the supervised router (`rl.routing.router.stacked`): on the
roles the router was fitted on, its scores are out of fold; on every other role they are its
own."""

from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("sklearn")


def _planted(rng, n):
    X = rng.normal(size=(n, 4))
    R = np.column_stack([X[:, 0], -X[:, 0], 0.2 * X[:, 1]]) + 0.3 * rng.normal(size=(n, 3))
    return X, R, np.tile([100.0, 300.0, 50.0], (n, 1))


def test_fitted_roles_get_out_of_fold_scores_and_the_others_the_routers_own():
    from rag.config import RAGConfig
    from rag.errors import ConfigError
    from rl.routing.router import (
        ROUTER_FEATURE_NAMES,
        STACK_FOLDS,
        RouterParams,
        SupervisedRouter,
        arm_features,
        out_of_fold_scores,
        router_view,
        stacked,
    )

    rng = np.random.default_rng(0)
    data = {r: _planted(rng, n) for r, n in (("train", 150), ("valid", 60), ("test", 60))}
    X = {r: d[0] for r, d in data.items()}
    M = {"train": {"R": data["train"][1], "T": data["train"][2]}}
    configs = [RAGConfig(variant="bm25", k=3), RAGConfig(variant="dense", k=8),
               RAGConfig(variant="hybrid", k=2)]
    desc = arm_features(configs)
    params = RouterParams(max_iter=30, max_leaf_nodes=7, min_samples_leaf=10)
    router = SupervisedRouter(params, seed=0).fit(X["train"], M["train"]["R"],
                                                  M["train"]["T"], desc)
    groups = {"train": [str(i // 3) for i in range(150)]}  # groups of 3, like conversations

    Xo, arms = stacked(router, 0.0, 0, X, M, groups, configs, seed=0)

    width = X["train"].shape[1] + len(ROUTER_FEATURE_NAMES)
    for role in X:
        assert Xo[role].shape == (len(X[role]), width)
        assert np.array_equal(Xo[role][:, :4], X[role])  # the query features come first
    oof = out_of_fold_scores(params, X["train"], M["train"]["R"], M["train"]["T"], desc,
                             groups["train"], STACK_FOLDS, 0)
    want, F = router_view(router, 0.0, 0, desc, oof)
    assert np.array_equal(arms["train"], want) and np.allclose(Xo["train"][:, 4:], F)
    in_sample, _ = router_view(router, 0.0, 0, desc, router.predict(X["train"]))
    assert not np.allclose(Xo["train"][:, 4], router.predict(X["train"])[
        np.arange(150), in_sample])  # out of fold, not the router's own fit
    for role in ("valid", "test"):  # never fitted on: the router's own picks and view
        assert np.array_equal(arms[role], router.choose(X[role], 0.0))
        assert np.allclose(Xo[role][:, 4:],
                           router_view(router, 0.0, 0, desc, router.predict(X[role]))[1])
    # the planted structure: the router picks arm 0 where x0 > 0 and arm 1 where x0 < 0
    sure = np.abs(X["test"][:, 0]) > 1.0
    assert np.mean(arms["test"][sure] == np.where(X["test"][sure, 0] > 0, 0, 1)) > 0.9

    # a price on tokens moves the base picks towards the cheap arm (hybrid-k2, 50 tokens)
    _, priced = stacked(router, 0.01, 0, X, M, groups, configs, seed=0)
    assert np.mean(priced["test"] == 2) > np.mean(arms["test"] == 2)

    # out-of-fold scores given (the CV's own, `Selection.oof`) are used as they are
    given = oof + 1.0
    Xg, arms_g = stacked(router, 0.0, 0, X, M, groups, configs, seed=0, oof=given)
    assert np.allclose(Xg["train"][:, 4:], router_view(router, 0.0, 0, desc, given)[1])
    assert np.allclose(Xg["test"], Xo["test"])  # other roles: the router's own, as before
    with pytest.raises(ConfigError, match="oof"):
        stacked(router, 0.0, 0, X, M, groups, configs, seed=0, oof=given[:10])
