"""Length-bucketed batching (rag.batching): every text once, batches sorted by length, capped
by count and by padded tokens, deterministic; padding and mean pooling ignore pad positions."""

from __future__ import annotations

import numpy as np
import pytest

from rag.batching import l2_normalize, length_buckets, mean_pool, pad_batch, run_longest_first


def test_buckets_cover_every_index_once_in_length_order():
    lengths = [5, 300, 12, 7, 7, 250, 40, 3, 512, 9]
    batches = length_buckets(lengths, batch_size=3)
    flat = np.concatenate(batches)
    assert sorted(flat.tolist()) == list(range(len(lengths)))
    assert [lengths[i] for i in flat] == sorted(lengths)
    assert all(1 <= len(b) <= 3 for b in batches)
    assert flat.tolist()[:4] == [7, 0, 3, 4]  # ties keep input order (stable)


def test_token_budget_caps_padded_size_but_never_drops_a_long_text():
    lengths = [10] * 8 + [100, 100, 900]
    batches = length_buckets(lengths, batch_size=8, max_tokens=200)
    for b in batches:
        width = max(lengths[i] for i in b)
        assert len(b) * width <= 200 or len(b) == 1
    assert [len(b) for b in batches] == [8, 2, 1]


def test_buckets_edge_cases():
    assert length_buckets([], batch_size=4) == []
    assert [b.tolist() for b in length_buckets([4], batch_size=4)] == [[0]]
    with pytest.raises(ValueError):
        length_buckets([1, 2], batch_size=0)


def test_pad_and_mean_pool_ignore_padding():
    ids, mask = pad_batch([[101, 7, 102], [101, 102]], pad_id=0)
    assert ids.tolist() == [[101, 7, 102], [101, 102, 0]]
    assert mask.tolist() == [[1, 1, 1], [1, 1, 0]]
    hidden = np.arange(2 * 3 * 2, dtype=np.float32).reshape(2, 3, 2)
    hidden[1, 2] = 1e6  # a padded position must not leak into the mean
    pooled = mean_pool(hidden, mask)
    np.testing.assert_allclose(pooled, [[2.0, 3.0], [7.0, 8.0]])
    unit = l2_normalize(np.array([[3.0, 4.0], [0.0, 0.0]]))
    np.testing.assert_allclose(unit, [[0.6, 0.8], [0.0, 0.0]])


def test_run_longest_first_runs_each_batch_once_longest_first():
    import threading

    lengths = [5, 1, 9, 3, 7, 2]
    batches = length_buckets(lengths, 2)
    seen, lock = [], threading.Lock()

    def run(rows):
        with lock:
            seen.append(tuple(int(i) for i in rows))

    run_longest_first(batches, run, threads=1, name="t")
    assert seen == [tuple(int(i) for i in b) for b in reversed(batches)]  # one worker: in order
    seen.clear()
    run_longest_first(batches, run, threads=3, name="t")
    assert sorted(seen) == sorted(tuple(int(i) for i in b) for b in batches)
    run_longest_first([], run, threads=2, name="t")  # nothing to do: no pool, no error


def test_run_longest_first_raises_a_worker_error():
    def run(rows):
        raise RuntimeError("boom")

    with pytest.raises(RuntimeError, match="boom"):
        run_longest_first(length_buckets([1, 2, 3, 4], 1), run, threads=2, name="t")
