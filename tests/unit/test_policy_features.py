"""rl.routing.features: a fixed float32 observation that reads no gold (issue 19)."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from rag.config import RAGConfig
from rag.types import Example, Hit
from rl.routing.features import (
    FEATURE_DTYPE,
    FEATURE_NAMES,
    N_FEATURES,
    QUESTION_NAMES,
    QueryFeaturizer,
    question_features,
    rank_biased_overlap,
)

DOCS = [f"d{i}" for i in range(30)]


class ToyRetriever:
    """Deterministic hits from the query's words: no index, no model weights."""

    def __init__(self, salt: int):
        self.salt = salt
        self.calls: list[tuple[str, int, dict]] = []

    def search(self, query: str, top_n: int = 10, **kw) -> list[Hit]:
        self.calls.append((query, top_n, kw))
        h = sum(ord(c) for c in query) + self.salt
        order = sorted(DOCS, key=lambda d: (hash((d, h % 97)) % 1000, d))
        return [Hit(score=10.0 / (i + 1) + (h % 7) * 0.1, id=d)
                for i, d in enumerate(order[:top_n])]


class ToyIndexes:
    def __init__(self):
        self.b, self.d, self.g = ToyRetriever(1), ToyRetriever(2), ToyRetriever(3)

    def bm25(self, backend="tantivy"):
        return self.b

    def dense(self, kind="flat"):
        return self.d

    def graph(self, bm25_backend=None, dense_kind="flat"):
        return self.g


def _example(**over) -> Example:
    base = Example(id="q1", question="Which is older, the Eiffel Tower or Big Ben?",
                   answers=("Big Ben",), gold_passage_ids=("d3", "d4"), qrels={"d3": 1},
                   supporting_facts=(("Big Ben", 0),), gold_titles=("Big Ben",),
                   category="comparison",
                   history=({"role": "user", "text": "Tell me about London towers."},
                            {"role": "agent", "text": "Big Ben is a clock tower."}),
                   metadata={"turn": "2", "collection": "x", "answerability": "ANSWERABLE"})
    return dataclasses.replace(base, **over)


def test_shape_dtype_and_names():
    x = QueryFeaturizer(ToyIndexes(), RAGConfig()).features(_example())
    assert x.shape == (N_FEATURES,) and x.dtype == FEATURE_DTYPE
    assert len(set(FEATURE_NAMES)) == N_FEATURES
    assert np.all(np.isfinite(x))


def test_no_gold_leaks():
    """Answers, qrels, gold passages, facts, titles, category and metadata change nothing."""
    a = QueryFeaturizer(ToyIndexes(), RAGConfig()).features(_example())
    leaked = _example(answers=("Eiffel Tower", "1889"), gold_passage_ids=("d9",),
                      qrels={"d9": 2, "d1": 1}, supporting_facts=(("Eiffel Tower", 3),),
                      gold_titles=("Eiffel Tower",), category="bridge",
                      metadata={"turn": "7", "collection": "y",
                                "answerability": "UNANSWERABLE"}, id="other")
    b = QueryFeaturizer(ToyIndexes(), RAGConfig()).features(leaked)
    np.testing.assert_array_equal(a, b)


def test_history_and_question_do_change_features():
    f = QueryFeaturizer(ToyIndexes(), RAGConfig())
    a = f.features(_example())
    single = f.features(_example(history=()))
    other = f.features(_example(question="Who wrote Hamlet?"))
    col = FEATURE_NAMES.index("turn_index")
    assert a[col] == 1.0 and single[col] == 0.0
    assert not np.array_equal(a, other)


def test_retrieval_query_follows_the_config_formulation():
    idx = ToyIndexes()
    cfg = RAGConfig(query_formulation="last_two_user")
    QueryFeaturizer(idx, cfg).features(_example())
    query = idx.b.calls[0][0]
    assert query == "Tell me about London towers.\n" + _example().question
    assert idx.g.calls[0][2] == {"damping": cfg.graph_damping, "n_seeds": cfg.graph_seeds}


