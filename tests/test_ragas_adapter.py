"""The real ragas 0.4.3 behind `RagasScorer`, against the project's own OpenAI-compatible server
(`tests.support.llm_server`, rule-based judge) on 127.0.0.1: known values, determinism, call/token
accounting that matches what the server received, the disk cache, typed errors — and no
tiktoken download on the way."""

from __future__ import annotations

import json
import socket

import httpx
import pytest
from tests.support.llm_server import LLMServer, RuleBasedResponder

from rag.errors import ConfigError
from rag.metrics.cost import judge_inputs, project_ragas, ragas_calls_per_sample
from rag.metrics.ragas_adapter import EndpointError, RagasConfig, RagasScorer
from rag.types import Answer, Context, Example

CTX = (Context("a", "Vornacle Systems", "Vornacle Systems is a software firm. It was founded "
                                        "by Ada Quill in 1931."),
       Context("b", "Ada Quill", "Ada Quill was a chemist. She was born in Stenmouth in 1899."),
       Context("c", "Brask Works", "Brask Works was founded in 1950 by Tom Ferr."))


def _answer(q: str, text: str, cites=()) -> Answer:
    return Answer("q", q, text, tuple(cites), CTX, (), {}, 0, 0, "h")


SUPPORTED = (_answer("Where was Ada Quill born?",
                     "Ada Quill was born in Stenmouth in 1899. She was a chemist. [2]", (2,)),
             Example("1", "Where was Ada Quill born?", ("Stenmouth",)))
UNSUPPORTED = (_answer("Who founded Brask Works?",
                       "Brask Works was founded by Maria Lenz in Paris. It makes violins."),
               Example("2", "Who founded Brask Works?", ("Tom Ferr",)))
ABSTAINS = (_answer("When was Vornacle Systems founded?", "I don't know."), None)
SAMPLES = [SUPPORTED, UNSUPPORTED, ABSTAINS]


@pytest.fixture(autouse=True)
def _no_tiktoken(monkeypatch):
    """tiktoken downloads its BPE files on first use (fails offline): make any use an error."""
    import tiktoken
    import tiktoken.load

    def boom(*a, **k):
        raise AssertionError("tiktoken was used (it would download its BPE file)")

    for mod, name in ((tiktoken, "get_encoding"), (tiktoken, "encoding_for_model"),
                      (tiktoken.load, "load_tiktoken_bpe"), (tiktoken.load, "read_file")):
        monkeypatch.setattr(mod, name, boom)


@pytest.fixture(scope="module")
def server():
    with LLMServer() as srv:
        yield srv


@pytest.fixture(scope="module")
def encoder():
    from rag.encoders import Encoder

    return Encoder.from_registry("minilm")


def _score(server, encoder, **cfg):
    scorer = RagasScorer({"base_url": server.url, "model": "judge", **cfg}, encoder=encoder)
    before = server.stats
    rows = scorer.score_batch([a for a, _ in SAMPLES], [e for _, e in SAMPLES])
    after = server.stats
    got = {k: after[k] - before[k] for k in ("requests", "prompt_tokens", "completion_tokens")}
    return scorer, rows, got


def test_known_values_and_ranges(server, encoder):
    _, rows, _ = _score(server, encoder, cache=False)
    sup, uns, abst = rows
    assert sup["faithfulness"] == 1.0 and uns["faithfulness"] == 0.0
    assert "faithfulness" not in abst  # no statements -> ragas NaN -> left out
    assert abst["answer_relevancy"] == 0.0  # noncommittal
    # reference "Stenmouth" is only in context 2 -> precision@2 = 1/2; "Tom Ferr" in 3 -> 1/3
    assert sup["context_precision"] == pytest.approx(0.5)
    assert uns["context_precision"] == pytest.approx(1 / 3)
    assert sup["context_recall"] == 1.0 and uns["context_recall"] == 1.0
    assert "context_recall" not in abst  # no reference
    assert sup["answer_relevancy"] > 0.5
    for r in rows:
        assert all(0.0 <= v <= 1.0 for v in r.values())
        assert list(r) == [m for m in ("faithfulness", "answer_relevancy", "context_precision",
                                       "context_recall") if m in r]


