"""Reference-free answer signals (rag.metrics.signals) with a deterministic stand-in encoder:
the parts that do not depend on embeddings (type fit, metadata, echo, lexical support) and the
combiner's JSON round trip; the generators' post-check in parse_output."""

import hashlib

import numpy as np
import pytest

from rag.generation.parse import parse_output
from rag.generation.prompts import INSUFFICIENT
from rag.metrics.signals import FEATURES, SIGNALS, AnswerSignals, Combiner, load_combiner
from rag.types import Answer, Context


class BagEncoder:
    """Unit bag-of-words vectors (hashed into 64 dims): cosine = word overlap."""

    def encode(self, texts, batch_size=2):
        out = np.zeros((len(texts), 64))
        for i, t in enumerate(texts):
            for w in t.lower().replace("?", " ").replace(".", " ").split():
                out[i, int(hashlib.md5(w.encode()).hexdigest()[:6], 16) % 64] += 1
            out[i] /= max(np.linalg.norm(out[i]), 1e-9)
        return out


CTX = (Context("d1", "2:15 pm on 21 June, 2023",
               "Gina: I designed a new logo for my store last week. Jon: The weather was "
               "cold in 2021."),
       Context("d2", "8:00 am on 3 May, 2023", "Jon: I opened a dance studio downtown."))
Q = "What did Gina design for her store?"


def _ans(text, q=Q, ctx=CTX, cites=()):
    return Answer("q", q, text, cites, ctx, (), {}, 0, 0, "h")


@pytest.fixture(scope="module")
def sig():
    return AnswerSignals(BagEncoder(), combiner=None)


def test_right_answer_beats_every_wrong_one(sig):
    right = sig.score(_ans("a new logo"))
    wrong = {k: sig.score(_ans(t)) for k, t in [
        ("metadata", "2:15 pm on 21 June, 2023"), ("off_type", "2021"),
        ("echo", "Gina design for her store"), ("distractor", "a dance studio downtown")]}
    assert set(right) == set(SIGNALS)
    assert right["sig_faithfulness"] > 0.5 and right["sig_relevancy"] > 0
    for kind in ("metadata", "off_type", "echo"):
        assert wrong[kind]["sig_relevancy"] == 0.0, kind
    assert wrong["metadata"]["sig_faithfulness"] == 0.0  # a title is not content
    assert wrong["distractor"]["sig_faithfulness"] < right["sig_faithfulness"]
    for kind, w in wrong.items():
        assert w["sig_combined"] < right["sig_combined"], kind


def test_abstention_scores_zero(sig):
    assert sig.score(_ans(INSUFFICIENT)) == dict.fromkeys(SIGNALS, 0.0)
    assert sig.score(_ans("")) == dict.fromkeys(SIGNALS, 0.0)


def test_yes_no_and_either_or_answers_pass_the_rules(sig):
    from rag.metrics.signals import passes_rules

    ctx = (Context("m1", "Salmita Mine", "The Salmita Mine opened in 1983 in Canada."),
           Context("m2", "Kanichee Mine", "The Kanichee Mine opened in 1937 in Ontario."))
    q = "Which mine was in service first, the Salmita Mine or the Kanichee Mine?"
    one, both, neither = sig.features([_ans("the Kanichee Mine", q, ctx),
                                       _ans("Salmita Mine and Kanichee Mine", q, ctx),
                                       _ans("Ontario", q, ctx)])
    assert passes_rules(one) and one[FEATURES.index("off_option")] == 0.0  # "Mine" is shared
    assert not passes_rules(both)  # naming both options answers nothing
    assert neither[FEATURES.index("off_option")] == 1.0
    yes = sig.features([_ans("yes", "Did Gina design a new logo?")])[0]
    assert passes_rules(yes) and yes[FEATURES.index("echo")] == 0.0


def test_features_shape_and_date_question(sig):
    f = sig.features([_ans("21 June, 2023", q="When did Gina design a new logo?")])[0]
    assert f.shape == (len(FEATURES),)
    assert f[FEATURES.index("type_fit")] == 1.0 and f[FEATURES.index("metadata")] == 0.0


def test_combiner_round_trip(tmp_path):
    rng = np.random.default_rng(0)
    c = Combiner(rng.normal(size=len(FEATURES)), 0.3, rng.normal(size=len(FEATURES)),
                 np.ones(len(FEATURES)), FEATURES, {"n": 3})
    c.to_json(tmp_path / "c.json")
    back = load_combiner(tmp_path / "c.json")
    x = rng.normal(size=(4, len(FEATURES)))
    assert np.allclose(back.predict(x), c.predict(x), atol=1e-5)
    assert ((back.predict(x) > 0) & (back.predict(x) < 1)).all()
    with pytest.raises(ValueError, match="features"):
        Combiner([1.0], 0.0, [0.0], [1.0], ("x",))


def test_bundled_combiner_is_shipped():
    c = load_combiner()
    assert c is not None and c.meta["n"] > 100
    assert c.features == FEATURES


def test_generator_post_check_refuses_metadata_answers():
    ctx = [Context("a", "2:15 pm on 21 June, 2023", "Gina: I designed a new logo.")]
    assert parse_output("2:15 pm on 21 June, 2023 [1]", 1, True, Q, ctx) == (INSUFFICIENT, ())
    assert parse_output("a new logo [1]", 1, True, Q, ctx)[1] == (1,)
    assert parse_output("2:15 pm on 21 June, 2023 [1]", 1, True, Q)[0] != INSUFFICIENT