@pytest.mark.parametrize("q, cue", [("Is Paris in France?", "is_yesno"),
                                    ("Tea or coffee, which came first?", "has_or"),
                                    ("Which tower is taller than the other?", "has_comparison"),
                                    ("Who founded Acme Corp in 1990?", "wh_who")])
def test_question_cues(q, cue):
    v = dict(zip(QUESTION_NAMES, question_features(q), strict=True))
    assert v[cue] == 1.0


def test_rank_biased_overlap_bounds():
    assert rank_biased_overlap(["a", "b"], ["a", "b"]) == pytest.approx(1.0)
    assert rank_biased_overlap(["a", "b"], ["c", "d"]) == 0.0
    assert rank_biased_overlap([], ["a"]) == 0.0


def test_formulation_views_are_the_retrieval_features_on_each_formulation():
    """Views: base columns, then RETRIEVAL_NAMES per formulation, then base minus each; the
    view equals a featurizer whose config uses that formulation."""
    from rl.routing.features import RETRIEVAL_NAMES, feature_names

    views = ("last_two_user", "all_user")
    f = QueryFeaturizer(ToyIndexes(), RAGConfig(), views)
    x = f.features(_example())
    n = len(RETRIEVAL_NAMES)
    assert f.names == feature_names(views) and x.shape == (N_FEATURES + 4 * n,)
    np.testing.assert_array_equal(x[:N_FEATURES],
                                  QueryFeaturizer(ToyIndexes(), RAGConfig()).features(_example()))
    for j, qf in enumerate(views):
        own = QueryFeaturizer(ToyIndexes(), RAGConfig(query_formulation=qf)).features(_example())
        view = x[N_FEATURES + j * n:N_FEATURES + (j + 1) * n]
        np.testing.assert_array_equal(view, own[:n])
        diff = x[N_FEATURES + (2 + j) * n:N_FEATURES + (3 + j) * n]
        np.testing.assert_allclose(diff, x[:n] - view, atol=1e-5)
    assert f.names[N_FEATURES] == "bm25_s1@last_two_user"
    # the history changes the views; on a single-turn question they copy the base columns
    single = f.features(_example(history=()))
    np.testing.assert_array_equal(single[N_FEATURES:N_FEATURES + n], single[:n])
    assert not np.any(single[N_FEATURES + 2 * n:])
    assert np.any(x[N_FEATURES + 2 * n:])


def test_featurizer_rebuilt_from_saved_names_and_bad_names_refused():
    from rl.routing.features import conversation_views, feature_names, formulations_of

    views = conversation_views([_example(history=()), _example()])
    assert views == ("last_two_user", "all_user")
    assert conversation_views([_example(history=())]) == ()
    f = QueryFeaturizer.for_names(ToyIndexes(), RAGConfig(), feature_names(views))
    assert f.formulations == views
    assert QueryFeaturizer.for_names(ToyIndexes(), RAGConfig(), []).names == FEATURE_NAMES
    assert formulations_of(FEATURE_NAMES) == ()
    with pytest.raises(ValueError, match="not this featurizer's columns"):
        formulations_of(FEATURE_NAMES[::-1])
    with pytest.raises(ValueError, match="not this featurizer's columns"):
        formulations_of(feature_names(views)[:-1])
    with pytest.raises(ValueError, match="query formulation must be one of"):
        QueryFeaturizer(ToyIndexes(), RAGConfig(), ("rewrite_llm",))


def test_formulations_with_the_same_query_retrieve_once():
    """A first turn: every formulation is the question (one retrieval per retriever); one
    earlier user turn: last_two_user and all_user are the same query (two)."""
    idx = ToyIndexes()
    f = QueryFeaturizer(idx, RAGConfig(), ("last_two_user", "all_user"))
    f.features(_example(history=()))
    assert len(idx.b.calls) == len(idx.d.calls) == len(idx.g.calls) == 1
    f.features(_example())
    assert len(idx.b.calls) == 3
    assert idx.b.calls[1][0] == _example().question
    assert idx.b.calls[2][0] == "Tell me about London towers.\n" + _example().question
