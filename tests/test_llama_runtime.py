"""The optional llama.cpp runtime (rag.llama_runtime): SmolLM2's packaged GGUF through the
generator interface (greedy, exact token counts, per-stage cost, disk cache, threads), and the
nomic GGUF embedder through the Encoder interface when it has been pulled. Tests that need
the runtime skip with a reason when llama-cpp-python is not installed (it is built apart:
scripts/build_llama_cpp.sh); the error a user gets without it is tested always."""

from __future__ import annotations

import sys

import numpy as np
import pytest

from rag import llama_runtime
from rag.errors import ConfigError
from rag.models import ModelRegistry, ModelSpec
from rag.types import Context

needs_runtime = pytest.mark.skipif(
    not llama_runtime.available(),
    reason="llama-cpp-python not installed (optional: bash scripts/build_llama_cpp.sh)")

CTX = [Context("p1", "Paris", "Paris is the capital and largest city of France."),
       Context("p2", "Rome", "Rome is the capital city of Italy.")]


def test_missing_runtime_names_the_build_script(monkeypatch, tmp_path):
    monkeypatch.setitem(sys.modules, "llama_cpp", None)  # import fails as if not installed
    assert not llama_runtime.available()
    with pytest.raises(ConfigError, match="scripts/build_llama_cpp.sh"):
        llama_runtime.LlamaCppGenerator("x", tmp_path / "m.gguf")


def test_thread_count_is_checked(monkeypatch):
    monkeypatch.setenv(llama_runtime.THREADS_ENV, "0")
    with pytest.raises(ConfigError, match="threads"):
        llama_runtime._threads(None)
    monkeypatch.setenv(llama_runtime.THREADS_ENV, "3")
    assert llama_runtime._threads(None) == 3 and llama_runtime._threads(2) == 2


def test_llama_entries_refuse_a_gpu_device():
    from rag.generation.factory import make_generator

    with pytest.raises(ConfigError, match="device"):
        make_generator("smollm2-135m-instruct-llama", registry=ModelRegistry(), device="cuda")


@pytest.fixture(scope="module")
def smol():
    from rag.generation.factory import make_generator

    return make_generator("smollm2-135m-instruct-llama", registry=ModelRegistry(), cache=False)


@needs_runtime
@pytest.mark.slow
def test_smollm2_generates_greedily_with_token_counts_and_costs(smol):
    q = "What is the capital of France?"
    g1 = smol.generate(q, CTX, "cite_concise", max_new_tokens=24)
    g2 = smol.generate(q, CTX, "cite_concise", max_new_tokens=24)
    assert g1.raw and g1.raw == g2.raw  # temperature 0 is greedy: same text every time
    assert g1.tokens_in > 40 and 1 <= g1.tokens_out <= 24
    s = smol.stats
    assert s["calls"] == 2 and s["tokens_in"] == 2 * g1.tokens_in
    assert s["decode_ms"] > 0 and s["load_ms"] > 0
    assert smol.threads == 1 and smol.fingerprint.startswith("smollm2-135m-instruct-llama:")
    batch = smol.generate_batch([q, "Which city is Italy's capital?"], [CTX, CTX], "plain",
                                max_new_tokens=16)
    assert len(batch) == 2 and all(b.tokens_out >= 1 for b in batch)


@needs_runtime
@pytest.mark.slow
def test_generations_are_cached_on_disk(tmp_path, monkeypatch):
    monkeypatch.setenv("RAGPILOT_CACHE", str(tmp_path))
    reg = ModelRegistry()
    spec = reg.get("smollm2-135m-instruct-llama")
    gen = llama_runtime.LlamaCppGenerator(spec.name, spec.resolve(), threads=1)
    a = gen.generate("Capital of Italy?", CTX, "cite_concise", max_new_tokens=12)
    b = gen.generate("Capital of Italy?", CTX, "cite_concise", max_new_tokens=12)
    assert a.text == b.text and gen.stats["calls"] == 1  # the second answer came from the cache


@needs_runtime
@pytest.mark.slow
def test_nomic_embeds_with_its_prefixes():
    from rag.encoders import Encoder, encode_documents, encode_queries

    spec = ModelRegistry().get("nomic-embed-text-v1.5")
    try:
        spec.resolve()
    except Exception as exc:  # a 285 MB pull is not part of the test set-up
        pytest.skip(f"nomic not pulled: {exc}")
    enc = Encoder.from_registry("nomic-embed-text-v1.5-llama")
    assert enc.dim == 768 and enc.query_prefix == "search_query: "
    docs = encode_documents(enc, [c.text for c in CTX] + ["Statins lower LDL cholesterol."])
    q = encode_queries(enc, ["Which city is the capital of France?"])[0]
    np.testing.assert_allclose(np.linalg.norm(docs, axis=1), 1.0, atol=1e-5)
    assert int(np.argmax(docs @ q)) == 0
    plain = enc.encode(["Which city is the capital of France?"])[0]
    assert float(plain @ q) < 0.999  # the prefix is really sent
    # shared with the torch port (rag.nomic_port): same vectors within cosine 1e-4
    assert enc.fingerprint.endswith("-gguf") and isinstance(enc, llama_runtime.LlamaCppEncoder)


def test_encoder_spec_for_gguf_without_runtime_is_a_clear_error(monkeypatch, tmp_path):
    from rag import encoders

    monkeypatch.setitem(sys.modules, "llama_cpp", None)
    f = tmp_path / "e.gguf"
    f.write_bytes(b"GGUF")
    with pytest.raises(ConfigError, match="build_llama_cpp"):
        encoders._load(encoders.Encoder, ModelSpec("e", "encoder", "gguf", path=str(f)), "cpu")
