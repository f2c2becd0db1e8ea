"""The fast MiniLM (rag.onnx_encoder, registry name "minilm-fast"): the packaged weights
exported once to ONNX and quantised to int8 must stay close to the sentence-transformers fp32
embeddings, keep the caller's order through length-bucketed batching, and never share a
fingerprint (hence cached embeddings or indexes) with the fp32 encoder. Needs the optional
`models` extra (onnxruntime, onnx); skips without it."""

from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("onnxruntime", reason="the `models` extra (onnxruntime) is not installed")
pytest.importorskip("onnx", reason="the `models` extra (onnx) is not installed")

from rag.encoders import Encoder, _fingerprint  # noqa: E402
from rag.models import ModelRegistry  # noqa: E402
from rag.onnx_encoder import OnnxEncoder  # noqa: E402

pytestmark = pytest.mark.slow

TEXTS = [
    "Paris is the capital and largest city of France.",
    "short",
    "Statins lower LDL cholesterol in adults with heart disease.",
    "The mitochondrion produces ATP through oxidative phosphorylation in eukaryotic cells. " * 6,
    "Vitamin D supplementation did not reduce fracture risk in older adults in this trial.",
    "Rome is the capital city of Italy, founded on seven hills.",
    "A randomised controlled trial of 1,200 patients found no mortality benefit. " * 12,
    "What lowers cholesterol?",
    "dogs running in the park at dawn",
    "Gene expression in T cells changes after antigen exposure, as single-cell RNA sequencing "
    "of 40,000 cells across six donors shows; the effect persists for weeks.",
]


@pytest.fixture(scope="module")
def fp32():
    return Encoder.from_registry("minilm")


@pytest.fixture(scope="module")
def fast():
    return Encoder.from_registry("minilm-fast")


def test_registry_gives_the_onnx_int8_encoder(fast, fp32):
    assert isinstance(fast, OnnxEncoder) and fast.dim == fp32.dim == 384
    assert fast.fingerprint != fp32.fingerprint and fast.fingerprint.endswith("onnx-int8v2")
    assert fast.onnx_file.name == "model.fused.int8.onnx"
    assert fast.threads >= 1


def test_int8_embeddings_stay_close_to_fp32(fast, fp32):
    a, b = fast.encode(TEXTS), fp32.encode(TEXTS)
    assert a.shape == b.shape == (len(TEXTS), 384) and a.dtype == np.float32
    np.testing.assert_allclose(np.linalg.norm(a, axis=1), 1.0, atol=1e-5)
    cos = (a * b).sum(1)
    assert cos.min() >= 0.98 and cos.mean() >= 0.99, cos
    # rankings agree: each text's nearest other text is the same under both
    sa, sb = a @ a.T, b @ b.T
    np.fill_diagonal(sa, -1)
    np.fill_diagonal(sb, -1)
    assert (sa.argmax(1) == sb.argmax(1)).mean() >= 0.9


def test_fp32_onnx_reproduces_sentence_transformers(fp32):
    path = ModelRegistry().get("minilm").resolve()
    enc = OnnxEncoder("minilm", path, _fingerprint(path), quantize=False)
    cos = (enc.encode(TEXTS) * fp32.encode(TEXTS)).sum(1)
    assert cos.min() >= 0.9999  # same pooling, truncation and normalisation


def test_length_buckets_keep_the_callers_order(fast):
    path = ModelRegistry().get("minilm").resolve()
    exact = OnnxEncoder("minilm", path, _fingerprint(path), quantize=False)
    perm = np.random.default_rng(0).permutation(len(TEXTS))
    whole = exact.encode(TEXTS, batch_size=3)
    shuffled = exact.encode([TEXTS[i] for i in perm], batch_size=4)
    np.testing.assert_allclose(shuffled, whole[perm], atol=1e-5)
    one = exact.encode([TEXTS[3]])[0]
    np.testing.assert_allclose(one, whole[3], atol=1e-5)  # padding never leaks into the mean
    # int8 runs text by text (per-text activation scale): batching never moves a vector
    q_whole = fast.encode(TEXTS, batch_size=3)
    q_shuffled = fast.encode([TEXTS[i] for i in perm], batch_size=4)
    np.testing.assert_allclose(q_shuffled, q_whole[perm], atol=1e-6)
    np.testing.assert_allclose(fast.encode([TEXTS[3]])[0], q_whole[3], atol=1e-6)
    assert fast.encode([]).shape == (0, 384)


def test_threads_are_worker_threads_and_do_not_change_vectors(monkeypatch, fast):
    monkeypatch.setenv("RAGPILOT_ENCODER_THREADS", "2")
    path = ModelRegistry().get("minilm").resolve()
    enc = OnnxEncoder("minilm", path, _fingerprint(path))  # export cached: loads in < 1 s
    assert enc.threads == 2
    # parallel over texts, each on a 1-thread session that never spins (shared 2 cores)
    opts = enc.session.get_session_options()
    assert opts.intra_op_num_threads == 1
    assert opts.get_session_config_entry("session.intra_op.allow_spinning") == "0"
    np.testing.assert_array_equal(enc.encode(TEXTS), fast.encode(TEXTS))


def test_query_runtime_onnx_gives_torchs_vectors_for_small_calls(fp32, monkeypatch):
    """set_query_runtime("onnx") (what serving sets): calls of <= SMALL_CALL texts run on the
    fp32 ONNX twin (same vectors: the index built by torch stays valid), bulk calls on torch;
    $RAGPILOT_QUERY_RUNTIME=torch keeps torch."""
    from rag import encoders

    monkeypatch.delenv(encoders.QUERY_RUNTIME_ENV, raising=False)
    try:
        torch_vecs = fp32.encode(TEXTS[:4])
        assert encoders.set_query_runtime("onnx") == "onnx"
        calls = fp32.calls
        fast_vecs = fp32.encode(TEXTS[:4])
        assert fp32.calls == calls + 4  # still counted (tests prove caches by it)
        twin = fp32._small["onnx"]
        assert isinstance(twin, OnnxEncoder) and not twin.quantized
        assert twin.calls == 4
        assert (fast_vecs * torch_vecs).sum(1).min() >= 0.99999
        fp32.encode(TEXTS)  # 10 texts > SMALL_CALL: torch
        assert twin.calls == 4
        monkeypatch.setenv(encoders.QUERY_RUNTIME_ENV, "torch")
        assert encoders.set_query_runtime("onnx") == "torch"
        fp32.encode(TEXTS[:2])
        assert twin.calls == 4
    finally:
        monkeypatch.delenv(encoders.QUERY_RUNTIME_ENV, raising=False)
        encoders.set_query_runtime("torch")
