"""Ranking metrics agree with pytrec_eval (trec_eval) to 1e-4, ties and graded qrels included."""

import numpy as np
import pytest
import pytrec_eval

from rag.errors import ConfigError
from rag.metrics.citation import citation_scores, redundancy_rate
from rag.metrics.retrieval import per_query_scores, ranked


def _random_case(seed: int):
    rng = np.random.default_rng(seed)
    run, qrels = {}, {}
    for q in range(30):
        docs = [f"d{i}" for i in rng.choice(200, size=60, replace=False)]
        # coarse scores -> many ties, resolved by docid as trec_eval does
        run[f"q{q}"] = {d: float(rng.integers(0, 8)) for d in docs}
        rel = rng.choice(docs + [f"x{i}" for i in range(5)], size=6, replace=False)
        qrels[f"q{q}"] = {d: int(rng.integers(0, 3)) for d in rel}
        qrels[f"q{q}"][str(rel[0])] = 2  # at least one relevant
    return run, qrels


@pytest.mark.parametrize("seed", [0, 1])
def test_against_pytrec_eval(seed):
    run, qrels = _random_case(seed)
    ev = pytrec_eval.RelevanceEvaluator(qrels, {"ndcg_cut.10", "recall.10", "recall.100",
                                                "P.5"})
    ref = ev.evaluate(run)
    qids = list(qrels)
    for ours, theirs in [("ndcg@10", "ndcg_cut_10"), ("recall@10", "recall_10"),
                         ("recall@100", "recall_100"), ("precision@5", "P_5")]:
        got = per_query_scores(run, qrels, ours)
        want = [ref[q][theirs] for q in qids]
        assert np.allclose(got, want, atol=1e-4), ours


def test_ranking_tie_break_is_docid_descending():
    assert ranked({"a": 1.0, "b": 1.0, "c": 2.0}) == ["c", "b", "a"]


def test_mrr_and_unknown_metric():
    run = {"q": {"a": 3.0, "b": 2.0, "c": 1.0}}
    assert per_query_scores(run, {"q": {"b": 1}}, "mrr@10") == [0.5]
    assert per_query_scores(run, {"q": {"z": 1}}, "mrr@10") == [0.0]
    with pytest.raises(ConfigError, match="metric"):
        per_query_scores(run, {"q": {"b": 1}}, "map")


def test_citation_and_redundancy():
    assert citation_scores(["a", "b"], ["a", "c"]) == {"citation_precision": 0.5,
                                                       "citation_recall": 0.5}
    assert citation_scores([], ["a"])["citation_precision"] == 0.0
    same = "the quick brown fox jumps"
    assert redundancy_rate([same, same, "completely different words here"]) == pytest.approx(
        1 / 3)
    assert redundancy_rate(["one"]) == 0.0
