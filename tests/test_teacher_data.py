"""Teacher data (rl.adaptation.teacher) and the distillation SFT sets (sft_data): SmolLM2 on
the llama.cpp runtime stands in for the Qwen teacher on 3 HotpotQA train questions. The store
answers a re-run from cache (no generation), and the filter keeps only cited answers with
enough F1 and citation precision."""

from __future__ import annotations

import pytest
from tests.conftest import require_dataset

from rag import llama_runtime
from rag.errors import ConfigError, DataError
from rl.adaptation.sft_data import (
    SFTExample,
    cut_at_sentence,
    distillation_sets,
    format_target,
    mtrag_sft_examples,
    mtrag_split,
)
from rl.adaptation.teacher import (
    MODES,
    ModeSpec,
    TeacherRecord,
    TeacherStore,
    filtered_examples,
    keep_record,
    stored_teacher_examples,
    teacher_answers,
    teacher_examples,
)


def _rec(qid="q", text="Paris", cites=(1,), f1=1.0, prec=1.0) -> TeacherRecord:
    return TeacherRecord("k" + qid, qid, "gold", "t", f"{text} [1]", text, tuple(cites), f1,
                         prec, 1.0)


def test_filter_rules():
    assert keep_record(_rec())
    assert not keep_record(_rec(cites=()))                   # cites nothing
    assert not keep_record(_rec(f1=0.4))                     # wrong answer
    assert not keep_record(_rec(prec=0.5))                   # cites a non-gold passage
    assert keep_record(_rec(prec=0.5), min_cite_precision=0.5)
    assert not keep_record(_rec(text=" "))


def test_distillation_sets_from_kept_answers():
    gold = [SFTExample(q, f"{q}?", (), format_target("gold", (1,)), answers=("gold",),
                       gold_positions=(1,)) for q in ("a", "b")]
    teach = filtered_examples(gold, [_rec("a", "gold"), _rec("b", "x", f1=0.0)])
    assert [e.id for e in teach] == ["a"] and teach[0].source == "teacher"
    assert teach[0].target == "gold [1]"
    sets = distillation_sets(gold, teach)
    assert [e.id for e in sets["teacher"]] == ["a"]
    assert [(e.id, e.source) for e in sets["teacher+gold"]] == [
        ("a", "hotpotqa"), ("b", "hotpotqa"), ("a", "teacher")]


def test_stored_answers_are_read_back_and_checked_against_this_machines_contexts(tmp_path):
    """Answers written elsewhere (the lead's GPU run) are read by mode/model, no generator
    needed; one whose stored scores disagree with this machine's example (the gold paragraph
    landed elsewhere) is refused, a duplicate question counted."""
    exs = [SFTExample(q, f"{q}?", (), format_target("Paris", (1,)), answers=("Paris",),
                      gold_positions=(1,)) for q in ("a", "b", "c")]
    store = TeacherStore(tmp_path / "t.sqlite")
    store.put(_rec("a"))                                     # right answer, cites gold [1]
    store.put(_rec("b", prec=0.0))                           # stored: [1] was not gold there
    store.put(TeacherRecord("kz", "a", "gold", "t", "Paris [1]", "Paris", (1,), 1.0, 1.0, 1.0))
    store.put(TeacherRecord("kh", "c", "hybrid", "t", "Paris [1]", "Paris", (1,), 1.0, 1.0,
                            1.0))                            # another mode: not read
    store.put(TeacherRecord("ko", "c", "gold", "other", "x", "x", (1,), 0.0, 1.0, 1.0))
    assert {r.key for r in store.records(mode="gold", model="t")} == {"ka", "kb", "kz"}
    assert len(store.records()) == 5
    kept, counts = stored_teacher_examples(exs, store, "gold", model="t")
    assert [(e.id, e.source, e.target) for e in kept] == [("a", "teacher", "Paris [1]")]
    assert counts == {"records": 3, "unknown_question": 0, "other_prompt": 0, "mismatched": 1,
                      "duplicate": 1, "used": 1, "kept": 1}


def test_stored_answers_of_another_prompt_are_not_used(tmp_path):
    """A store holding a mode's answers under an earlier prompt or token budget (MTRAG's
    quick run used `cite_verbose`, 64 tokens) uses only the mode's; records written before the
    fields existed (None) count as the mode's."""
    exs = [SFTExample(q, f"{q}?", (), format_target("Paris", (1,)), answers=("Paris",),
                      gold_positions=(1,)) for q in ("a", "b", "c")]
    store = TeacherStore(tmp_path / "t.sqlite")
    rec = lambda key, qid, *how: TeacherRecord(key, qid, "mtrag-gold", "t", "Paris [1]",  # noqa: E731
                                               "Paris", (1,), 1.0, 1.0, 1.0, *how)
    store.put(rec("k1", "a", "cite_verbose", 64))          # sorts first, another prompt
    store.put(rec("k2", "a", "cite_long", 96))
    store.put(rec("k3", "b", "cite_long", 64))             # another budget
    store.put(rec("k4", "c"))                              # written before the fields existed
    kept, counts = stored_teacher_examples(exs, store, "mtrag-gold", model="t")
    assert [e.id for e in kept] == ["a", "c"]
    assert counts["other_prompt"] == 2 and counts["duplicate"] == 0
    assert store.get("k2").prompt_id == "cite_long" and store.get("k4").prompt_id is None


