"""The generated world where configuration choices matter (`rag.corpus.synthetic_choices`):
deterministic, every family present, gold that matches how the world was built."""

import pytest

from rag.corpus.loaders import load_dataset
from rag.corpus.synthetic_choices import FAMILIES, NAME, UNANSWERABLE, make_choice_world


def test_same_seed_same_world_and_another_seed_another():
    a, b, c = make_choice_world(0, 6), make_choice_world(0, 6), make_choice_world(1, 6)
    assert [p.text for p in a.corpus] == [p.text for p in b.corpus]
    assert a.examples == b.examples
    assert [e.question for e in a.examples] != [e.question for e in c.examples]


def test_every_family_has_its_share_and_gold_passages_exist():
    w = make_choice_world(0, 8)
    ids = {p.id for p in w.corpus}
    assert [e.category for e in w.examples[:6]] == list(FAMILIES)
    for f in FAMILIES:
        assert sum(e.category == f for e in w.examples) == 8
    for e in w.examples:
        assert set(e.gold_passage_ids) <= ids
        if e.category == "unanswerable":
            assert e.metadata["answerability"] == UNANSWERABLE and not e.gold_passage_ids
        else:
            assert e.gold_passage_ids and e.answers[0]


def test_paraphrase_questions_share_no_content_word_with_their_passage():
    w = make_choice_world(0, 10)
    text = {p.id: set(p.text.lower().replace(".", "").split()) for p in w.corpus}
    stop = {"the", "a", "in", "which", "that", "on", "among", "is"}
    for e in w.examples:
        if e.category == "paraphrase":
            q = set(e.question.lower().rstrip("?").split()) - stop
            assert not q & text[e.gold_passage_ids[0]], e.question


def test_lexical_codes_have_siblings_that_differ_only_in_digit_order():
    w = make_choice_world(0, 20)
    codes = [p.title for p in w.corpus if p.metadata["kind"] == "instrument"]
    shapes = {(c[:2], "".join(sorted(c[3:]))) for c in codes}
    assert len(shapes) < len(codes)  # some codes share prefix and digits
    asked = [e.question.split()[-2] for e in w.examples if e.category == "unanswerable"]
    assert not set(asked) & set(codes)


def test_the_world_is_a_builtin_dataset_by_name():
    ds = load_dataset(NAME)
    assert ds.builtin and len(ds.examples) == 6 * 50
    with pytest.raises(ValueError, match="per_family"):
        make_choice_world(0, 0)
