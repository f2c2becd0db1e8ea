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


def test_reference_guided_prompt_keeps_the_reference_in_both_orders():
    """A reference answer travels with the pair through the order swap, changes the ask, and
    keys the reply cache (a reference-free reply is not replayed for it)."""
    seen = []

    def chat(messages, max_tokens):
        user = messages[-1]["content"]
        seen.append(user)
        ref = user.split("Reference answer: ")[1].split("\n")[0]
        a, b = _answers(messages)
        return ("A" if a == ref else "B" if b == ref else "tie"), 10, 1

    backend = ChatLMJudgeBackend(chat, "fake", cache=JudgeCache(":memory:"))
    judge = PairwiseJudge(backend)
    r = judge.compare("Capital of France?", (), "Lyon", "Paris", reference="Paris")
    assert (r.forward, r.backward, r.winner) == ("B", "B", "B")
    assert len(seen) == 2 and all("Reference answer: Paris" in u for u in seen)
    assert all(u.endswith("Which answer agrees with the reference answer? Reply A or B.")
               for u in seen)
    plain = short_judge_prompt("Capital of France?", (), "Lyon", "Paris")[-1]["content"]
    assert "Reference" not in plain and plain.endswith("Which answer is correct? Reply A or B.")
    judge.compare("Capital of France?", (), "Lyon", "Paris", reference="Lyon")
    assert len(seen) == 4 and backend.cache_hits == 0  # another reference: asked again


def test_a_reference_for_a_backend_that_cannot_read_it_is_an_error():
    import pytest

    from rag.errors import ConfigError

    class NoReference:
        name = "no-ref"

        def judge_batch(self, items):
            raise AssertionError("must not be called")

    with pytest.raises(ConfigError, match="cannot use a reference answer"):
        PairwiseJudge(NoReference()).compare("q?", (), "a", "b", reference="a")
    backend = ChatLMJudgeBackend(first_slot_judge, "fake", cache=JudgeCache(":memory:"))
    with pytest.raises(ConfigError, match=r"items\[0\]\.reference"):
        PairwiseJudge(backend).compare_batch([("q?", (), "a", "b", "  ")])


def test_pointwise_judge_grades_each_answer_once_and_has_no_position_bias():
    """Each answer is graded alone (log p(Yes) - log p(No)); the higher grade wins in both
    orders, so no verdict follows the slot, and the swap and repeated answers reuse grades."""
    from rag.metrics.pairwise_judge import PointwiseJudgeBackend, grade_prompt

    prompts = []

    def choice_logprobs(chats, choices):
        assert tuple(choices) == ("Yes", "No")
        out = []
        for chat in chats:
            user = chat[-1]["content"]
            prompts.append(user)
            ref = user.split("Reference answer: ")[1].split("\n")[0]
            ans = user.split("Answer: ")[1].split("\n")[0]
            out.append([0.0, -2.0] if ans == ref else [-1.5, -0.5] if ref in ans else [-3.0, 0.0])
        return out

    backend = PointwiseJudgeBackend(choice_logprobs, "fake")
    judge = PairwiseJudge(backend)
    q = "Capital of France?"
    res = judge.compare_batch([(q, (), "Lyon", "Paris", "Paris"), (q, (), "Paris", "Lyon", "Paris"),
                               (q, (), "Paris, France", "Lyon", "Paris")])
    assert [r.winner for r in res] == ["B", "A", "A"]
    assert all(not r.flipped for r in res)
    st = judge_stats(res, [0.0, 1.0, 0.8], [1.0, 0.0, 0.0])
    assert st["position_bias"] == 0.0 and st["agreement_with_f1_preference"] == 1.0
    assert res[0].margin == -5.0 and res[2].margin == 2.0  # grade(A) - grade(B)
    assert backend.calls == len(prompts) == 3  # Lyon, Paris, "Paris, France": once each
    assert judge.usage["calls"] == 3
    assert all(p.endswith("same answer as the reference? Reply Yes or No.") for p in prompts)
    plain = grade_prompt(q, "Paris")[-1]["content"]
    assert "Reference" not in plain and plain.endswith("Is the answer correct? Reply Yes or No.")
