"""Held-out check of a trained reranker, through the serving path (`rag.rerank`).

`quick_eval` reranks the project's own retrieval candidates on a valid split and reports the
configured metric for the trained model and for the retrieval order it reranks; the metric key
`<dataset>_<split>_<metric>` (higher is better) is what decides the registry's `@best`.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from rl.adaptation.reranker_config import EvalSpec


def rerank_runs(reranker, queries: Sequence[tuple[str, str, Sequence[Any]]]
                ) -> dict[str, dict[str, float]]:
    """{qid: {passage id: rank-preserving score}} after reranking each query's candidates."""
    run = {}
    for qid, question, passages in queries:
        hits = reranker.rerank(question, list(passages))
        run[qid] = {h.id: float(len(hits) - i) for i, h in enumerate(hits)}
    return run


def candidate_queries(data, examples, retriever: str, depth: int):
    """[(qid, question, [Passage])] from the project's retrieval (the reranker's input)."""
    from rag.config import RAGConfig
    from rag.pipeline import Pipeline

    pipe = Pipeline(data.indexes, RAGConfig(variant=retriever, n_candidates=depth, k=1))
    corpus = data.indexes.corpus
    return [(e.id, e.question, [corpus[h.id] for h in pipe.candidates(e.question)])
            for e in examples]


def qrels_of(examples) -> dict[str, dict[str, int]]:
    return {e.id: (dict(e.qrels) if e.qrels else {g: 1 for g in e.gold_passage_ids})
            for e in examples}


def quick_eval(model_dir: str | Path, spec: EvalSpec, retriever: str = "hybrid") -> dict:
    """The trained model, loaded through the serving path (rag.rerank), on `spec`'s split."""
    from rag.metrics.retrieval import per_query_scores
    from rag.rerank import CrossEncoderReranker
    from rl.common.data import TuningData

    data = TuningData.open(spec.dataset)
    examples = [e for e in data.examples(spec.split) if e.gold_passage_ids][: spec.queries]
    queries = candidate_queries(data, examples, retriever, spec.depth)
    qrels = qrels_of(examples)
    base = {qid: {p.id: float(len(ps) - i) for i, p in enumerate(ps)} for qid, _, ps in queries}
    trained = rerank_runs(CrossEncoderReranker(model_dir), queries)
    key = f"{spec.dataset}_{spec.split}_{spec.metric}"
    return {key: float(np.mean(per_query_scores(trained, qrels, spec.metric))),
            f"{key}_{retriever}": float(np.mean(per_query_scores(base, qrels, spec.metric))),
            f"{spec.dataset}_{spec.split}_queries": len(examples)}

