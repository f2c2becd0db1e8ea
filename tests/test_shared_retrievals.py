"""`serving.policy_router.SharedRetrievals`, the retrievers one policy replica shares between
the featurizer and its arms' pipelines, on the synthetic world's real indexes (tantivy, FAISS,
the entity graph): every retriever returns exactly what the index set's own returns; a
question is encoded once whatever `top_n` the featurizer, the graph's seeds and the arm ask;
a pipeline answers through it exactly as through the index set. No Ray."""

from __future__ import annotations

import pytest

from rag.config import RAGConfig

QUESTIONS = ["Which company was founded first?", "Where was person 3 born?",
             "Who founded the company that employs person 7?"]


@pytest.fixture(scope="module")
def indexes():
    from rl.common.data import TuningData

    return TuningData.open("synthetic").indexes


def _same(a, b) -> bool:
    return [(h.id, round(h.score, 6)) for h in a] == [(h.id, round(h.score, 6)) for h in b]


def test_each_retriever_returns_what_the_index_sets_own_returns(indexes):
    from serving.policy_router import SharedRetrievals

    shared = SharedRetrievals(indexes)
    for q in QUESTIONS:
        for top_n in (5, 10, 30):
            assert _same(shared.bm25().search(q, top_n), indexes.bm25().search(q, top_n))
            assert _same(shared.dense().search(q, top_n), indexes.dense().search(q, top_n))
            assert _same(shared.graph().search(q, top_n), indexes.graph().search(q, top_n))
            # asked again: the cached answer, the same
            assert _same(shared.graph().search(q, top_n), indexes.graph().search(q, top_n))


def test_a_question_is_encoded_once_for_every_top_n_and_the_graphs_seeds(indexes,
                                                                         monkeypatch):
    from rag.index.dense import DenseRetriever
    from serving.policy_router import SharedRetrievals

    calls: list[str] = []
    real = DenseRetriever.embed_query

    def counted(self, query):
        calls.append(query)
        return real(self, query)

    monkeypatch.setattr(DenseRetriever, "embed_query", counted)
    shared = SharedRetrievals(indexes)
    q = QUESTIONS[0]
    shared.dense().search(q, 10)
    shared.dense().search(q, 30)
    shared.graph().search(q, 10)  # its dense seed: the shared dense retriever
    shared.dense().embed_query(q)
    assert calls == [q]
    indexes.graph().search(q, 10)  # the index set's own graph encodes again
    assert calls == [q, q]
    # an empty question is refused as by the retriever itself
    with pytest.raises(Exception, match="non-empty"):
        shared.dense().search(" ", 5)


def test_a_pipeline_answers_through_it_as_through_the_index_set(indexes):
    from rag.pipeline import Pipeline
    from serving.policy_router import SharedRetrievals

    shared = SharedRetrievals(indexes)
    for cfg in (RAGConfig(generator="extractive", variant="graph", k=4),
                RAGConfig(generator="extractive", variant="hybrid", k=5, fusion_weight=0.3),
                RAGConfig(generator="extractive", variant="dense", k=3)):
        for q in QUESTIONS:
            a, b = Pipeline(shared, cfg).run(q), Pipeline(indexes, cfg).run(q)
            assert (a.text, a.context_ids) == (b.text, b.context_ids)
