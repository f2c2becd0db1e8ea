"""Citation quality and context redundancy."""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from itertools import combinations

_WORD = re.compile(r"[^\W_]+", re.UNICODE)
REDUNDANT_JACCARD = 0.5


def citation_scores(cited_ids: Iterable[str], gold_ids: Iterable[str]) -> dict[str, float]:
    """citation_precision: cited passages that are gold; citation_recall: gold that are cited.
    No citations -> precision 0 (an uncited answer cannot be verified)."""
    cited, gold = set(cited_ids), set(gold_ids)
    tp = len(cited & gold)
    return {"citation_precision": tp / len(cited) if cited else 0.0,
            "citation_recall": tp / len(gold) if gold else 0.0}


def _tokens(text: str) -> set[str]:
    return {w.lower() for w in _WORD.findall(text)}


def redundancy_rate(texts: Sequence[str], threshold: float = REDUNDANT_JACCARD) -> float:
    """Fraction of context pairs whose word-set Jaccard similarity is >= `threshold` (0.5):
    0 = no two passages repeat each other; 1 = every pair is a near-duplicate.
    Fewer than two contexts -> 0."""
    toks = [_tokens(t) for t in texts]
    pairs = list(combinations(range(len(toks)), 2))
    if not pairs:
        return 0.0
    def jac(a: set, b: set) -> float:
        return len(a & b) / len(a | b) if a | b else 1.0
    return sum(jac(toks[i], toks[j]) >= threshold for i, j in pairs) / len(pairs)


def answer_support(answer: str, cited_texts: Sequence[str], all_texts: Sequence[str]
                   ) -> float | None:
    """Lexical grounding in [0, 1]: the share of the answer's (normalised) tokens that occur in
    the passages it cites (in all its contexts when it cites none). An abstention ("insufficient
    context") makes no claim and scores 1; a bare yes/no is a judgement, not a span, and gets
    None (not measurable lexically). A cheap stand-in for faithfulness that needs no model.
    """
    from rag.generation.prompts import INSUFFICIENT
    from rag.metrics.qa import normalize_answer

    toks = normalize_answer(answer).split()
    if not toks or normalize_answer(INSUFFICIENT) == " ".join(toks):
        return 1.0
    if toks in (["yes"], ["no"]):
        return None
    pool: set[str] = set()
    for t in (cited_texts or all_texts):
        pool.update(normalize_answer(t).split())
    return sum(t in pool for t in toks) / len(toks)