@pytest.mark.slow
@pytest.mark.skipif(not llama_runtime.available(), reason="llama-cpp-python not installed")
def test_smollm2_teacher_caches_and_filters(tmp_path):
    require_dataset("hotpotqa/hotpot_dev_distractor_1100.jsonl")
    from rag.generation.factory import make_generator

    exs = teacher_examples("gold", 3)
    assert len(exs) == 3
    gen = make_generator("smollm2-135m-instruct-llama", cache=False)
    calls = []
    real = gen.generate
    gen.generate = lambda *a, **k: calls.append(a[0]) or real(*a, **k)
    store = TeacherStore(tmp_path / "teacher.sqlite")
    first = teacher_answers(gen, exs, "gold", max_new_tokens=16, store=store)
    assert len(first) == 3 and len(calls) == 3 and len(store) == 3
    assert all(r.seconds > 0 and 0 <= r.f1 <= 1 and 0 <= r.cite_precision <= 1 for r in first)
    assert {(r.prompt_id, r.max_new_tokens) for r in first} == {("cite_concise", 16)}
    again = teacher_answers(gen, exs, "gold", max_new_tokens=16,
                            store=TeacherStore(tmp_path / "teacher.sqlite"))
    assert len(calls) == 3                                   # all three from the store
    assert [r.to_dict() for r in again] == [r.to_dict() for r in first]
    # a different generation budget is a different key: answered anew, stored beside
    teacher_answers(gen, exs[:1], "gold", max_new_tokens=8, store=store)
    assert len(calls) == 4 and len(store) == 4
    kept = filtered_examples(exs, first, min_f1=0.0, min_cite_precision=0.0)
    assert len(kept) == sum(bool(r.citations and r.text.strip()) for r in first)
    assert filtered_examples(exs, first, min_f1=1.01) == []


def test_keep_threshold_is_the_records_modes():
    """MTRAG's long-form references bound a one-sentence answer's F1: its mode keeps F1 >= 0.3,
    HotpotQA's 0.5; an explicit min_f1 still wins."""
    mt = TeacherRecord("km", "m", "mtrag-gold", "t", "x [1]", "x", (1,), 0.35, 1.0, 1.0)
    assert keep_record(mt) and not keep_record(_rec(f1=0.35))
    assert not keep_record(mt, min_f1=0.5)
    assert MODES["mtrag-gold"].prompt_id == "cite_long"
    assert MODES["gold"] == MODES["hybrid"] == ModeSpec("cite_concise", 32, 0.5)
    with pytest.raises(ValueError, match="mode must be one of"):
        teacher_examples("mtrag-hybrid", 3)


def _mtrag_file(path, tasks):
    import json

    lines = []
    for tid, label, ctx, answer, coll in tasks:
        lines.append(json.dumps({
            "task_id": tid, "conversation_id": tid.split("<::>")[0], "turn": tid[-1],
            "Collection": coll, "answerability": [label], "Question Type": ["Factoid"],
            "input": [{"speaker": "user", "text": "earlier?"},
                      {"speaker": "agent", "text": "earlier answer"},
                      {"speaker": "user", "text": f"question of {tid}?"}],
            "contexts": [{"document_id": d, "text": t, "title": d} for d, t in ctx],
            "targets": [{"text": answer}] if answer else []}))
    path.write_text("\n".join(lines) + "\n")
    return path


def test_mtrag_examples_hold_gold_and_a_distractor_of_another_conversation(tmp_path):
    long = "First sentence here. " + "Second sentence is much longer than the first. " * 3
    f = _mtrag_file(tmp_path / "r.jsonl", [
        ("c1<::>2", "ANSWERABLE", [("d1", long), ("d2", "Two."), ("d3", "Three.")], "A1", "x"),
        ("c1<::>3", "PARTIAL", [("d4", "Four.")], "A2", "x"),
        ("c2<::>1", "UNANSWERABLE", [], "I do not know", "x"),
        ("c3<::>1", "ANSWERABLE", [("d5", "Five.")], "A3", "x"),
        ("c4<::>1", "UNDERSPECIFIED", [("d6", "Six.")], "Which one?", "y"),
    ])
    exs = mtrag_sft_examples(f, ["c1<::>2", "c1<::>3", "c2<::>1", "c3<::>1", "c4<::>1"],
                             max_gold=2, max_context_chars=40, seed=0)
    assert [e.id for e in exs] == ["c1<::>2", "c1<::>3", "c3<::>1"]   # answer-holding only
    e = exs[0]
    assert e.question == "question of c1<::>2?" and e.source == "mtrag"
    ids = [c.id for c in e.contexts]
    gold = [ids[p - 1] for p in e.gold_positions]
    assert sorted(gold) == ["d1", "d2"]                      # max_gold=2: d3 left out
    (other,) = set(ids) - set(gold)
    assert other == "d5"            # collection x, not conversation c1's own d3/d4
    assert e.target == format_target("A1", e.gold_positions)
    d1 = next(c for c in e.contexts if c.id == "d1")
    assert d1.text == "First sentence here."                 # cut at a sentence end
    with pytest.raises(DataError, match="not in the file"):
        mtrag_sft_examples(f, ["c9<::>1"])
    with pytest.raises(ConfigError, match="not in the train split"):
        mtrag_sft_examples(f, ["c1<::>2"], split_ids={"train": ["c3<::>1"]})


