"""A BEIR folder whose passages' titles are session timestamps (a long-conversation benchmark
exported to BEIR): the pipeline's extractive answers to what-questions are not timestamps, and
the reference-free signals (real MiniLM, the bundled combiner) score a timestamp answer to a
what-question below the gate."""

import json
import random

import pytest

from rag.config import RAGConfig
from rag.corpus.loaders import load_beir
from rag.generation.answer_check import answer_type
from rag.indexset import IndexSet
from rag.metrics.signals import GATE, AnswerSignals
from rag.pipeline import Pipeline
from rag.types import Answer

PEOPLE = ["Gina", "Jon", "Maria", "Tomas", "Anika", "Rajesh", "Lena", "Omar"]
DEEDS = [("designed", "design", "a new logo"), ("bought", "buy", "a red bicycle"),
         ("painted", "paint", "a mural of the harbour"), ("cooked", "cook", "a lentil soup"),
         ("planted", "plant", "tomato seedlings"), ("wrote", "write", "a short poem"),
         ("built", "build", "a wooden shelf"), ("adopted", "adopt", "a grey kitten")]
MONTHS = ["January", "March", "May", "June", "August", "October"]


def _session_beir(root):
    """48 dialogue turns titled by their session's timestamp; 40 what-questions, each with its
    turn as the one relevant passage."""
    rng = random.Random(3)
    root.mkdir()
    (root / "qrels").mkdir()
    docs, queries, qrels = [], [], ["query-id\tcorpus-id\tscore"]
    for i in range(48):
        p, (past, verb, obj) = PEOPLE[i % 8], DEEDS[(i // 8 + i) % 8]
        other = PEOPLE[(i + 3) % 8]
        stamp = (f"{rng.randint(1, 12)}:{rng.choice(['00', '15', '30', '45'])} "
                 f"{rng.choice(['am', 'pm'])} on {rng.randint(1, 28)} {rng.choice(MONTHS)}, "
                 f"{rng.randint(2022, 2023)}")
        docs.append({"_id": f"t{i}", "title": stamp,
                     "text": f"{p}: Guess what, I {past} {obj} for my store yesterday. "
                             f"{other}: That sounds lovely, tell me more!"})
        if i < 40:
            queries.append({"_id": f"q{i}", "text": f"What did {p} {verb} for the store?"})
            qrels.append(f"q{i}\tt{i}\t1")
    (root / "corpus.jsonl").write_text("".join(json.dumps(d) + "\n" for d in docs))
    (root / "queries.jsonl").write_text("".join(json.dumps(q) + "\n" for q in queries))
    (root / "qrels" / "test.tsv").write_text("\n".join(qrels) + "\n")
    return root


@pytest.fixture(scope="module")
def answers(tmp_path_factory):
    root = tmp_path_factory.mktemp("beir")
    ds = load_beir(_session_beir(root / "sessions"))
    idx = IndexSet.create(ds.corpus, root / "index", show_progress=False)
    pipe = Pipeline(idx, RAGConfig(variant="bm25", k=3))
    return [pipe.run(e.question, e.id) for e in ds.examples]


def test_reader_answers_are_not_timestamps(answers):
    assert len(answers) == 40
    stamps = [a.text for a in answers if answer_type(a.text) in ("time", "date")]
    assert len(stamps) / len(answers) < 0.05, stamps
    # and they come from the turns' text: the object of the question's verb where the verb is
    # regular (designed, painted, ...), never the title
    assert not any(a.text in {c.title for c in a.contexts} for a in answers)
    assert sum(any(o.split()[-1] in a.text for _, _, o in DEEDS) for a in answers) >= 20


def test_signals_score_a_timestamp_answer_below_the_gate(answers):
    sig = AnswerSignals()
    assert sig.combiner is not None  # the bundled combination
    stamped = [Answer(a.query_id, a.question, a.contexts[0].title, (1,), a.contexts, (), {},
                      0, 0, "stamp") for a in answers]
    bad = sig.score_batch(stamped)
    good = sig.score_batch(answers)
    assert all(s["sig_combined"] < GATE for s in bad), [s["sig_combined"] for s in bad]
    assert all(s["sig_relevancy"] == 0.0 for s in bad)
    mean_good = sum(s["sig_combined"] for s in good) / len(good)
    assert mean_good > GATE > max(s["sig_combined"] for s in bad)