def test_deterministic_and_counted_like_the_server(server, encoder):
    s1, rows1, got1 = _score(server, encoder, cache=False)
    s2, rows2, got2 = _score(server, encoder, cache=False)
    assert rows1 == rows2 and got1 == got2
    u = s1.usage
    assert u["total"]["calls"] == u["total"]["requests"] == got1["requests"]
    assert u["total"]["prompt_tokens"] == got1["prompt_tokens"]
    assert u["total"]["completion_tokens"] == got1["completion_tokens"]
    assert u["total"]["failures"] == 0
    # calls per metric follow ragas' call pattern (no dedupe without the cache)
    expected = {m: 0 for m in ("faithfulness", "answer_relevancy", "context_precision",
                               "context_recall")}
    for a, e in SAMPLES:
        for m, n in ragas_calls_per_sample(len(a.contexts), bool(e and e.answers),
                                           strictness=3, dedupe=False).items():
            expected[m] += n
    expected["faithfulness"] -= 1  # the abstention yields no statements: no NLI call
    assert {m: u[m]["calls"] for m in expected} == expected
    # per answer: its question + the generated question (3 identical ones, encoded once)
    assert u["answer_relevancy"]["embedded_texts"] == 3 * 2
    # the projection predicts calls and prompt tokens exactly for this judge
    proj = project_ragas([judge_inputs(a, e) for a, e in SAMPLES], dedupe=False)
    for m in expected:
        assert proj[m]["calls"] == u[m]["calls"]
        assert proj[m]["prompt_tokens"] == u[m]["prompt_tokens"]
        assert proj[m]["completion_tokens"] == pytest.approx(u[m]["completion_tokens"], rel=0.5)


def test_disk_cache_replays_without_calls(server, encoder, tmp_path):
    path = str(tmp_path / "judge.sqlite")
    first, rows1, got1 = _score(server, encoder, cache_path=path)
    u1 = first.usage
    # identical answer-relevancy prompts are answered once per answer
    assert u1["answer_relevancy"]["calls"] == 3 and u1["answer_relevancy"]["cache_hits"] == 6
    assert got1["requests"] == u1["total"]["calls"]
    second, rows2, got2 = _score(server, encoder, cache_path=path)
    assert rows2 == rows1
    assert got2["requests"] == 0 and second.usage["total"]["calls"] == 0
    assert second.usage["total"]["cache_hits"] == second.usage["total"]["requests"] > 0
    _, rows3, _ = _score(server, encoder, cache=False)
    assert rows3 == rows1  # the cache changes the bill, not the scores


class _Garbage(RuleBasedResponder):
    def reply(self, prompt: str) -> str:
        return "sure! here you go" if "Output" in prompt else super().reply(prompt)


def test_unparsable_replies_leave_metrics_out(encoder):
    with LLMServer(_Garbage()) as srv:
        scorer = RagasScorer({"base_url": srv.url, "model": "m", "cache": False,
                              "max_retries": 1}, encoder=encoder)
        rows = scorer.score_batch([SUPPORTED[0]], [SUPPORTED[1]])
        u = scorer.usage
    assert rows == [{}]
    assert u["total"]["failures"] == u["total"]["requests"] == 4  # first call of each metric
    assert u["total"]["calls"] == 8 == srv.stats["requests"]  # one retry each


def test_config_errors_name_the_key():
    with pytest.raises(ConfigError, match="ragas.base_url.*RAGPILOT_RAGAS_BASE_URL"):
        RagasConfig.load({}, env={})
    with pytest.raises(ConfigError, match="ragas.model"):
        RagasConfig.load({"base_url": "http://127.0.0.1:1/v1"}, env={})
    with pytest.raises(ConfigError, match="ragas.base_url: must be an http"):
        RagasConfig.load({"base_url": "127.0.0.1:1", "model": "m"}, env={})
    with pytest.raises(ConfigError, match="ragas.temprature: unknown key"):
        RagasConfig.load({"base_url": "http://h", "model": "m", "temprature": 0}, env={})
    with pytest.raises(ConfigError, match="ragas.strictness"):
        RagasConfig.load({"base_url": "http://h", "model": "m", "strictness": 0}, env={})
    env = {"RAGPILOT_RAGAS_BASE_URL": "http://h:1", "RAGPILOT_RAGAS_MODEL": "m"}
    cfg = RagasConfig.load(None, env=env)
    assert (cfg.chat_url, cfg.model) == ("http://h:1/v1/chat/completions", "m")
    assert RagasConfig.configured(env) and not RagasConfig.configured({})
    assert RagasConfig.load({"model": "x"}, env=env).model == "x"  # the mapping wins


