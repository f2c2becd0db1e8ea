"""Abstention scored by answerability, and the one missing-value rule (issue 18): an answer that
abstains gets F = R = 0 on an answerable question and full credit on one the gold marks
unanswerable; answering an unanswerable question costs R; a missing metric is left out of a
batch mean and of a query's quality alike. No dataset, no Ray."""

import numpy as np
import pytest

from rag.generation.prompts import INSUFFICIENT
from rag.metrics.claims import is_noncommittal
from rag.types import Example
from rl.kernel.evaluator import ABSTAINED, UNANSWERABLE, TunerEvaluator, gold_unanswerable
from rl.kernel.reward import RewardSpec, score_abstentions
from rl.kernel.settings import DatasetSlice, RewardWeights, Thresholds

SPEC = RewardSpec(RewardWeights(), Thresholds(), cost_ref=1000.0, instability_band=0.05)


def test_score_abstentions_table():
    F = np.array([0.9, 1.0, 0.7, 0.6, np.nan])
    R = np.array([0.8, np.nan, 0.5, np.nan, 0.4])
    abstained = np.array([0, 1, 1, 0, 0])
    unanswerable = np.array([0, 0, 1, 1, 0])
    f, r = score_abstentions(F, R, abstained, unanswerable)
    # answered/answerable as measured; abstained/answerable 0; abstained/unanswerable 1;
    # answered/unanswerable: F as measured, R 0; a missing value stays missing
    assert list(f[:4]) == [0.9, 0.0, 1.0, 0.6] and np.isnan(f[4])
    assert list(r) == [0.8, 0.0, 1.0, 0.0, 0.4]
    # scalars give floats
    assert score_abstentions(0.5, 0.5, 1, 0) == (0.0, 0.0)


def test_abstaining_no_longer_pays_where_r_ignores_the_answer():
    """MTRAG-like: R = recall@k reads only the retrieval and support scores an abstention 1.0;
    with the rule, always abstaining loses to answering on answerable questions."""
    n = 20
    recall = np.full(n, 0.9)
    support_abstain, support_answer = np.ones(n), np.full(n, 0.8)
    lat, tok = np.full(n, 100.0), np.full(n, 300.0)
    zeros, ones = np.zeros(n), np.ones(n)
    before = SPEC.reward(SPEC.batch(support_abstain, recall, lat, tok))[0]
    answer = SPEC.reward(SPEC.batch(support_answer, recall, lat, tok))[0]
    assert before > answer  # the loophole
    fa, ra = score_abstentions(support_abstain, recall, ones, zeros)
    after = SPEC.reward(SPEC.batch(fa, ra, lat, tok))[0]
    assert after < answer
    # on questions the gold marks unanswerable, abstaining is the right answer
    fu, ru = score_abstentions(support_abstain, np.full(n, np.nan), ones, ones)
    fv, rv = score_abstentions(support_answer, np.full(n, np.nan), zeros, ones)
    assert SPEC.per_query(fu, ru, lat, tok).mean() > SPEC.per_query(fv, rv, lat, tok).mean()


def test_gold_unanswerable_reads_the_answerability_label():
    def ex(label):
        return Example(id="q", question="?", metadata={"answerability": label})

    assert gold_unanswerable(ex("UNANSWERABLE")) and gold_unanswerable(ex("unanswerable"))
    for label in ("ANSWERABLE", "PARTIAL", "UNDERSPECIFIED", None):
        assert not gold_unanswerable(ex(label))
    assert not gold_unanswerable(Example(id="q", question="?", answers=("x",)))


def test_the_extractive_abstention_is_noncommittal():
    assert is_noncommittal(INSUFFICIENT) and is_noncommittal(f"{INSUFFICIENT} [1]")
    assert not is_noncommittal("Paris [1]")


class _Stub:
    """What `TunerEvaluator.quality` reads: the slice and the dataset name."""

    class data:  # noqa: N801
        name = "stub"

    slice = DatasetSlice(faithfulness="support", relevancy="recall@k")


def test_evaluator_quality_applies_the_rule_and_tolerates_old_tables():
    tab = {"support": np.array([1.0, 1.0, 0.7]), "recall@k": np.array([1.0, np.nan, 0.5]),
           ABSTAINED: np.array([1.0, 1.0, 0.0]), UNANSWERABLE: np.array([0.0, 1.0, 0.0])}
    F, R = TunerEvaluator.quality(_Stub(), tab)
    assert list(F) == [0.0, 1.0, 0.7] and list(R) == [0.0, 1.0, 0.5]
    # a table without the columns (stand-ins, replays): F and R as stored
    bare = {k: v for k, v in tab.items() if k not in (ABSTAINED, UNANSWERABLE)}
    F, R = TunerEvaluator.quality(_Stub(), bare)
    assert list(F) == [1.0, 1.0, 0.7] and R[0] == 1.0 and np.isnan(R[1])


def test_one_missing_value_rule_batch_and_per_query():
    """A missing metric is left out in both reductions: a query without R is judged on F
    alone (at the α+β scale), exactly as the batch mean leaves it out of R's mean."""
    F = np.array([0.8, 0.6])
    R = np.array([np.nan, 0.4])
    lat, tok = np.full(2, 100.0), np.full(2, 300.0)
    q = SPEC.quality(F, R)
    assert list(q) == pytest.approx([0.8, 0.5])
    # a yes/no answer (support NaN) is not punished per query as if ungrounded
    assert SPEC.quality(np.nan, 0.6) == pytest.approx(0.6)
    assert SPEC.quality(np.nan, np.nan) == 0.0
    m = SPEC.batch(F, R, lat, tok)
    assert m.faithfulness == pytest.approx(0.7) and m.relevancy == pytest.approx(0.4)
    # unequal weights: the present metric carries both weights
    skew = RewardSpec(RewardWeights(alpha=0.8, beta=0.2))
    assert skew.quality(0.5, np.nan) == pytest.approx(0.5)
    assert skew.quality(0.5, 1.0) == pytest.approx(0.6)
    # scalar and vector agree bit for bit
    assert [SPEC.per_query(F[i], R[i], lat[i], tok[i]) for i in range(2)] == \
        list(SPEC.per_query(F, R, lat, tok))
