"""Metrics that read only an `Answer` and its gold `Example`.

`score_answer` returns lower-case metric names, each in [0, 1]:
  em, f1                       answer vs gold answers (HotpotQA/SQuAD normalisation)
  sp_f1, sp_prec, sp_recall    supporting passages: titles of *cited* passages vs gold titles
                               (gold passage ids when the dataset has no titles)
  citation_precision/recall    cited passage ids vs gold passage ids
  recall@k                     gold passages among the k contexts given to the generator
  recall@2, recall@5, recall@10  gold passages among the top candidates (retrieval quality)
  ndcg@10, mrr@10              graded, over the candidates, when the example has qrels
  redundancy                   near-duplicate pairs among the contexts (see citation.py)
  support                      answer tokens found in the cited contexts (lexical grounding;
                               absent for a bare yes/no)
Keys absent for an example (no gold of that kind) are left out rather than set to 0.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from rag.metrics.citation import answer_support, citation_scores, redundancy_rate
from rag.metrics.qa import best_em_f1, supporting_passage_f1
from rag.metrics.retrieval import mrr_at_k, ndcg_at_k, recall_at_k
from rag.types import Answer, Example

__all__ = ["score_answer", "aggregate", "metric_counts"]


def _gold_rel(example: Example) -> dict[str, int]:
    if example.qrels:
        return {d: int(g) for d, g in example.qrels.items()}
    return {d: 1 for d in example.gold_passage_ids}


def score_answer(answer: Answer, example: Example, k: int | None = None) -> dict[str, float]:
    row: dict[str, float] = {}
    if example.answers:
        em, f1, p, r = best_em_f1(answer.text, example.answers)
        row.update({"em": em, "f1": f1, "answer_prec": p, "answer_recall": r})
    rel = _gold_rel(example)
    cited_titles = [c.title for c in answer.contexts
                    if c.id in set(answer.cited_ids)]
    if example.gold_titles:
        row.update(supporting_passage_f1(cited_titles, example.gold_titles))
    elif rel:
        row.update(supporting_passage_f1(answer.cited_ids, [d for d, g in rel.items() if g > 0]))
    if rel:
        row.update(citation_scores(answer.cited_ids, [d for d, g in rel.items() if g > 0]))
        ctx = list(answer.context_ids)
        row["recall@k"] = recall_at_k(ctx, rel, len(ctx) if k is None else k)
        cands = [h.id for h in answer.candidates]
        for n in (2, 5, 10):
            row[f"recall@{n}"] = recall_at_k(cands, rel, n)
        if example.qrels:
            row["ndcg@10"] = ndcg_at_k(cands, rel, 10)
            row["mrr@10"] = mrr_at_k(cands, rel, 10)
    row["redundancy"] = redundancy_rate([c.text for c in answer.contexts])
    cited = set(answer.cited_ids)
    texts = {c.id: f"{c.title} {c.text}" for c in answer.contexts}
    support = answer_support(answer.text, [t for i, t in texts.items() if i in cited],
                             list(texts.values()))
    if support is not None:
        row["support"] = support
    return row


def aggregate(rows: Sequence[dict[str, float]]) -> dict[str, float]:
    """Mean of every metric over the rows that have it; `metric_counts` says how many that is."""
    keys = sorted({k for r in rows for k in r})
    return {k: float(np.mean([r[k] for r in rows if k in r])) for k in keys}


def metric_counts(rows: Sequence[dict[str, float]]) -> dict[str, int]:
    """The n each `aggregate` mean was taken over: rows that have the metric (e.g. `support`
    leaves out bare yes/no answers, `em`/`f1` questions without gold answers)."""
    keys = sorted({k for r in rows for k in r})
    return {k: sum(k in r for r in rows) for k in keys}
