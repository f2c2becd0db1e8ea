"""Per-request prediction of fitted sklearn `HistGradientBoostingRegressor`s in a fraction of a
millisecond: every tree of every model packed into flat numpy arrays and evaluated without
walking the trees, by leaf bitmasks (QuickScorer, Lucchese et al., SIGIR 2015).

Contract: `predict` of the packed models equals each model's `predict(X)` (see the last
paragraph); a served pick stays within the serving policy's 5 ms budget where sklearn's own
per-call overhead does not (measurements: docs/design-notes.md).

How: number each tree's leaves left to right; give every split node a bitmask with the bits
of its *left* subtree's leaves cleared. For a row, AND together the masks of the split nodes
whose test sends it right: the exit leaf is the lowest bit still set (every leaf left of it
lies in the left subtree of a node on its path that went right; no node that went right
clears it). The AND is one `reduceat` per tree (the complement of the OR of the bits the
right-going nodes clear), so nothing depends on the previous step. Trees of at most 64 leaves
fit one uint64 word, of at most 32 (every router of `PARAM_GRID`: 31) one uint32.

The node tests: each distinct (feature, threshold) pair is compared once and the result
gathered per node (`_Splits.tree_masks`), with uint32 words where the trees allow: a served
pick is bound by the bytes it reads per node.

The pooled router predicts rows (query features, arm block) for every arm: `TailedTrees`
splits the split nodes into query nodes and arm-block nodes and ANDs the arm-block masks once
at load time, so a request tests the query nodes once, not once per arm.

The result equals `model.predict(X)` (squared-error loss: baseline + the sum of the leaf values;
numerical splits only, missing values follow `missing_go_to_left`);
`tests/unit/test_policy_fast_trees.py` checks it.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from rag.errors import ConfigError

MAX_LEAVES = 64
"""Leaves per tree that one uint64 bitmask holds."""
_ALL = np.uint64(0xFFFF_FFFF_FFFF_FFFF)
_CHUNK = 1 << 22
"""Most (row, node) tests held at once in a batch prediction (32 MiB of uint64 masks)."""


def _leaf_order(left: np.ndarray, right: np.ndarray, is_leaf: np.ndarray
                ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(leaves left to right, lo, hi): node i's subtree holds leaves lo[i] .. hi[i] - 1."""
    lo, hi = np.zeros(is_leaf.size, np.int64), np.zeros(is_leaf.size, np.int64)
    order: list[int] = []
    stack = [(0, False)]
    while stack:
        node, children_done = stack.pop()
        if is_leaf[node]:
            lo[node] = len(order)
            order.append(node)
            hi[node] = len(order)
        elif children_done:
            lo[node], hi[node] = lo[left[node]], hi[right[node]]
        else:  # visit left first: pushed last
            stack += [(node, True), (int(right[node]), False), (int(left[node]), False)]
    return np.asarray(order, np.int64), lo, hi


