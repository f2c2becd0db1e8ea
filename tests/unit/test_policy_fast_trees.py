"""Packed gradient-boosted trees predict exactly what sklearn does (rl.policy.fast_trees), and
the router's policy adapter chooses what the router chooses (rl.policy.base.RouterPolicy)."""

from __future__ import annotations

import numpy as np
import pytest

from rag.config import RAGConfig
from rl.policy.base import RouterPolicy
from rl.policy.fast_trees import PackedTrees
from rl.policy.router import RouterParams, SupervisedRouter, arm_features


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
