"""Answer / supporting-fact metrics pinned to the official hotpot_evaluate_v1.py definitions.
Expected values are worked out by hand in the comments."""

import pytest

from rag.metrics.qa import (
    best_em_f1,
    exact_match,
    f1_score,
    joint_scores,
    normalize_answer,
    sp_scores,
    supporting_passage_f1,
)


@pytest.mark.parametrize(("raw", "norm"), [
    ("The  Beatles!", "beatles"),           # article + punctuation + spaces
    ("An apple a day", "apple day"),        # all three articles go
    ("U.S.A.", "usa"),                      # punctuation removed, not replaced by spaces
    ("Jörgen Smit.", "jörgen smit"),        # unicode letters kept, lower-cased
    ("theatre", "theatre"),                 # 'the' only as a whole word
])
def test_normalize(raw, norm):
    assert normalize_answer(raw) == norm


@pytest.mark.parametrize(("pred", "gold", "f1", "p", "r"), [
    ("the Beatles", "Beatles", 1.0, 1.0, 1.0),
    ("Barack Obama Jr.", "Barack Obama", 0.8, 2 / 3, 1.0),    # 2 common of 3 / 2
    ("new new york", "new york", 0.8, 2 / 3, 1.0),            # counts clipped by Counter &
    ("yes", "no", 0.0, 0.0, 0.0),
    ("yes it is", "yes", 0.0, 0.0, 0.0),     # gold is special and differs -> 0, not 0.5
    ("no", "No.", 1.0, 1.0, 1.0),
    ("noanswer", "the noanswer", 1.0, 1.0, 1.0),
    ("U.S.", "USA", 0.0, 0.0, 0.0),          # 'us' vs 'usa'
    ("", "Paris", 0.0, 0.0, 0.0),
])
def test_f1_official_semantics(pred, gold, f1, p, r):
    assert f1_score(pred, gold) == pytest.approx((f1, p, r))


def test_em_and_multi_reference():
    assert exact_match("The Eiffel Tower", "eiffel tower") == 1.0
    assert exact_match("Eiffel", "eiffel tower") == 0.0
    em, f1, _, _ = best_em_f1("Paris", ["London", "paris"])
    assert (em, f1) == (1.0, 1.0)
    assert best_em_f1("x", []) == (0.0, 0.0, 0.0, 0.0)


def test_sp_and_joint_by_hand():
    # pred {(A,0),(B,1),(C,2)} vs gold {(A,0),(B,2)}: tp 1, fp 2, fn 1 -> P 1/3, R 1/2, F1 .4
    sp = sp_scores([("A", 0), ("B", 1), ("C", 2)], [("A", 0), ("B", 2)])
    assert sp == pytest.approx({"sp_em": 0.0, "sp_f1": 0.4, "sp_prec": 1 / 3,
                                "sp_recall": 0.5})
    # answer P 2/3, R 1 -> joint P 2/9, R 1/2, F1 = 2*(1/9)/(13/18) = 4/13
    j = joint_scores(0.0, 2 / 3, 1.0, sp)
    assert j["joint_f1"] == pytest.approx(4 / 13)
    assert j["joint_prec"] == pytest.approx(2 / 9) and j["joint_em"] == 0.0
    assert sp_scores([("A", 0)], [("A", 0)])["sp_em"] == 1.0
    assert sp_scores([], [("A", 0)]) == {"sp_em": 0.0, "sp_f1": 0.0, "sp_prec": 0.0,
                                         "sp_recall": 0.0}


def test_supporting_passage_f1():
    assert supporting_passage_f1(["A", "C"], ["A", "B"])["sp_f1"] == pytest.approx(0.5)
    assert supporting_passage_f1(["A", "B", "A"], ["B", "A"])["sp_em"] == 1.0