@dataclass
class _Splits:
    """Split nodes of every tree, grouped by tree; each group opens with a sentinel whose
    mask clears nothing, so no group is empty. `dtype`: the masks' word (uint32 when every
    tree has at most 32 leaves, as every router of `PARAM_GRID`; else uint64)."""

    feature: np.ndarray
    threshold: np.ndarray
    missing_left: np.ndarray
    mask: np.ndarray
    starts: np.ndarray
    dtype: type = np.uint64

    def __post_init__(self):
        # the leaf bits a node clears when its test sends a row right (they fit the word)
        self.clear = (~self.mask).astype(self.dtype)
        # every node's (feature, threshold) as a slot among the distinct pairs, so a row's
        # tests are one comparison per distinct pair and a gather (`tree_masks`)
        order = np.lexsort((self.threshold, self.feature))
        f, t = self.feature[order], self.threshold[order]
        new = np.r_[True, (f[1:] != f[:-1]) | (t[1:] != t[:-1])]
        self.slot_feature, self.slot_threshold = f[new], t[new]
        self.slot = np.empty(order.size, np.int64)
        self.slot[order] = np.cumsum(new) - 1

    @classmethod
    def of(cls, trees: Sequence[tuple], keep=None, shift: int = 0,
           dtype: type = np.uint64) -> _Splits:
        """From per-tree (feature, threshold, missing_left, mask) arrays; `keep(feature)`
        selects nodes, `shift` is subtracted from their feature index."""
        parts: list[list[np.ndarray]] = [[], [], [], []]
        starts, size = [], 0
        for feat, thr, miss, mask in trees:
            sel = np.ones(feat.size, bool) if keep is None else keep(feat)
            starts.append(size)
            for out, arr, first in zip(parts, (feat - shift, thr, miss, mask),
                                       (0, np.inf, True, _ALL), strict=True):
                out.append(np.r_[np.asarray([first], arr.dtype), arr[sel]])
            size += 1 + int(sel.sum())
        feat, thr, miss, mask = (np.concatenate(p) for p in parts)
        return cls(feat, thr, miss, mask, np.asarray(starts, np.int64), dtype)

    def tree_masks(self, X: np.ndarray) -> np.ndarray:
        """(n, trees) `dtype`: per row and tree, the AND of the masks of the nodes whose test
        sends the row right, computed as the complement of the OR of the bits they clear.

        The tests: each distinct (feature, threshold) pair is compared once (`slot_*`: the
        trees of one router share HistGradientBoosting's bin edges, so a few thousand pairs
        stand for ~10^5-10^6 nodes) and gathered per node by `slot`. A served pick runs right
        after the question's retrievals, with these arrays out of the CPU caches, so it is
        bound by the bytes it reads per node: 8 (slot) + 4 (clear), not 8 (feature) + 8
        (threshold) + 8 (clear) as a direct comparison would."""
        if np.isnan(X).any():  # missing values follow missing_go_to_left, node by node
            x = X.take(self.feature, axis=1)
            go_right = np.where(np.isnan(x), ~self.missing_left, x > self.threshold)
        else:
            go_right = (X[:, self.slot_feature] > self.slot_threshold).take(self.slot, axis=1)
        cleared = np.multiply(self.clear, go_right, dtype=self.dtype)
        return ~np.bitwise_or.reduceat(cleared, self.starts, axis=1)


def _exit_leaf(masks: np.ndarray) -> np.ndarray:
    """Index of the lowest set bit of each (non-zero) uint64 mask."""
    lowest = masks & (~masks + masks.dtype.type(1))
    return np.frexp(lowest.astype(np.float64))[1] - 1


