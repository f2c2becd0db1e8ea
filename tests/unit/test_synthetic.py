"""The generated world is deterministic and its gold is consistent."""

from rag.corpus.synthetic import make_synthetic_world
from rag.metrics.qa import normalize_answer


def test_deterministic_and_seed_sensitive():
    a, b = make_synthetic_world(seed=0), make_synthetic_world(seed=0)
    assert a.corpus.fingerprint() == b.corpus.fingerprint()
    assert [e.to_dict() for e in a.examples] == [e.to_dict() for e in b.examples]
    assert make_synthetic_world(seed=1).corpus.fingerprint() != a.corpus.fingerprint()


def test_gold_answers_are_in_supporting_sentences(world):
    cats = {e.category for e in world.examples}
    assert cats == {"single", "bridge", "comparison"}
    for e in world.examples:
        assert len(e.gold_passage_ids) == (1 if e.category == "single" else 2)
        for title, sid in e.supporting_facts:
            p = next(p for p in world.corpus if p.title == title)
            assert 0 <= sid < len(p.metadata["sentences"])
        ans = normalize_answer(e.answers[0])
        if ans in ("yes", "no"):
            continue
        text = " ".join(normalize_answer(world.corpus[p].text) for p in e.gold_passage_ids)
        sents = " ".join(normalize_answer(next(p for p in world.corpus if p.title == t)
                                          .metadata["sentences"][s])
                         for t, s in e.supporting_facts)
        assert ans in text and (ans in sents or e.category == "comparison"), e.question
    titles = [p.title for p in world.corpus]
    assert len(set(titles)) == len(titles)  # names are unambiguous
