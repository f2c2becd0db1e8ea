"""The Qwen pairwise judge's order-swap logic and statistics, with a scripted chat function
(no model): which slot wins, ties on disagreement, position bias, agreement with gold F1."""

from rag.metrics.judge import JudgeResult, PairwiseJudge
from rag.metrics.judge_cache import JudgeCache
from rag.metrics.pairwise_judge import (
    ChatLMJudgeBackend,
    judge_stats,
    parse_letter,
    short_judge_prompt,
)


def _answers(messages):
    user = messages[-1]["content"]
    a = user.split("Answer A: ")[1].split("\n")[0]
    b = user.split("Answer B: ")[1].split("\n")[0]
    return a, b


def content_judge(messages, max_tokens):
    """Prefers the answer "Paris" wherever it is shown: an order-free judge."""
    a, b = _answers(messages)
    return ("A" if a == "Paris" else "B" if b == "Paris" else "tie"), 10, 1


def first_slot_judge(messages, max_tokens):
    return "A", 10, 1


def test_order_swap_keeps_content_preference_and_caches():
    calls = []

    def chat(m, k):
        calls.append(m)
        return content_judge(m, k)

    backend = ChatLMJudgeBackend(chat, "fake", cache=JudgeCache(":memory:"))
    judge = PairwiseJudge(backend)
    r = judge.compare("Capital of France?", (), "Paris", "Lyon")
    assert (r.winner, r.forward, r.backward, r.flipped) == ("A", "A", "A", False)
    assert len(calls) == 2
    # the swapped pair shows the same two prompts: both replayed from the cache
    r = judge.compare("Capital of France?", (), "Lyon", "Paris")
    assert r.winner == "B"
    assert len(calls) == 2 and backend.cache_hits == 2
    # the second order shows the answers swapped
    assert _answers(calls[1]) == ("Lyon", "Paris")


def test_position_biased_judge_gives_ties_and_full_bias():
    judge = PairwiseJudge(ChatLMJudgeBackend(first_slot_judge, "fake",
                                             cache=JudgeCache(":memory:")))
    res = [judge.compare("q", (), "x", "y"), judge.compare("q2", (), "u", "v")]
    assert all(r.winner == "tie" and r.flipped for r in res)
    s = judge_stats(res, [1.0, 0.0], [0.0, 0.0])
    assert s["position_bias"] == 1.0 and s["tie_rate"] == 1.0
    assert s["n_f1_differ"] == 1.0 and s["agreement_with_f1_preference"] == 0.0
    assert s["n_decisive"] == 0.0


def test_stats_agreement_counts_ties_as_misses():
    res = [JudgeResult("A", "A", "A", False, 1.0), JudgeResult("B", "B", "B", False, -1.0),
           JudgeResult("tie", "A", "B", True, 0.0), JudgeResult("A", "A", "A", False, 1.0)]
    s = judge_stats(res, [1.0, 1.0, 1.0, 0.5], [0.0, 0.0, 0.0, 0.5])
    assert s["n_f1_differ"] == 3.0           # the last pair has equal F1
    assert s["agreement_with_f1_preference"] == 1 / 3  # A right, B wrong, tie = miss
    assert s["agreement_decisive"] == 1 / 2
    assert s["position_bias"] == 0.25 and s["tie_rate"] == 0.25


def test_unreadable_reply_is_a_counted_tie():
    backend = ChatLMJudgeBackend(lambda m, k: ("hmm", 5, 1), "fake",
                                 cache=JudgeCache(":memory:"))
    r = PairwiseJudge(backend).compare("q", (), "a", "b")
    assert r.winner == "tie" and backend.parse_failures == 2


def test_parse_letter_and_prompt():
    assert parse_letter("B") == "second"
    assert parse_letter("Answer A.") == "first"
    assert parse_letter("Both are wrong, A") == "tie"
    assert parse_letter("") is None
    m = short_judge_prompt("Who?", (), "x", "")
    assert "Answer B: (empty)" in m[-1]["content"]
    assert m[-1]["content"].startswith("Question: Who?")  # shared prefix first (KV reuse)
