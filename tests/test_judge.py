"""Pairwise judge (rag.metrics.judge): order-swap/tie logic with scripted backends, the metric
backend on hand-made pairs, the OpenAI-compatible backend against a local HTTP responder, and
the SmolLM2 log-likelihood backend with the real packaged weights (slow)."""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, HTTPServer

import pytest

from rag.errors import ConfigError
from rag.generation.openai_compat import EndpointError
from rag.generation.prompts import INSUFFICIENT
from rag.metrics.judge import (
    MetricJudgeBackend,
    OpenAIJudgeBackend,
    PairwiseJudge,
    SlotResult,
    judge_prompt,
    metric_reward,
    parse_verdict,
)
from rag.types import Context

EIFFEL = Context("eiffel", "Eiffel Tower",
                 "The Eiffel Tower is a wrought-iron lattice tower in Paris, France. It was "
                 "completed in 1889 as the entrance arch of the World's Fair.")
Q = "When was the Eiffel Tower completed?"
GOOD = "The Eiffel Tower was completed in 1889."
BAD = "The Eiffel Tower was completed in 1925 by Napoleon Bonaparte."


class Scripted:
    """A backend whose slot verdict is a function of (first, second)."""

    name = "scripted"

    def __init__(self, rule):
        self.rule = rule
        self.seen = []

    def judge_batch(self, items):
        out = []
        for _, _, first, second in items:
            self.seen.append((first, second))
            v = self.rule(first, second)
            out.append(SlotResult(v, {"first": 1.0, "second": -1.0, "tie": 0.0}[v], 1, 10, 2))
        return out


def test_consistent_backend_wins_in_both_orders():
    j = PairwiseJudge(Scripted(lambda f, s: "first" if "good" in f else "second"))
    r = j.compare(Q, [EIFFEL], "good answer", "bad answer")
    assert (r.winner, r.forward, r.backward, r.flipped) == ("A", "A", "A", False)
    assert r.margin == 1.0
    r = j.compare(Q, [EIFFEL], "bad answer", "good answer")
    assert r.winner == "B" and r.margin == -1.0
    u = j.usage
    assert (u["pairs"], u["calls"], u["tokens_in"], u["tokens_out"]) == (2, 4, 40, 8)
    assert u["position_bias_rate"] == 0.0 and u["ties"] == 0
    # the backend saw both orders
    assert j.backend.seen[:2] == [("good answer", "bad answer")] or \
        ("bad answer", "good answer") in j.backend.seen


def test_first_slot_bias_becomes_tie_and_is_reported():
    j = PairwiseJudge(Scripted(lambda f, s: "first"))
    res = j.compare_batch([(Q, [EIFFEL], "x", "y"), (Q, [EIFFEL], "y", "x"),
                           (Q, [EIFFEL], "p", "q")])
    assert [r.winner for r in res] == ["tie"] * 3
    assert all(r.flipped for r in res) and all(r.margin == 0.0 for r in res)
    u = j.usage
    assert u["position_bias_rate"] == 1.0 and u["first_slot_wins_both"] == 3
    assert u["ties"] == 3 and u["calls"] == 6
    # without the swap the same backend "decides" every pair for A
    j1 = PairwiseJudge(Scripted(lambda f, s: "first"), swap=False)
    assert [r.winner for r in j1.compare_batch([(Q, [EIFFEL], "x", "y")] * 2)] == ["A", "A"]
    assert j1.usage["calls"] == 2


def test_one_order_tie_is_a_tie():
    j = PairwiseJudge(Scripted(lambda f, s: "first" if f == "a" else "tie"))
    r = j.compare(Q, [], "a", "b")
    assert (r.forward, r.backward, r.winner, r.flipped) == ("A", "tie", "tie", True)
    assert j.usage["position_bias_rate"] == 1.0


def test_bad_items_are_named():
    with pytest.raises(ConfigError) as e:
        PairwiseJudge(Scripted(lambda f, s: "tie")).compare_batch([(Q, [EIFFEL], "a")])
    assert e.value.field == "items[0]"
    with pytest.raises(ConfigError):
        MetricJudgeBackend(scorer=object(), faithfulness_weight=1.5)


def test_parse_verdict():
    assert parse_verdict('{"winner": "A", "reason": "x"}') == "first"
    assert parse_verdict('```json\n{"winner":"b"}\n```') == "second"
    assert parse_verdict('I think {"winner": "tie"}') == "tie"
    assert parse_verdict('winner: B') == "second"
    assert parse_verdict("no idea") is None
    assert parse_verdict('{"winner": "C"}') is None


def test_metric_reward_rule():
    assert metric_reward({"faithfulness": 1.0, "answer_relevancy": 0.4}) == pytest.approx(0.7)
    assert metric_reward({"answer_relevancy": 0.0}) == pytest.approx(0.25)  # abstention
    assert metric_reward({"faithfulness": 0.0, "answer_relevancy": 0.4}) == pytest.approx(0.2)


