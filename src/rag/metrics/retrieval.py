"""Ranking metrics with trec_eval definitions (checked against pytrec_eval in the tests).

A run is {qid: {docid: score}}; qrels are {qid: {docid: grade}}. Ranking follows trec_eval:
score descending, ties broken by docid descending. Gains are the grades (linear, as trec_eval's
ndcg_cut); the ideal DCG uses the judged grades > 0 of that query. Queries without relevant
documents score 0 for recall and nDCG (trec_eval skips them; callers pass only judged queries).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

from rag.errors import ConfigError


def ranked(run_q: Mapping[str, float]) -> list[str]:
    return [d for d, _ in sorted(run_q.items(), key=lambda x: (-x[1], _neg(x[0])))]


class _neg(str):  # noqa: N801 - a sort key: reverses string order
    def __lt__(self, other):  # type: ignore[override]
        return str.__gt__(self, other)


def recall_at_k(ranking: Sequence[str], rel: Mapping[str, int], k: int) -> float:
    pos = {d for d, g in rel.items() if g > 0}
    return len(pos & set(ranking[:k])) / len(pos) if pos else 0.0


def precision_at_k(ranking: Sequence[str], rel: Mapping[str, int], k: int) -> float:
    pos = {d for d, g in rel.items() if g > 0}
    return len(pos & set(ranking[:k])) / k


def ndcg_at_k(ranking: Sequence[str], rel: Mapping[str, int], k: int) -> float:
    dcg = sum(rel.get(d, 0) / math.log2(i + 2) for i, d in enumerate(ranking[:k])
              if rel.get(d, 0) > 0)
    ideal = sorted((g for g in rel.values() if g > 0), reverse=True)[:k]
    idcg = sum(g / math.log2(i + 2) for i, g in enumerate(ideal))
    return dcg / idcg if idcg > 0 else 0.0


def mrr_at_k(ranking: Sequence[str], rel: Mapping[str, int], k: int) -> float:
    for i, d in enumerate(ranking[:k]):
        if rel.get(d, 0) > 0:
            return 1.0 / (i + 1)
    return 0.0


_FUNCS = {"recall": recall_at_k, "precision": precision_at_k, "ndcg": ndcg_at_k,
          "mrr": mrr_at_k}


def parse_metric(name: str):
    """'ndcg@10' -> (ndcg_at_k, 10); raises ConfigError for unknown names."""
    try:
        base, k = name.lower().split("@")
        return _FUNCS[base], int(k)
    except (ValueError, KeyError):
        raise ConfigError("metric", f"unknown metric {name!r} (recall|precision|ndcg|mrr @k)"
                          ) from None


def per_query_scores(run: Mapping[str, Mapping[str, float]],
                     qrels: Mapping[str, Mapping[str, int]], metric: str) -> list[float]:
    """One value per query in `qrels` order (a query missing from the run scores 0)."""
    fn, k = parse_metric(metric)
    return [fn(ranked(run.get(q, {})), rel, k) for q, rel in qrels.items()]
