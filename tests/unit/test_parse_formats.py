"""Answer formats a stronger generator (Qwen2.5-Coder-1.5B, zero-shot, `cite_concise`) emits
on HotpotQA that the parser used to keep in the answer text: citations in parentheses
("Audioslave (2, 3)", "1900 (1)") and the prompt's answer-type hint repeated after the answer
("Kashmir (a name, number, date, or yes/no) [1, 3]", cut to "Kashmir (a name")."""

from __future__ import annotations

import pytest

from rag.generation.parse import bracket_paren_citations, clean_answer, parse_output

Q = "Which city was the singer born in?"


@pytest.mark.parametrize(("raw", "n", "answer", "cites"), [
    ("Audioslave (2, 3)", 5, "Audioslave", (2, 3)),
    ("1900 (1)", 5, "1900", (1,)),
    ("Paris (1)(3)", 3, "Paris", (1, 3)),
    ("Kashmir (a name, number, date, or yes/no) [1, 3]", 5, "Kashmir", (1, 3)),
    ("Greater Boston (a name, number, date, or yes/no) [3]", 5, "Greater Boston", (3,)),
    ("Kolkata (a few words: a name, number, date", 5, "Kolkata", ()),   # cut by max tokens
    ("yes (yes/no) [2]", 5, "yes", (2,)),
])
def test_parenthesised_citations_and_echoed_type_hints_leave_the_answer(raw, n, answer, cites):
    assert parse_output(raw, n, True, Q) == (answer, cites)


def test_parenthesised_numbers_that_are_not_passage_indices_stay():
    assert bracket_paren_citations("Arthur (1925) [2]", 5) == "Arthur (1925) [2]"
    assert bracket_paren_citations("Season (2, 9)", 5) == "Season (2, 9)"
    assert parse_output("Louis XIV (1643) [1]", 5, True, Q) == ("Louis XIV (1643)", (1,))


def test_an_ordinary_parenthetical_is_kept():
    assert clean_answer("First for Women (a name change in 1989)", True) == \
        "First for Women (a name change in 1989)"
    assert parse_output("The Beatles (band) [1]", 3) == ("The Beatles (band)", (1,))
