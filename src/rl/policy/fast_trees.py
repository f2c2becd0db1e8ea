"""Per-request prediction of fitted sklearn `HistGradientBoostingRegressor`s in well under a
millisecond: every tree of every model packed into flat numpy arrays and walked for all trees
at once, one depth level per step.

Why: sklearn's `predict` costs ~1-2 ms per call and model even for one row (input checks,
thread pools), so the supervised router's 30 per-arm models took tens of ms per request; the
serving policy's pick has a budget of 5 ms (issue 19). The result equals `model.predict(X)`
(squared-error loss: baseline + the sum of the leaf values; numerical splits only, missing
values follow `missing_go_to_left`); `tests/unit/test_policy_fast_trees.py` checks it.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from rag.errors import ConfigError


class PackedTrees:
    """The trees of `models` (fitted HistGradientBoostingRegressor, squared error) as flat
    arrays; `predict(X)` -> (n, len(models)), column j = models[j].predict(X)."""

    def __init__(self, models: Sequence):
        feat, thr, left, right, leaf, value, miss, roots, owner = ([] for _ in range(9))
        base, offset, depth = [], 0, 0
        for j, m in enumerate(models):
            if getattr(m, "_loss", None) is not None and type(m._loss).__name__ not in (
                    "HalfSquaredError",):
                raise ConfigError("models", f"model {j}: only squared-error regressors pack")
            base.append(float(np.ravel(m._baseline_prediction)[0]))
            for (pred,) in m._predictors:
                nodes = pred.nodes
                if np.any(nodes["is_categorical"]):
                    raise ConfigError("models", f"model {j}: categorical splits do not pack")
                feat.append(nodes["feature_idx"].astype(np.int64))
                thr.append(nodes["num_threshold"].astype(np.float64))
                left.append(nodes["left"].astype(np.int64) + offset)
                right.append(nodes["right"].astype(np.int64) + offset)
                leaf.append(nodes["is_leaf"].astype(bool))
                value.append(nodes["value"].astype(np.float64))
                miss.append(nodes["missing_go_to_left"].astype(bool))
                roots.append(offset)
                owner.append(j)
                depth = max(depth, int(nodes["depth"].max()))
                offset += len(nodes)
        if not roots:
            raise ConfigError("models", "no fitted trees to pack")
        cat = np.concatenate
        self.feature, self.threshold = cat(feat), cat(thr)
        is_leaf, self.missing_left = cat(leaf), cat(miss)
        self.value = cat(value)
        # leaves point to themselves and never compare, so a walk needs no leaf test
        idx = np.arange(is_leaf.size)
        self.children = np.column_stack([np.where(is_leaf, idx, cat(right)),
                                         np.where(is_leaf, idx, cat(left))])
        self.feature[is_leaf] = 0
        self.roots, self.owner = np.asarray(roots), np.asarray(owner)
        self.baseline = np.asarray(base)
        self.depth = depth
        self.n_models = len(base)
        # trees are contiguous per model: reduceat sums each model's block of trees
        self._starts = np.flatnonzero(np.r_[True, np.diff(self.owner) != 0])

    def predict(self, X: np.ndarray) -> np.ndarray:
        X = np.atleast_2d(np.asarray(X, dtype=np.float64))
        if X.shape[0] == 1:
            return self._predict_one(X[0])[None, :]
        n = X.shape[0]
        node = np.broadcast_to(self.roots, (n, self.roots.size)).copy()
        rows = np.arange(n)[:, None]
        nan = bool(np.isnan(X).any())
        for _ in range(self.depth):
            x = X[rows, self.feature[node]]
            go_left = x <= self.threshold[node]
            if nan:
                go_left = np.where(np.isnan(x), self.missing_left[node], go_left)
            node = self.children[node, go_left.astype(np.int64)]
        return self._sum(self.value[node])

    def _predict_one(self, x: np.ndarray) -> np.ndarray:
        """One row, flat gathers only (the serving path: one request at a time)."""
        flat = self._flat_children
        node = self.roots.copy()
        nan = bool(np.isnan(x).any())
        for step in range(self.depth):
            xv = x[self.feature[node]]
            go_left = xv <= self.threshold[node]
            if nan:
                go_left = np.where(np.isnan(xv), self.missing_left[node], go_left)
            nxt = flat[2 * node + go_left]
            if step % 4 == 3 and np.array_equal(nxt, node):  # every tree at a leaf
                break
            node = nxt
        return self._sum(self.value[node][None, :])[0]

    @property
    def _flat_children(self) -> np.ndarray:
        return self.children.reshape(-1)

    def _sum(self, leaf_values: np.ndarray) -> np.ndarray:
        sums = np.add.reduceat(leaf_values, self._starts, axis=1)
        out = np.zeros((leaf_values.shape[0], self.n_models))
        out[:, self.owner[self._starts]] = sums
        return out + self.baseline
