"""`strip_question_echo` drops a restated question, but not an answer that *is* one of the
options of a comparison question (the models helper saw "First for Women (...)" cut to "(a name"
for "Which magazine was started first, Arthur's Magazine or First for Women?")."""

from rag.generation.parse import clean_answer, strip_question_echo

COMPARISON = "Which magazine was started first, Arthur's Magazine or First for Women?"


def test_an_option_of_a_comparison_question_is_kept_whole():
    assert strip_question_echo("First for Women (a name change in 1989)", COMPARISON) == \
        "First for Women (a name change in 1989)"
    assert strip_question_echo("Arthur's Magazine, from 1844", COMPARISON) == \
        "Arthur's Magazine, from 1844"
    q = "Is Paris or London the bigger city?"
    assert strip_question_echo("London is the bigger one", q) == "London is the bigger one"


def test_a_restated_question_is_still_dropped():
    q = "Where did the band who released Blue Night have their first performance?"
    got = strip_question_echo("The band who released Blue Night had their first performance "
                              "in Tulsa", q)
    assert got == "Tulsa"  # the echo, then leading function words ("in"), are dropped


def test_clean_answer_keeps_the_option_end_to_end():
    raw = "First for Women [2] was started in 1989."
    assert clean_answer(raw, concise=True, question=COMPARISON).startswith("First for Women")
