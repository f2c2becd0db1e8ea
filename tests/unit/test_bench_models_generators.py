"""bench/models_generators.py (issue 20's Qwen vs SmolLM2 rows) without model weights: the
answer-cost log survives a restart, a cached answer still reports the cost logged when it was
generated, and the rows are named so hybrid and gold results coexist, with the paired F1
difference over the questions both models answered."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
from bench import models_generators as mg

from rag.types import Context, Example, Generation

CTX = (Context("p1", "Paris", "Paris is the capital of France.", 1.0),)
EX = Example("q1", "What is the capital of France?", answers=("Paris",),
             gold_passage_ids=("p1",), gold_titles=("Paris",))


class FakeGen:
    """A generator with the llama.cpp runtime's `stats` / `threads` and an in-memory cache."""

    def __init__(self, text: str):
        self.text, self.threads, self.calls, self.cache = text, 2, 0, {}
        self.stats = {"load_ms": 5.0, "prefill_ms": 0.0, "decode_ms": 0.0}

    def generate(self, question, contexts, prompt_id, max_new_tokens=32):
        if question in self.cache:
            return self.cache[question]
        self.calls += 1
        self.stats["prefill_ms"] += 100.0
        self.stats["decode_ms"] += 50.0
        self.cache[question] = Generation(self.text, self.text + " [1]", (1,), 40, 5,
                                          cached=True)
        return Generation(self.text, self.text + " [1]", (1,), 40, 5)


def test_answer_log_keeps_the_last_record_per_key_across_reopen(tmp_path):
    log = mg.AnswerLog(tmp_path / "a.jsonl")
    k = mg.AnswerLog.key("qwen", "hybrid", 32, "q1")
    log.add({"key": k, "seconds": 9.0})
    log.add({"key": k, "seconds": 3.0})
    log.add({"key": mg.AnswerLog.key("qwen", "gold", 32, "q1"), "seconds": 1.0})
    again = mg.AnswerLog(tmp_path / "a.jsonl")
    assert again.records[k]["seconds"] == 3.0 and len(again.records) == 2


def test_a_cached_answer_reports_the_cost_logged_when_it_was_generated(tmp_path):
    gen, args = FakeGen("Paris"), SimpleNamespace(max_new_tokens=32)
    first = mg._answer_one(gen, "qwen", "hybrid", EX, (), CTX, args,
                           mg.AnswerLog(tmp_path / "a.jsonl"))
    # a restarted run: a fresh log object over the same file, the answer now from the cache
    second = mg._answer_one(gen, "qwen", "hybrid", EX, (), CTX, args,
                            mg.AnswerLog(tmp_path / "a.jsonl"))
    assert gen.calls == 1 and not first["cached"] and second["cached"]
    assert first["score"]["f1"] == second["score"]["f1"] == 1.0
    c = second["cost"]
    assert (c["tokens_in"], c["tokens_out"], c["threads"]) == (40, 5, 2)
    assert (c["prefill_ms"], c["decode_ms"]) == (100.0, 50.0) and c["seconds"] >= 0


def _done(f1s, secs):
    return [{"score": {"f1": f, "em": float(f == 1.0), "recall@k": 0.5},
             "cost": {"seconds": s, "tokens_in": 100, "tokens_out": 10, "prefill_ms": 1000.0,
                      "decode_ms": 500.0, "threads": 2} if s is not None else None}
            for f, s in zip(f1s, secs, strict=True)]


@pytest.mark.parametrize("mode,suffix,tag", [("hybrid", "", "hybrid-k5"),
                                             ("gold", "@gold", "gold-context")])
def test_rows_are_named_per_contexts_and_pair_the_common_questions(mode, suffix, tag):
    done = {mg.QWEN: _done([1.0, 0.5, 1.0, 0.0], [10.0, 20.0, None, 30.0]),
            mg.SMOL: _done([0.0, 0.5, 0.0], [1.0, 1.0, 1.0])}  # cut short: 3 questions
    rows, notes = [], []
    mg._mode_rows(mode, done, SimpleNamespace(seed=0), rows, notes)
    by = {(r["system"], r["metric"]): r for r in rows}
    ds = f"hotpotqa/test[:3]/{tag}"
    assert all(r["dataset"] == ds for r in rows if not r["metric"].startswith("projected"))
    q = by[("qwen2.5-coder-1.5b" + suffix, "answer_f1")]
    assert q["n"] == 3 and q["value"] == pytest.approx(2.5 / 3) and q["ci_low"] is not None
    s = by[("qwen2.5-coder-1.5b" + suffix, "generate_s_per_q")]
    assert s["value"] == pytest.approx(15.0) and s["n"] == 2  # the untimed answer is left out
    assert by[("qwen2.5-coder-1.5b" + suffix, "decode_tok_s")]["value"] == pytest.approx(20.0)
    assert by[("qwen2.5-coder-1.5b" + suffix, "prefill_tok_s")]["value"] == pytest.approx(100.0)
    d = by[(f"qwen2.5-coder-1.5b{suffix} - smollm2-135m{suffix}", "answer_f1_diff")]
    assert d["value"] == pytest.approx(2.0 / 3) and d["n"] == 3
    assert (("hybrid-k5", "gold_recall@5") in by) == (mode == "hybrid")


def test_cost_rows_use_only_the_answers_timed_with_the_run_thread_count():
    costs = [{"seconds": s, "tokens_in": 100, "tokens_out": 10, "prefill_ms": 1000.0,
              "decode_ms": 500.0 * t, "threads": t} for s, t in ((90.0, 2), (40.0, 1), (50.0, 1))]
    rows: list = []
    note = mg._cost_rows("hotpotqa/test[:100]/hybrid-k5", "q", costs + [None], 100, rows, 1)
    by = {r["metric"]: r for r in rows}
    assert by["generate_s_per_q"]["value"] == pytest.approx(45.0)
    assert by["generate_s_per_q"]["n"] == 2 and by["decode_tok_s"]["value"] == pytest.approx(20)
    assert "1 answers timed with 2 threads: 90.0 s/answer, decode 10.00 tok/s" in note
    assert "projected_generate_s_100q" not in by
