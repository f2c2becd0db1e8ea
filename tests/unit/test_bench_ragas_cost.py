"""bench/ragas_cost.py's samples: k contexts holding the question's gold passages (cited), the
gold answer as the response, the same samples for the same seed."""

from __future__ import annotations

from bench.ragas_cost import K, samples


def test_samples_hold_the_gold_passages_and_cite_one():
    items = samples("synthetic", 6)
    assert len(items) == 6
    for answer, example in items:
        ids = [c.id for c in answer.contexts]
        assert len(ids) == K == len(set(ids))
        assert set(example.gold_passage_ids[:K]) <= set(ids)
        assert answer.text.startswith(example.answers[0])
        assert answer.cited_ids and answer.cited_ids[0] in example.gold_passage_ids
    again = samples("synthetic", 6)
    assert [a.contexts for a, _ in again] == [a.contexts for a, _ in items]
    assert [a.contexts for a, _ in samples("synthetic", 6, seed=1)] != \
        [a.contexts for a, _ in items]
