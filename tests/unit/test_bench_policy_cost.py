"""bench/policy_cost.py's choice rule and slack selection, and bench/judge_reference.py's
judge rows, on toy inputs (no model, no evaluation)."""

from __future__ import annotations

import numpy as np
import pytest
from bench.judge_reference import stats_rows
from bench.policy_cost import cheapest_kept, oof_slack

from rag.metrics.pairwise_judge import reference_text


def test_cheapest_arm_within_the_slack_and_the_base_always_qualifies():
    P = np.array([[0.50, 0.49, 0.40],    # arm 1 within 0.02 of base 0; arm 2 not
                  [0.50, 0.60, 0.10],    # arm 1 predicted better
                  [0.50, 0.20, 0.20]])   # nothing cheaper qualifies: stay on base
    tokens = np.array([300.0, 100.0, 50.0])
    assert cheapest_kept(P, tokens, 0, 0.0).tolist() == [0, 1, 0]
    assert cheapest_kept(P, tokens, 0, 0.02).tolist() == [1, 1, 0]
    assert cheapest_kept(P, tokens, 0, 0.5).tolist() == [2, 2, 2]
    # a base arm that is not the cheapest still qualifies against itself at slack 0
    assert cheapest_kept(P, np.array([10.0, 100.0, 50.0]), 0, 0.0).tolist() == [0, 0, 0]


def test_the_slack_rule_keeps_the_out_of_fold_quality_change_non_inferior():
    """Arm 1 is cheap and as good as arm 0 when feature 0 > 0, useless otherwise: a router
    that learns that may take arm 1 there; the rule must not pick a slack that loses more
    than 0.005 out of fold."""
    rng = np.random.default_rng(0)
    n = 400
    X = rng.normal(size=(n, 3))
    Q = np.column_stack([np.full(n, 0.6), np.where(X[:, 0] > 0, 0.6, 0.0)])
    T = np.tile([500.0, 100.0], (n, 1))
    slack, change = oof_slack(X, Q, T, [f"c{i}" for i in range(n)], 0, seed=0)
    assert change[slack] >= -0.005
    assert set(change) >= {0.0, 0.1}
    assert change[0.1] <= change[0.0] + 1e-12  # a larger slack never keeps more quality here


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
