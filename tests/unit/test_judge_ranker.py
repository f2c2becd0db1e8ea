"""The `judge` ranker of preference pairs: the reference-guided pointwise judge's grade (a fake
log-prob model here) against the gold answer, plus half the citation precision."""

from __future__ import annotations

import math

import pytest

from rag.errors import ConfigError
from rag.metrics.pairwise_judge import PointwiseJudgeBackend
from rag.types import Context
from rl.adaptation.prefs import judge_ranker
from rl.adaptation.sft_data import SFTExample


def _backend(seen):
    def choice_logprobs(chats, choices):
        out = []
        for chat in chats:
            user = chat[-1]["content"]
            seen.append(user)
            ref = user.split("Reference answer: ")[1].split("\n")[0]
            ans = user.split("Answer: ")[1].split("\n")[0]
            # a paraphrase of the gold answer is graded right; word overlap alone is not
            ok = ans.lower().replace("the city of ", "") == ref.lower()
            out.append([0.0, -3.0] if ok else [-3.0, 0.0])
        return out
    return PointwiseJudgeBackend(choice_logprobs, "fake")


EX = SFTExample("q1", "Where was Ada born?",
                (Context("o", "Bob", "Bob was born in Rome ."),
                 Context("g", "Ada", "Ada was born in London .")),
                "London [2]", answers=("London",), gold_positions=(2,))


def test_the_judge_ranker_credits_a_paraphrase_that_f1_would_not():
    seen = []
    rank = judge_ranker(_backend(seen))
    p = 1 / (1 + math.exp(-3.0))
    assert rank(EX, "the city of London", [2]) == pytest.approx(p + 0.5)
    assert rank(EX, "London Bridge", [2]) == pytest.approx(1 - p + 0.5)
    assert rank(EX, "the city of London", [1]) == pytest.approx(p)  # wrong citation
    assert rank(EX, "the city of London", [1, 2]) == pytest.approx(p + 0.25)
    assert len(seen) == 2  # each distinct answer graded once
    assert all("Reference answer: London" in u for u in seen)


def test_the_judge_ranker_needs_gold():
    rank = judge_ranker(_backend([]))
    bare = SFTExample("q2", "Who?", EX.contexts, "x", answers=(), gold_positions=())
    with pytest.raises(ConfigError, match="needs gold answers"):
        rank(bare, "x", [])
