"""rl.common.fanout without Ray: batch-aligned shards, and the index fan-out's coupling to
rag.index.dense (the same passage texts, the same embedding-cache file, so the FAISS build reads
the vectors the Ray tasks made). A fake encoder: no model weights."""

from __future__ import annotations

import numpy as np
import pytest

from rl.common import fanout


def test_shard_bounds_align_on_batches_and_cover_everything():
    assert fanout.shard_bounds(20, 2, 8) == [(0, 16), (16, 20)]
    assert fanout.shard_bounds(5, 4, 8) == [(0, 5)]
    assert fanout.shard_bounds(0, 3, 8) == []
    assert fanout.shard_bounds(24, 3, 8) == [(0, 8), (8, 16), (16, 24)]
    for n in range(1, 60):
        for k in (1, 2, 3, 7):
            b = fanout.shard_bounds(n, k, 8)
            assert b[0][0] == 0 and b[-1][1] == n and len(b) <= k
            assert all(s1 == s0 for (_, s1), (s0, _) in zip(b, b[1:], strict=False))
            assert all(a % 8 == 0 and a < z for a, z in b)


class FakeEncoder:
    name, fingerprint, dim = "fake", "fakefp", 3


def test_primed_vectors_are_what_the_faiss_build_reads(tiny_corpus, tmp_path, monkeypatch):
    import rag.index.dense as dense

    monkeypatch.setattr(dense, "cache_dir", lambda: tmp_path)
    seen = {}

    def fake_encode(encoder, texts, **kw):
        seen["texts"] = list(texts)
        return np.zeros((len(texts), 3), dtype=np.float32)

    monkeypatch.setattr(dense, "encode_documents", fake_encode)
    dense.embed_corpus(tiny_corpus, FakeEncoder(), use_cache=True)
    assert seen["texts"] == fanout.passage_texts(tiny_corpus)
    assert fanout.embedding_cache_path(tiny_corpus, FakeEncoder()).exists()  # same file

    ones = np.ones((len(tiny_corpus), 3), dtype=np.float32)
    path = fanout.embedding_cache_path(tiny_corpus, FakeEncoder())
    path.unlink()
    assert fanout.prime_embeddings(tiny_corpus, FakeEncoder(), lambda texts, bs: ones)
    seen.clear()
    assert (dense.embed_corpus(tiny_corpus, FakeEncoder()) == 1).all() and not seen
    assert not fanout.prime_embeddings(tiny_corpus, FakeEncoder(), lambda texts, bs: 1 / 0)
    path.unlink()
    with pytest.raises(ValueError, match="expected"):
        fanout.prime_embeddings(tiny_corpus, FakeEncoder(), lambda texts, bs: ones[:1])
