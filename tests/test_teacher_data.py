"""Teacher data (rl.adaptation.teacher) and the distillation SFT sets (sft_data): SmolLM2 on
the llama.cpp runtime stands in for the Qwen teacher on 3 HotpotQA train questions. The store
answers a re-run from cache (no generation), and the filter keeps only cited answers with
enough F1 and citation precision."""

from __future__ import annotations

import pytest
from tests.conftest import require_dataset

from rag import llama_runtime
from rl.adaptation.sft_data import SFTExample, distillation_sets, format_target
from rl.adaptation.teacher import (
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
    assert counts == {"records": 3, "unknown_question": 0, "mismatched": 1, "duplicate": 1,
                      "used": 1, "kept": 1}


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
