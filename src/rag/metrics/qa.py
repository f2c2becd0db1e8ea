"""Answer and supporting-fact metrics with the official HotpotQA (`hotpot_evaluate_v1.py`)
definitions.

normalize_answer: lower-case, drop punctuation, drop the articles a/an/the, collapse whitespace.
f1: token-level F1 of normalised answers, except that when either normalised side is one of
"yes", "no", "noanswer" and the two differ, F1 = P = R = 0.
Supporting facts are (title, sentence id) pairs; joint scores multiply answer and SP precision
and recall (joint F1 from those), as the official script does.
"""

from __future__ import annotations

import re
import string
from collections import Counter
from collections.abc import Iterable, Sequence

_ARTICLES = re.compile(r"\b(a|an|the)\b")
_PUNCT = set(string.punctuation)
_SPECIAL = ("yes", "no", "noanswer")


def normalize_answer(s: str) -> str:
    s = s.lower()
    s = "".join(ch for ch in s if ch not in _PUNCT)
    s = _ARTICLES.sub(" ", s)
    return " ".join(s.split())


def f1_score(prediction: str, gold: str) -> tuple[float, float, float]:
    """(f1, precision, recall) of one prediction against one gold answer."""
    p, g = normalize_answer(prediction), normalize_answer(gold)
    zero = (0.0, 0.0, 0.0)
    if (p in _SPECIAL or g in _SPECIAL) and p != g:
        return zero
    pt, gt = p.split(), g.split()
    common = Counter(pt) & Counter(gt)
    same = sum(common.values())
    if same == 0:
        return zero
    precision, recall = same / len(pt), same / len(gt)
    return 2 * precision * recall / (precision + recall), precision, recall


def exact_match(prediction: str, gold: str) -> float:
    return float(normalize_answer(prediction) == normalize_answer(gold))


def best_em_f1(prediction: str, answers: Sequence[str]) -> tuple[float, float, float, float]:
    """(em, f1, precision, recall) against the best-matching of several gold answers."""
    if not answers:
        return 0.0, 0.0, 0.0, 0.0
    em = max(exact_match(prediction, a) for a in answers)
    f1, p, r = max((f1_score(prediction, a) for a in answers), key=lambda t: t[0])
    return em, f1, p, r


def _set_prf(pred: Iterable, gold: Iterable) -> tuple[float, float, float, float]:
    ps, gs = set(pred), set(gold)
    tp = len(ps & gs)
    fp, fn = len(ps - gs), len(gs - ps)
    p = tp / (tp + fp) if tp + fp > 0 else 0.0
    r = tp / (tp + fn) if tp + fn > 0 else 0.0
    f1 = 2 * p * r / (p + r) if p + r > 0 else 0.0
    em = 1.0 if fp + fn == 0 else 0.0
    return em, f1, p, r


def sp_scores(pred_facts: Iterable[tuple[str, int]], gold_facts: Iterable[tuple[str, int]]
              ) -> dict[str, float]:
    """Sentence-level supporting facts: sp_em, sp_f1, sp_prec, sp_recall (official update_sp)."""
    em, f1, p, r = _set_prf(((t, int(s)) for t, s in pred_facts),
                            ((t, int(s)) for t, s in gold_facts))
    return {"sp_em": em, "sp_f1": f1, "sp_prec": p, "sp_recall": r}


def joint_scores(ans_em: float, ans_p: float, ans_r: float, sp: dict[str, float]
                 ) -> dict[str, float]:
    """Joint EM/F1 as the official script: precision and recall multiply."""
    jp, jr = ans_p * sp["sp_prec"], ans_r * sp["sp_recall"]
    jf1 = 2 * jp * jr / (jp + jr) if jp + jr > 0 else 0.0
    return {"joint_em": ans_em * sp["sp_em"], "joint_f1": jf1, "joint_prec": jp,
            "joint_recall": jr}


def supporting_passage_f1(pred_titles: Iterable[str], gold_titles: Iterable[str]
                          ) -> dict[str, float]:
    """Passage-level supporting facts: titles of cited passages vs gold titles (set P/R/F1)."""
    em, f1, p, r = _set_prf(pred_titles, gold_titles)
    return {"sp_em": em, "sp_f1": f1, "sp_prec": p, "sp_recall": r}