class PackedTrees:
    """The trees of `models` (fitted HistGradientBoostingRegressor, squared error) as flat
    arrays; `predict(X)` -> (n, len(models)), column j = models[j].predict(X)."""

    def __init__(self, models: Sequence):
        trees, values, owner, base = [], [], [], []
        for j, m in enumerate(models):
            if getattr(m, "_loss", None) is not None and type(m._loss).__name__ not in (
                    "HalfSquaredError",):
                raise ConfigError("models", f"model {j}: only squared-error regressors pack")
            base.append(float(np.ravel(m._baseline_prediction)[0]))
            for (pred,) in m._predictors:
                nodes = pred.nodes
                if np.any(nodes["is_categorical"]):
                    raise ConfigError("models", f"model {j}: categorical splits do not pack")
                is_leaf = nodes["is_leaf"].astype(bool)
                if is_leaf.sum() > MAX_LEAVES:
                    raise ConfigError("models", f"model {j}: a tree has {int(is_leaf.sum())} "
                                                f"leaves; packing supports {MAX_LEAVES} "
                                                f"(max_leaf_nodes)")
                left, right = nodes["left"].astype(np.int64), nodes["right"].astype(np.int64)
                order, lo, hi = _leaf_order(left, right, is_leaf)
                split = np.flatnonzero(~is_leaf)
                width = hi[left[split]] - lo[left[split]]  # < 64: the right side has a leaf
                cleared = ((np.uint64(1) << width.astype(np.uint64)) - np.uint64(1)) \
                    << lo[left[split]].astype(np.uint64)
                trees.append((nodes["feature_idx"][split].astype(np.int64),
                              nodes["num_threshold"][split].astype(np.float64),
                              nodes["missing_go_to_left"][split].astype(bool),
                              _ALL ^ cleared))
                values.append(nodes["value"][order].astype(np.float64))
                owner.append(j)
        if not trees:
            raise ConfigError("models", "no fitted trees to pack")
        self.trees = trees
        leaves = max(v.size for v in values)
        self.dtype = np.uint32 if leaves <= 32 else np.uint64
        self.splits = _Splits.of(trees, dtype=self.dtype)
        self.leaf_value = np.concatenate(values)
        self.leaf_start = np.cumsum([0] + [v.size for v in values[:-1]])
        self.owner = np.asarray(owner)
        self.baseline = np.asarray(base)
        self.n_models = len(base)
        self.n_features = int(models[0].n_features_in_)
        # trees are contiguous per model: reduceat sums each model's block of trees
        self._starts = np.flatnonzero(np.r_[True, np.diff(self.owner) != 0])

    def predict(self, X: np.ndarray) -> np.ndarray:
        X = np.atleast_2d(np.asarray(X, dtype=np.float64))
        rows = max(1, _CHUNK // self.splits.feature.size)
        return np.concatenate([self._sum(self._leaf_values(self.splits.tree_masks(X[i:i + rows])))
                               for i in range(0, max(X.shape[0], 1), rows)])

    def with_tails(self, tails: np.ndarray) -> TailedTrees:
        """These trees for rows (x, tails[a]) of every tail a (module docstring)."""
        return TailedTrees(self, tails)

    def _leaf_values(self, masks: np.ndarray) -> np.ndarray:
        return self.leaf_value[self.leaf_start + _exit_leaf(masks)]

    def _sum(self, leaf_values: np.ndarray) -> np.ndarray:
        """(..., trees) leaf values -> (..., n_models) predictions."""
        sums = np.add.reduceat(leaf_values, self._starts, axis=-1)
        out = np.zeros((*leaf_values.shape[:-1], self.n_models))
        out[..., self.owner[self._starts]] = sums
        return out + self.baseline


class TailedTrees:
    """`packed` for the rows (x, tails[a]) of every tail a: `predict(X)` (n, d) ->
    (n, len(tails), n_models), [i, a] = packed.predict(hstack(X[i], tails[a])). The tails'
    node tests are done here, once (the pooled router's arm one-hot and descriptors)."""

    def __init__(self, packed: PackedTrees, tails: np.ndarray):
        tails = np.atleast_2d(np.asarray(tails, dtype=np.float64))
        self.packed = packed
        self.d = packed.n_features - tails.shape[1]
        if self.d < 0 or not np.all(np.isfinite(tails)):
            raise ConfigError("tails", f"{tails.shape[1]} finite columns of the "
                                       f"{packed.n_features} the trees read were expected")
        d = self.d
        self.query = _Splits.of(packed.trees, keep=lambda f: f < d, dtype=packed.dtype)
        tail = _Splits.of(packed.trees, keep=lambda f: f >= d, shift=d, dtype=packed.dtype)
        self.tail_masks = tail.tree_masks(tails)  # (K, trees)

    def predict(self, X: np.ndarray) -> np.ndarray:
        X = np.atleast_2d(np.asarray(X, dtype=np.float64))
        if X.shape[1] != self.d:
            raise ConfigError("X", f"expected {self.d} columns, got {X.shape[1]}")
        k, t = self.tail_masks.shape
        rows = max(1, _CHUNK // (k * t + self.query.feature.size))
        out = []
        for i in range(0, max(X.shape[0], 1), rows):
            masks = self.query.tree_masks(X[i:i + rows])[:, None, :] & self.tail_masks[None]
            out.append(self.packed._sum(self.packed._leaf_values(masks)))
        return np.concatenate(out)
