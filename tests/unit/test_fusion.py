"""Fusion math on hand-computed cases, and MMR."""

import numpy as np
import pytest

from rag.errors import ConfigError
from rag.fusion import fuse_scores, hybrid_fuse, mmr_select, normalise
from rag.types import Hit

BM25 = [Hit(10.0, "a"), Hit(6.0, "b"), Hit(2.0, "c")]
DENSE = [Hit(0.9, "c"), Hit(0.7, "d"), Hit(0.5, "a")]


def test_normalise_edge_cases():
    assert np.allclose(normalise([10, 6, 2]), [1.0, 0.5, 0.0])
    assert np.allclose(normalise([3.0]), [1.0])
    assert np.allclose(normalise([2, 2, 2], "zscore"), [0, 0, 0])
    z = normalise([1, 2, 3], "zscore")
    assert np.isclose(z.mean(), 0) and np.isclose(z.std(), 1)
    with pytest.raises(ConfigError, match="normalisation"):
        normalise([1, 2], "max")


def test_minmax_convex_combination_by_hand():
    # bm25 norm: a 1, b .5, c 0 (floor 0 for d); dense norm: c 1, d .5, a 0 (floor 0 for b)
    out = {h.id: h.score for h in fuse_scores([BM25, DENSE], [0.7, 0.3])}
    assert out == pytest.approx({"a": 0.7, "b": 0.35, "c": 0.3, "d": 0.15}, abs=1e-12)


def test_rrf_by_hand():
    out = {h.id: h.score for h in fuse_scores([BM25, DENSE], [1, 1], method="rrf", rrf_k=60)}
    assert out["a"] == pytest.approx(1 / 61 + 1 / 63, abs=1e-12)
    assert out["c"] == pytest.approx(1 / 63 + 1 / 61, abs=1e-12)
    assert out["b"] == pytest.approx(1 / 62, abs=1e-12)
    # a and c tie: broken by id
    assert [h.id for h in fuse_scores([BM25, DENSE], [1, 1], method="rrf")][:2] == ["a", "c"]


def test_weight_extremes_reproduce_each_list():
    assert [h.id for h in hybrid_fuse(BM25, DENSE, 0.0)][:3] == ["a", "b", "c"]
    assert [h.id for h in hybrid_fuse(BM25, DENSE, 1.0)][:3] == ["c", "d", "a"]
    with pytest.raises(ConfigError, match="fusion_weight"):
        hybrid_fuse(BM25, DENSE, 1.2)


def test_mmr_lambda_one_keeps_order_and_lower_lambda_drops_duplicate():
    ids = ["p1", "p1dup", "p2"]
    vecs = np.array([[1.0, 0.0], [0.999, 0.045], [0.0, 1.0]])
    vecs /= np.linalg.norm(vecs, axis=1, keepdims=True)
    rel = [0.9, 0.85, 0.5]
    assert mmr_select(np.array([1.0, 0]), ids, vecs, rel, 2, 1.0) == ["p1", "p1dup"]
    assert mmr_select(np.array([1.0, 0]), ids, vecs, rel, 2, 0.5) == ["p1", "p2"]
    with pytest.raises(ConfigError, match="mmr_lambda"):
        mmr_select(np.array([1.0, 0]), ids, vecs, rel, 2, 1.5)
