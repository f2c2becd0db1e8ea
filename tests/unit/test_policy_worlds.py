"""`ConcatWorld`: several query worlds addressed as one (a cross-fitted fold's roles span
splits). Query i of the concatenation is the right part's query, batches keep order."""

from __future__ import annotations

import pytest

from rag.config import RAGConfig
from rl.routing.worlds import ConcatWorld, Outcome


class _Part:
    """Reward = 100 * part id + query index + k / 100, so every answer names its source."""

    def __init__(self, pid: int, n: int, cost_ref: float = 1000.0):
        self.pid, self.n, self.cost_ref = pid, n, cost_ref
        self.batches: list[int] = []

    def outcome(self, i, config):
        if not 0 <= i < self.n:
            raise IndexError(i)
        r = 100 * self.pid + i + config.k / 100
        return Outcome(r, r, config.k / 10)

    def outcomes(self, configs):
        self.batches.append(len(configs))
        return [self.outcome(i, c) for i, c in enumerate(configs)]


def test_queries_map_to_their_part_in_order():
    a, b, c = _Part(1, 3), _Part(2, 1), _Part(3, 2)
    w = ConcatWorld([a, b, c])
    assert w.n == 6 and w.cost_ref == 1000.0
    got = [w.outcome(i, RAGConfig(k=5)).reward for i in range(6)]
    assert got == pytest.approx([100.05, 101.05, 102.05, 200.05, 300.05, 301.05])
    batch = w.outcomes([RAGConfig(k=i + 1) for i in range(6)])
    assert [o.reward for o in batch] == pytest.approx([100.01, 101.02, 102.03, 200.04, 300.05,
                                                       301.06])
    # each part answered its own slice in one batch
    assert (a.batches, b.batches, c.batches) == ([3], [1], [2])


def test_bad_queries_batches_and_mixed_prices_are_refused():
    w = ConcatWorld([_Part(1, 2), _Part(2, 2)])
    with pytest.raises(IndexError, match="outside 0..3"):
        w.outcome(4, RAGConfig())
    with pytest.raises(IndexError):
        w.outcome(-1, RAGConfig())
    with pytest.raises(ValueError, match="3 configs for 4 queries"):
        w.outcomes([RAGConfig()] * 3)
    with pytest.raises(ValueError, match="cost_ref"):
        ConcatWorld([_Part(1, 2), _Part(2, 2, cost_ref=500.0)])
    with pytest.raises(ValueError, match="at least one"):
        ConcatWorld([])