def test_cut_at_sentence():
    assert cut_at_sentence("One. Two. Three.", 9) == "One. Two."
    assert cut_at_sentence("  One.\n Two. ", 100) == "One. Two."
    assert cut_at_sentence("Averyveryverylongfirstsentence. Two.", 10) == "Averyveryv"


def test_mtrag_split_reads_train_tasks_only():
    require_dataset("mtrag/mtragun-human/generation_tasks/reference.jsonl")
    from rag.corpus.hygiene import load_split

    exs = mtrag_split()
    train = set(load_split("mtrag").ids("train"))
    assert exs and {e.id for e in exs} <= train
    assert all(e.meta["answerability"] in ("answerable", "partial") for e in exs)
    assert all(1 <= len(e.gold_positions) <= 2 and len(e.contexts) == len(e.gold_positions) + 1
               for e in exs)
    assert all(len(c.text) <= 700 for e in exs for c in e.contexts)
    assert [e.id for e in teacher_examples("mtrag-gold", 5)] == [e.id for e in exs[:5]]


def test_export_sets_never_mixes_hotpotqa_and_mtrag(tmp_path):
    from rl.adaptation.teacher import export_sets

    with pytest.raises(ValueError, match="exported apart"):
        export_sets(tmp_path / "out", modes=("gold", "mtrag-gold"), store_path=tmp_path / "s")
    with pytest.raises(ValueError, match="mode must be one of"):
        export_sets(tmp_path / "out", modes=("golden",), store_path=tmp_path / "s")
    assert not (tmp_path / "out").exists()


def test_mtrag_teacher_job_uses_the_modes_prompt_and_budget(tmp_path, monkeypatch):
    """`run_teacher_job(mode="mtrag-gold")` answers MTRAG's examples with `cite_long` and 96
    new tokens (a recording generator stands in; the real llama.cpp path is
    test_smollm2_teacher_caches_and_filters), and a re-run reads
    the store instead of answering."""
    require_dataset("mtrag/mtragun-human/generation_tasks/reference.jsonl")
    from rag.generation import factory
    from rag.generation.base import Generator
    from rag.types import Generation
    from rl.adaptation.teacher import run_teacher_job

    calls = []

    class Recorder(Generator):
        name, fingerprint = "recorder", "rec-1"

        def generate(self, question, contexts, prompt_id, max_new_tokens=48, temperature=0.0,
                     abstain_threshold=None):
            calls.append((question, prompt_id, max_new_tokens))
            return Generation("an answer", "an answer [1]", (1,))

    monkeypatch.setattr(factory, "make_generator", lambda *a, **k: Recorder())
    store = tmp_path / "t.sqlite"
    assert run_teacher_job("recorder", "mtrag-gold", 3, store_path=str(store)) == 3
    exs = mtrag_split(3)
    assert calls == [(e.question, "cite_long", 96) for e in exs]
    assert run_teacher_job("recorder", "mtrag-gold", 3, store_path=str(store)) == 3
    assert len(calls) == 3
    recs = TeacherStore(store).records(mode="mtrag-gold", model="recorder")
    assert {r.qid for r in recs} == {e.id for e in exs}
    assert {r.cite_precision for r in recs} <= {0.0, 1.0}


def test_a_question_count_below_one_is_refused():
    """`[:n]` would read -1 as "all but the last" (a silently smaller set) and 0 as none."""
    from rl.adaptation.sft_data import hotpot_split

    for n in (0, -1, True, 2.0):
        with pytest.raises(ConfigError, match="n: must be a whole number >= 1"):
            mtrag_split(n)
        with pytest.raises(ConfigError, match="n: must be a whole number >= 1"):
            hotpot_split("train", n)


def test_teacher_cli_refuses_counts_below_one():
    import subprocess
    import sys

    for flag in ("--n", "--shards"):
        r = subprocess.run([sys.executable, "-m", "rl.adaptation.teacher", flag, "0",
                            "--export-sets", "/nonexistent"], capture_output=True, text=True)
        assert r.returncode == 2 and f"argument {flag}: must be >= 1, got 0" in r.stderr