def test_unreachable_endpoint_is_a_typed_error(encoder):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # closed again: nothing listens there
    scorer = RagasScorer({"base_url": f"http://127.0.0.1:{port}/v1", "model": "m",
                          "cache": False, "timeout_s": 2}, encoder=encoder)
    with pytest.raises(EndpointError, match="ragas.base_url .*unreachable"):
        scorer.score(*SUPPORTED)


def test_server_rejects_bad_requests_and_serves_plain_chat(server):
    from rag.generation.openai_compat import OpenAIChatGenerator

    url = server.url + "/chat/completions"
    r = httpx.post(url, content=b"{oops", headers={"Content-Type": "application/json"})
    assert r.status_code == 400 and r.json()["error"]["param"] == "body"
    r = httpx.post(url, json={"model": "m", "messages": []})
    assert r.status_code == 400 and "messages" in r.json()["error"]["message"]
    assert httpx.get(server.url + "/models").json()["data"][0]["id"] == "ragpilot-rules"
    gen = OpenAIChatGenerator(server.url, "m", cache=False)
    g = gen.generate("Where was Ada Quill born?", CTX, "plain")
    assert g.raw == "I cannot answer that." and g.tokens_in > 20
    # a schema-bearing prompt that is not one of ragas' gets a valid (empty) JSON object
    r = httpx.post(url, json={"model": "m", "messages": [
        {"role": "user", "content": "Reply in JSON Schema: {\"title\": \"Other\"}"}]})
    assert json.loads(r.json()["choices"][0]["message"]["content"]) == {}


@pytest.mark.slow
def test_server_around_the_packaged_smollm2():
    from tests.support.llm_server import ChatModelResponder

    with LLMServer(ChatModelResponder("smollm2-135m-instruct")) as srv:
        r = httpx.post(srv.url + "/chat/completions", timeout=120, json={
            "model": "smollm2", "max_tokens": 8,
            "messages": [{"role": "user", "content": "What is the capital of France?"}]})
    body = r.json()
    assert r.status_code == 200 and body["choices"][0]["message"]["content"].strip()
    assert 0 < body["usage"]["completion_tokens"] <= 8 and body["usage"]["prompt_tokens"] > 5


def test_rows_persist_on_disk_for_the_local_scorer(encoder, tmp_path):
    from rag.metrics.judge_cache import CachedScorer, JudgeCache
    from rag.metrics.quality import QualityScorer

    answers, examples = [a for a, _ in SAMPLES], [e for _, e in SAMPLES]
    path = tmp_path / "rows.sqlite"
    first = CachedScorer(QualityScorer(encoder), JudgeCache(path))
    rows = first.score_batch(answers, examples)
    assert first.misses == 3 and rows[0]["faithfulness"] == 1.0
    inner = QualityScorer(encoder)
    again = CachedScorer(inner, JudgeCache(path))  # a later process: same file
    assert again.score_batch(answers, examples) == rows
    assert again.hits == 3 and inner.usage["answers"] == 0  # nothing recomputed
    changed = SAMPLES[1][0].__class__(**{**SAMPLES[1][0].__dict__, "text": "Tom Ferr."})
    again.score(changed, SAMPLES[1][1])
    assert again.misses == 1 and inner.usage["answers"] == 1
    other = CachedScorer(QualityScorer(encoder, relevancy_statement="question+answer"),
                         JudgeCache(path))
    other.score_batch(answers, examples)
    assert other.misses == 3  # other settings, other rows


def test_compared_with_the_reference_free_signal(server, encoder):
    """What the adapter's faithfulness is compared with where answers have no gold: the answer
    signal `sig_combined` (rag.metrics.signals, bundled combiner) orders these answers as
    ragas' faithfulness does, and scores the abstention 0 (ragas leaves it out)."""
    from rag.metrics.signals import AnswerSignals

    _, rows, _ = _score(server, encoder, cache=False)
    sig = AnswerSignals(encoder).score_batch([a for a, _ in SAMPLES])
    assert rows[0]["faithfulness"] > rows[1]["faithfulness"]
    assert sig[0]["sig_combined"] > sig[1]["sig_combined"]
    assert sig[2]["sig_combined"] == 0.0
