"""bench/judge_reference.py's judge rows and bench/judge_rm.py's agreement counts, on toy
inputs (no model, no evaluation)."""

from __future__ import annotations

import numpy as np
import pytest
from bench.judge_reference import stats_rows

from rag.metrics.pairwise_judge import reference_text


def test_judge_rows_count_ties_as_misses_and_skip_equal_f1_pairs():
    pairs = [{"f1_a": 1.0, "f1_b": 0.0}, {"f1_a": 0.0, "f1_b": 1.0}, {"f1_a": 0.5, "f1_b": 0.5},
             {"f1_a": 1.0, "f1_b": 0.0}]
    verdicts = [{"forward": "A", "backward": "A", "winner": "A", "margin": 1.0},
                {"forward": "A", "backward": "B", "winner": "tie", "margin": -0.2},
                {"forward": "A", "backward": "A", "winner": "A", "margin": 0.5},
                {"forward": "B", "backward": "A", "winner": "tie", "margin": 0.1}]
    rows = {(r["system"], r["metric"]): r for r in stats_rows("toy", "j", verdicts, pairs)}
    assert rows[("j", "position_bias")]["value"] == pytest.approx(0.5)
    assert rows[("j", "tie_rate")]["value"] == pytest.approx(0.5)
    agree = rows[("j", "agreement_with_f1_preference")]
    assert agree["n"] == 3 and agree["value"] == pytest.approx(1 / 3)
    assert rows[("j", "agreement_decisive")]["value"] == pytest.approx(1.0)
    # the order-averaged margin decides the two ties: pair 2 (B better, margin < 0) agrees,
    # pair 4 (A better, margin > 0) agrees
    assert rows[("j:logodds", "agreement_with_f1_preference")]["value"] == pytest.approx(1.0)
    assert reference_text([" Paris ", "", "Paris, France"]) == "Paris / Paris, France"


def test_judge_rm_agreement_counts_score_ties_half_and_skips_undecided_pairs():
    """bench/judge_rm.py: a pair the teacher tied is not in the teacher agreement, a pair whose
    F1 is equal is not in the F1 agreement, and a model score tie counts 0.5."""
    from bench.judge_rm import agreements, held_out

    class RM:
        def score_features(self, x):
            return np.asarray(x)[:, 0]

    pairs = [{"teacher": "A", "f1_a": 1.0, "f1_b": 0.0},   # model right on both
             {"teacher": "B", "f1_a": 0.5, "f1_b": 0.5},   # model wrong; F1 equal: skipped
             {"teacher": "tie", "f1_a": 0.0, "f1_b": 1.0},  # model wrong on F1; no teacher
             {"teacher": "A", "f1_a": 0.0, "f1_b": 1.0}]   # score tie: half on both
    fa, fb = np.array([[2.0], [1.0], [1.0], [0.0]]), np.array([[1.0], [0.0], [0.0], [0.0]])
    got = agreements(RM(), fa, fb, pairs)
    assert got == {"teacher": [1.0, 0.0, 0.5], "f1": [1.0, 0.0, 0.5]}
    ids = [f"q{i}" for i in range(1000)]
    assert 150 < sum(map(held_out, ids)) < 250 and held_out("q7") == held_out("q7")


def test_the_judge_distilled_reward_model_is_committed_and_loads_by_name():
    from rag.metrics.reward_model import load_reward_model

    rm = load_reward_model("judge-rm")
    assert rm.manifest["teacher"].startswith("judge:qwen+reference:pointwise")
    assert rm.manifest["training_data"]["pairs"] > 2000
