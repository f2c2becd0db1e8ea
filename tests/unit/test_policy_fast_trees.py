"""Packed gradient-boosted trees predict exactly what sklearn does (rl.routing.fast_trees), and
the router's policy adapter chooses what the router chooses (rl.routing.base.RouterPolicy)."""

from __future__ import annotations

import numpy as np
import pytest

from rag.config import RAGConfig
from rag.errors import ConfigError
from rl.routing.base import RouterPolicy
from rl.routing.fast_trees import PackedTrees
from rl.routing.router import RouterParams, SupervisedRouter, _pooled, arm_features


def _data(n: int = 300, d: int = 8, k: int = 4, seed: int = 0):
    rng = np.random.default_rng(seed)
    X = rng.normal(size=(n, d))
    R = np.clip(0.5 + 0.2 * X[:, :k] + rng.normal(0, 0.1, (n, k)), 0, 1)
    T = np.tile(np.arange(1, k + 1) * 100.0, (n, 1))
    return X, R, T


def test_packed_trees_equal_sklearn_including_missing_values():
    from sklearn.ensemble import HistGradientBoostingRegressor

    X, R, _ = _data()
    X[:30, 2] = np.nan
    models = [HistGradientBoostingRegressor(max_iter=40, max_leaf_nodes=7,
                                            early_stopping=False, random_state=j).fit(X, R[:, j])
              for j in range(R.shape[1])]
    ref = np.column_stack([m.predict(X) for m in models])
    assert np.allclose(PackedTrees(models).predict(X), ref, atol=1e-10)
    assert np.allclose(PackedTrees(models).predict(X[5]), ref[5:6], atol=1e-10)


def test_tailed_trees_equal_sklearn_on_pooled_rows():
    """The pooled router's model over (features, arm block): the arm block's node tests done
    once at load give exactly sklearn's prediction of every (query, arm) row, also for
    missing query features, with trees of up to 63 leaves (the bitmask's width)."""
    from sklearn.ensemble import HistGradientBoostingRegressor

    X, R, _ = _data(n=400, k=6)
    X[:40, 1] = np.nan
    arms = np.random.default_rng(1).normal(size=(6, 3))
    model = HistGradientBoostingRegressor(max_iter=30, max_leaf_nodes=63, min_samples_leaf=5,
                                          early_stopping=False, random_state=0)
    model.fit(_pooled(X, arms), R.reshape(-1))
    assert max(int(p.nodes["is_leaf"].sum()) for (p,) in model._predictors) > 40
    ref = model.predict(_pooled(X, arms)).reshape(X.shape[0], 6)
    tailed = PackedTrees([model]).with_tails(np.hstack([np.eye(6), arms]))
    assert np.allclose(tailed.predict(X)[:, :, 0], ref, atol=1e-10)
    assert np.allclose(tailed.predict(X[0])[0, :, 0], ref[0], atol=1e-10)
    with pytest.raises(ConfigError, match="columns"):
        tailed.predict(X[:, :3])
    with pytest.raises(ConfigError, match="tails"):
        PackedTrees([model]).with_tails(np.zeros((6, X.shape[1] + 99)))


def test_trees_wider_than_the_bitmask_are_refused():
    from sklearn.ensemble import HistGradientBoostingRegressor

    X, R, _ = _data(n=600)
    model = HistGradientBoostingRegressor(max_iter=2, max_leaf_nodes=100, min_samples_leaf=2,
                                          early_stopping=False).fit(X, R[:, 0])
    with pytest.raises(ConfigError, match="max_leaf_nodes"):
        PackedTrees([model])


@pytest.mark.parametrize("pooled,shrink", [(False, 1.0), (False, 0.5), (True, 1.0)])
def test_router_policy_chooses_what_the_router_chooses(pooled, shrink):
    X, R, T = _data()
    configs = [RAGConfig().replace(k=k) for k in (1, 2, 3, 4)]
    router = SupervisedRouter(RouterParams(max_iter=30, pooled=pooled, shrink=shrink)).fit(
        X[:200], R[:200], T[:200], arm_features(configs))
    pol = RouterPolicy(router, configs)
    assert np.allclose(pol.predict(X[200:]), router.predict(X[200:]), atol=1e-10)
    assert np.array_equal(pol.act(X[200:]), router.choose(X[200:]))
    router.token_price = 0.002
    assert np.array_equal(pol.act(X[200:]), router.choose(X[200:]))
