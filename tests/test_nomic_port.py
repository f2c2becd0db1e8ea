"""The PyTorch port of nomic-embed-text-v1.5 (rag.nomic_port) against llama.cpp on the same
F16 GGUF: identical token ids, cosine >= 0.9999 on every one of 24 texts (prefixed queries and
documents, accents, numbers, short and ~400-token texts), vectors independent of batch-mates,
and one shared fingerprint (hence shared cached embeddings/indexes). Skips with the pull
command when the model has not been pulled (285 MB); the llama.cpp comparisons also skip when
llama-cpp-python is not installed (scripts/build_llama_cpp.sh)."""

from __future__ import annotations

import numpy as np
import pytest

from rag import llama_runtime
from rag.errors import RagError
from rag.models import ModelRegistry

pytestmark = pytest.mark.slow

NAME = "nomic-embed-text-v1.5"
ABSTRACT = ("Background: Statin therapy lowers low-density lipoprotein cholesterol (LDL-C) and "
            "reduces cardiovascular events. Methods: In a randomised, double-blind trial, 1,204 "
            "adults aged 40-75 years with type 2 diabetes were assigned atorvastatin 10 mg/day "
            "or placebo and followed for 3.9 years (IQR 3.1-4.6). Results: LDL-C fell by 40% "
            "(95% CI 37-43); the hazard ratio for major events was 0.63 (p<0.001). ")
TEXTS = [
    "search_query: What lowers cholesterol?",
    "search_query: does vitamin D prevent fractures in older adults",
    "search_query: 0-dimensional biomaterials show inductive properties.",
    "search_query: ALDH1 expression is associated with poorer prognosis for breast cancer.",
    "search_query: Café naïve résumé über Straße",
    "search_query: β-cell dysfunction in T2DM",
    "search_document: Statins lower LDL cholesterol in adults with heart disease.",
    "search_document: Paris is the capital and largest city of France.",
    "search_document: Rome is the capital city of Italy, founded on seven hills.",
    "search_document: " + ABSTRACT,
    "search_document: " + ABSTRACT * 3,
    "search_document: Gene expression in T cells changes after antigen exposure (n=40,000).",
    "search_document: The mitochondrion produces ATP. " * 8,
    "search_document: 日本語のテキストと English mixed 混合",
    "search_document: [CLS] tokens written as text, ##pieces and e-mail@example.com",
    "search_document: COVID-19 mRNA vaccines: BNT162b2 efficacy 95.0% (CI 90.3–97.6).",
    "short",
    "a",
    "Multiple     spaces\tand\nnewlines   here",
    "UPPER CASE TEXT SHOULD BE LOWERED",
    "dogs running in the park at dawn",
    "The quick brown fox jumps over the lazy dog.",
    "search_query: how many people live in tokyo",
    "search_document: Tokyo's population is about 14 million (2023); its metro area ~37M.",
]


@pytest.fixture(scope="module")
def gguf_path():
    try:
        return ModelRegistry().get(NAME).resolve()
    except RagError as exc:  # names `ragpilot models pull nomic-embed-text-v1.5`
        pytest.skip(f"nomic not pulled: {exc}")


@pytest.fixture(scope="module")
def port(gguf_path):
    from rag.nomic_port import NomicPortEncoder

    return NomicPortEncoder(NAME, gguf_path, threads=1)


@pytest.fixture(scope="module")
def llama(gguf_path):
    if not llama_runtime.available():
        pytest.skip("llama-cpp-python not installed (optional: bash scripts/build_llama_cpp.sh)")
    return llama_runtime.LlamaCppEncoder(NAME, gguf_path, threads=1)


def test_port_tokenizes_like_llama_cpp(port, llama):
    for text, ids in zip(TEXTS, port.token_ids(TEXTS), strict=True):
        assert ids == llama.llm.tokenize(text.encode(), add_bos=True, special=False), text


def test_port_matches_llama_cpp_embeddings(port, llama):
    a, b = port.encode(TEXTS, batch_size=8), llama.encode(TEXTS)
    assert a.shape == b.shape == (len(TEXTS), 768) and a.dtype == np.float32
    np.testing.assert_allclose(np.linalg.norm(a, axis=1), 1.0, atol=1e-5)
    cos = (a * b).sum(1)
    assert cos.min() >= 0.9999, dict(zip(TEXTS, cos.round(6), strict=True))
    assert port.fingerprint == llama.fingerprint  # within tolerance: one cache entry


def test_vectors_do_not_depend_on_batch_mates(port):
    together = port.encode(TEXTS, batch_size=24)
    alone = np.concatenate([port.encode([t]) for t in TEXTS[:6] + TEXTS[9:11]])
    picked = together[list(range(6)) + [9, 10]]
    assert float((alone * picked).sum(1).min()) >= 0.99999


def test_registry_default_is_the_port_with_prefixes(gguf_path):
    from rag.encoders import Encoder, encode_documents, encode_queries
    from rag.nomic_port import NomicPortEncoder

    enc = Encoder.from_registry(NAME)
    assert isinstance(enc, NomicPortEncoder) and enc.dim == 768
    assert enc.query_prefix == "search_query: " and enc.document_prefix == "search_document: "
    assert enc.max_length == 2048  # the GGUF's trained context: no SciFact abstract is cut
    docs = encode_documents(enc, ["Paris is the capital of France.", "Statins lower LDL."])
    q = encode_queries(enc, ["Which city is the capital of France?"])[0]
    assert int(np.argmax(docs @ q)) == 0