@pytest.fixture(scope="module")
def metric_backend():
    from rag.encoders import Encoder
    from rag.metrics.quality import QualityScorer

    return MetricJudgeBackend(QualityScorer(Encoder.from_registry("minilm")))


def test_metric_backend_hand_made_pairs(metric_backend):
    j = PairwiseJudge(metric_backend)
    res = j.compare_batch([(Q, [EIFFEL], GOOD, BAD), (Q, [EIFFEL], BAD, GOOD),
                           (Q, [EIFFEL], GOOD, GOOD), (Q, [EIFFEL], INSUFFICIENT, GOOD)])
    assert [r.winner for r in res] == ["A", "B", "tie", "B"]
    assert res[0].margin > 0.2 and res[1].margin == pytest.approx(-res[0].margin)
    u = j.usage
    assert u["position_bias_rate"] == 0.0 and u["pairs"] == 4 and u["calls"] == 16
    r = metric_backend.rewards([(Q, [EIFFEL], GOOD), (Q, [EIFFEL], BAD)])
    assert r[0] > r[1]


# ---- OpenAI-compatible endpoint ------------------------------------------------------------
class _Responder(BaseHTTPRequestHandler):
    """Rule-based judge: prefers the answer that contains '1889'; mode 'garbage' replies
    without a verdict, mode 'error' answers 500."""

    mode = "rule"

    def do_POST(self):  # noqa: N802 - http.server API
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        if self.mode == "error":
            self.send_response(500)
            self.end_headers()
            return
        user = body["messages"][-1]["content"]
        a = user.split("Answer A:")[1].split("Answer B:")[0]
        verdict = "A" if "1889" in a else "B"
        content = "I cannot decide." if self.mode == "garbage" else \
            json.dumps({"winner": verdict, "reason": "date"})
        out = json.dumps({"choices": [{"message": {"content": content}}],
                          "usage": {"prompt_tokens": len(user.split()), "completion_tokens": 7}})
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.end_headers()
        self.wfile.write(out.encode())

    def log_message(self, *args):
        pass


@pytest.fixture()
def server():
    srv = HTTPServer(("127.0.0.1", 0), _Responder)
    t = threading.Thread(target=srv.serve_forever, daemon=True)
    t.start()
    yield srv
    srv.shutdown()
    srv.server_close()
    _Responder.mode = "rule"


def test_openai_backend_over_http(server):
    be = OpenAIJudgeBackend(f"http://127.0.0.1:{server.server_address[1]}", "judge-model")
    j = PairwiseJudge(be)
    res = j.compare_batch([(Q, [EIFFEL], GOOD, BAD), (Q, [EIFFEL], BAD, GOOD)])
    assert [r.winner for r in res] == ["A", "B"]
    u = j.usage
    assert u["calls"] == 4 and u["tokens_out"] == 28 and u["tokens_in"] > 40
    assert u["position_bias_rate"] == 0.0
    _Responder.mode = "garbage"
    r = j.compare(Q, [EIFFEL], GOOD, BAD)
    assert r.winner == "tie" and be.parse_failures == 2
    _Responder.mode = "error"
    with pytest.raises(EndpointError):
        j.compare(Q, [EIFFEL], GOOD, BAD)


def test_openai_backend_rejects_bad_url():
    with pytest.raises(ConfigError) as e:
        OpenAIJudgeBackend("ftp://x", "m")
    assert e.value.field == "url"


def test_judge_prompt_shows_both_answers_and_passages():
    msgs = judge_prompt(Q, [EIFFEL], "first one", "second one", json_verdict=True)
    user = msgs[-1]["content"]
    assert user.index("Answer A: first one") < user.index("Answer B: second one")
    assert "[1] Eiffel Tower:" in user and '"winner"' in user


@pytest.mark.slow
def test_local_smollm2_judge_is_deterministic_and_counted():
    from rag.metrics.judge import LocalLMJudgeBackend

    be = LocalLMJudgeBackend("smollm2-135m-instruct")
    items = [(Q, [EIFFEL], GOOD, BAD), (Q, [EIFFEL], INSUFFICIENT, GOOD)]
    j = PairwiseJudge(be)
    r1 = j.compare_batch(items)
    r2 = PairwiseJudge(be).compare_batch(items)
    assert [r.to_dict() for r in r1] == [r.to_dict() for r in r2]
    u = j.usage
    assert u["pairs"] == 2 and u["calls"] == 4 and u["tokens_in"] > 4 * 60
    for r in r1:
        assert r.winner in ("A", "B", "tie") and r.flipped == (r.forward != r.backward)
    raw = be.judge_batch(items[:1])
    assert raw[0].margin != 0.0 and raw[0].verdict in ("first", "second")
