"""Prompts, output parsing, the extractive reader, the transformers backend (tiny random model
and the real packaged SmolLM2), the OpenAI-compatible backend against a local server."""

import json
import threading
from http.server import BaseHTTPRequestHandler, HTTPServer

import pytest

from rag.errors import ConfigError
from rag.generation.extractive import ExtractiveReader, qtype
from rag.generation.factory import make_generator
from rag.generation.parse import parse_citations, parse_output
from rag.generation.prompts import INSUFFICIENT, get_prompt, list_prompts
from rag.types import Context

CTX = [Context("a", "Vornacle Systems", "Vornacle Systems is a software firm. It was founded by "
                                        "Ada Quill in 1931."),
       Context("b", "Ada Quill", "Ada Quill was a chemist. She was born in Stenmouth in 1899."),
       Context("c", "Brask Works", "Brask Works was founded in 1950 by Tom Ferr.")]


@pytest.mark.parametrize(("raw", "n", "answer", "cites"), [
    ("Paris [1][3]", 3, "Paris", (1, 3)),
    ("Answer: Paris [1, 2].", 3, "Paris", (1, 2)),
    ("The answer is: 1,200 people [2]", 2, "1,200 people", (2,)),
    ('"Ada Quill" [4] [2]', 3, "Ada Quill", (2,)),          # out-of-range citation dropped
    ("Paris, because [1] says so", 3, "Paris", (1,)),
    ("The passages do not say. Insufficient context.", 3, INSUFFICIENT, ()),
    ("1931 [1", 3, "1931", ()),                              # citation cut by max tokens
])
def test_parse_output(raw, n, answer, cites):
    assert parse_output(raw, n) == (answer, cites)


def test_question_echo_is_stripped():
    q = "In which city was the founder of Vornacle Systems born?"
    raw = "The founder of Vornacle Systems was born in Stenmouth"
    assert parse_output(raw, 3, True, q)[0] == "Stenmouth"
    assert parse_citations("[2][2][1]", 2) == (2, 1)


def test_prompts_registry():
    assert {"cite_concise", "cite_verbose", "plain", "cite_concise_abstain"} <= set(
        list_prompts())
    msgs = get_prompt("cite_concise").messages("Q?", CTX)
    assert msgs[0]["role"] == "system" and "[2] Ada Quill: Ada Quill was" in msgs[1]["content"]
    assert INSUFFICIENT in get_prompt("cite_concise_abstain").instruction
    with pytest.raises(ConfigError, match="prompt_id"):
        get_prompt("nope")


@pytest.mark.parametrize(("q", "kind", "answer", "cite"), [
    ("In which year was Vornacle Systems founded?", "year", "1931", 1),
    ("Where was Ada Quill born?", "entity", "Stenmouth", 2),
    ("Which company was founded earlier, Vornacle Systems or Brask Works?", "choice",
     "Vornacle Systems", 1),
    ("Which company was founded later, Vornacle Systems or Brask Works?", "choice",
     "Brask Works", 3),
    ("Was Ada Quill a chemist?", "yesno", "yes", None),
])
def test_extractive_reader(q, kind, answer, cite):
    assert qtype(q) == kind
    g = ExtractiveReader().generate(q, CTX, "cite_concise")
    assert g.text == answer
    if cite:
        assert cite in g.citations
    assert ExtractiveReader().generate(q, [], "x").text == INSUFFICIENT


def _tiny_llama(tmp_path):
    """A randomly initialised 2-layer Llama with the packaged MiniLM's tokenizer."""
    import torch
    from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM

    from rag.models import default_registry

    tok = AutoTokenizer.from_pretrained(str(default_registry().get("minilm").resolve()))
    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=len(tok), hidden_size=32, intermediate_size=64,
                      num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                      max_position_embeddings=512, pad_token_id=tok.pad_token_id,
                      eos_token_id=tok.sep_token_id, bos_token_id=tok.cls_token_id)
    LlamaForCausalLM(cfg).save_pretrained(tmp_path / "tiny")
    tok.save_pretrained(tmp_path / "tiny")
    return tmp_path / "tiny"


def test_transformers_backend_batches_and_caches(tmp_path, monkeypatch):
    monkeypatch.setenv("RAGPILOT_CACHE", str(tmp_path / "cache"))
    from rag.generation.local import TransformersGenerator
    from rag.models import ModelSpec

    spec = ModelSpec("tiny", "generator", "hf", path=str(_tiny_llama(tmp_path)))
    gen = TransformersGenerator(spec, batch_size=4)
    qs = ["Who founded Vornacle Systems?", "When was Brask Works founded?"]
    batched = gen.generate_batch(qs, [CTX, CTX[:2]], "cite_concise", max_new_tokens=6)
    single = [gen.generate(q, c, "cite_concise", max_new_tokens=6)
              for q, c in zip(qs, [CTX, CTX[:2]], strict=True)]
    assert [g.raw for g in batched] == [g.raw for g in single]  # left padding is exact
    assert all(g.cached for g in single) and not any(g.cached for g in batched)
    assert all(g.tokens_in > 20 and 0 < g.tokens_out <= 6 for g in batched)


@pytest.mark.slow
def test_real_smollm2_answers_with_a_citation():
    gen = make_generator("smollm2-135m-instruct", cache=False)
    ctx = [Context("p", "Stenmouth", "Stenmouth is a harbour town. The lighthouse of Stenmouth "
                                     "was built in 1887.")]
    g = gen.generate("When was the lighthouse of Stenmouth built?", ctx, "cite_concise",
                     max_new_tokens=16)
    assert "1887" in g.raw
    assert g.tokens_in > 30 and g.tokens_out > 0


class _Handler(BaseHTTPRequestHandler):
    def do_POST(self):  # noqa: N802 - http.server API
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        _Handler.seen = body
        content = "Stenmouth [2]" if body["model"] == "m" else ""
        out = json.dumps({"choices": [{"message": {"content": content}}],
                          "usage": {"prompt_tokens": 42, "completion_tokens": 3}}).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(out)))
        self.end_headers()
        self.wfile.write(out)

    def log_message(self, *args):
        pass


def test_openai_compatible_endpoint(tmp_path, monkeypatch):
    monkeypatch.setenv("RAGPILOT_CACHE", str(tmp_path))
    from rag.generation.openai_compat import EndpointError, OpenAIChatGenerator

    srv = HTTPServer(("127.0.0.1", 0), _Handler)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    try:
        gen = OpenAIChatGenerator(f"http://127.0.0.1:{srv.server_port}/v1", "m")
        g = gen.generate("Where was Ada Quill born?", CTX, "cite_concise")
        assert (g.text, g.citations, g.tokens_in) == ("Stenmouth", (2,), 42)
        assert _Handler.seen["messages"][1]["content"].startswith("Passages:")
        assert gen.generate("Where was Ada Quill born?", CTX, "cite_concise").cached
    finally:
        srv.shutdown()
    dead = OpenAIChatGenerator(f"http://127.0.0.1:{srv.server_port}/v1", "m", timeout=1,
                               cache=False)
    with pytest.raises(EndpointError, match="endpoint"):
        dead.generate("q?", CTX, "plain")
    with pytest.raises(ConfigError, match="url"):
        OpenAIChatGenerator("localhost:1", "m")
