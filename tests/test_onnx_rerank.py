"""The fast cross-encoder (rag.onnx_rerank): a tiny randomly initialised BERT sequence-
classification model, saved with MiniLM's tokenizer and a train-reranker manifest, scored by
the torch reranker and by its ONNX twin. fp32 must reproduce torch's scores, int8 its ranking;
both thresholds are checked to reject a broken export (token types dropped, query and passage
swapped). The export is cached by weights fingerprint and reused, and a registry entry with
`options.runtime: onnx` selects it through make_reranker. Needs the `models` extra."""

from __future__ import annotations

import json
import sys

import numpy as np
import pytest

pytest.importorskip("onnxruntime", reason="the `models` extra (onnxruntime) is not installed")
pytest.importorskip("onnx", reason="the `models` extra (onnx) is not installed")

from rag.errors import ConfigError  # noqa: E402
from rag.models import ModelRegistry, ModelSpec  # noqa: E402
from rag.rerank import CrossEncoderReranker, make_reranker  # noqa: E402
from rag.types import Passage  # noqa: E402

pytestmark = pytest.mark.slow

MAX_LEN = 48  # from the manifest; several passages below are longer, so truncation matters
QUERY = "do statins lower cholesterol in adults?"
WORDS = ["statins", "lower", "cholesterol", "trial", "patients", "heart", "vitamin", "fracture",
         "risk", "cells", "gene", "expression", "mitochondria", "ATP", "donors", "weeks",
         "mortality", "benefit", "randomised", "adults"]


def _passages(n: int = 30) -> list[Passage]:
    rng = np.random.default_rng(0)
    return [Passage(id=f"p{i}", text=" ".join(rng.choice(WORDS, size=int(rng.integers(3, 60)))),
                    title="Trial" if i % 3 == 0 else "") for i in range(n)]


def _spearman(a, b) -> float:
    ra, rb = np.argsort(np.argsort(a)), np.argsort(np.argsort(b))
    return float(np.corrcoef(ra, rb)[0, 1])


@pytest.fixture(scope="module")
def cache(tmp_path_factory):
    with pytest.MonkeyPatch.context() as mp:
        d = tmp_path_factory.mktemp("onnx-cache")
        mp.setenv("RAGPILOT_CACHE", str(d))
        yield d


@pytest.fixture(scope="module")
def tiny_ce(tmp_path_factory):
    """2-layer random BERT, 1 logit; initializer_range 0.2 so scores spread (std ~0.1) instead
    of sitting within 1e-5 of each other as with BERT's default 0.02."""
    d = _tiny_bert(tmp_path_factory.mktemp("tiny-ce"), seed=0, layers=2, labels=1)
    (d / "manifest.json").write_text(json.dumps({"config": {"max_length": MAX_LEN}}))
    return d


def _tiny_bert(d, *, seed: int, layers: int, labels: int):
    """A random BERT sequence classifier with MiniLM's tokenizer saved in `d`."""
    import torch
    from transformers import AutoTokenizer, BertConfig, BertForSequenceClassification

    tok = AutoTokenizer.from_pretrained(str(ModelRegistry().get("minilm").resolve()))
    torch.manual_seed(seed)
    cfg = BertConfig(vocab_size=len(tok), hidden_size=32, num_hidden_layers=layers,
                     num_attention_heads=2, intermediate_size=64, num_labels=labels,
                     initializer_range=0.2)
    BertForSequenceClassification(cfg).save_pretrained(d)
    tok.save_pretrained(d)
    return d


@pytest.fixture(scope="module")
def torch_scores(tiny_ce):
    ref = CrossEncoderReranker(tiny_ce)
    assert ref.max_length == MAX_LEN
    return ref, ref.scores(QUERY, _passages())


def _broken(ref, passages, *, drop_types=False, swap=False) -> np.ndarray:
    """What a broken export would score: token types all 0, or passage before query."""
    import torch

    texts = [f"{p.title}. {p.text}" if p.title else p.text for p in passages]
    a, b = (texts, [QUERY] * len(texts)) if swap else ([QUERY] * len(texts), texts)
    batch = ref.tokenizer(a, b, truncation=True, max_length=ref.max_length, padding=True,
                          return_tensors="pt")
    if drop_types:
        batch["token_type_ids"] = torch.zeros_like(batch["token_type_ids"])
    with torch.inference_mode():
        return ref.model(**batch).logits[:, 0].numpy()


def _onnx(path, **kw):
    from rag.onnx_rerank import OnnxCrossEncoderReranker

    return OnnxCrossEncoderReranker(path, **kw)


def test_fp32_export_reproduces_torch_scores(cache, tiny_ce, torch_scores):
    ref, want = torch_scores
    fast = _onnx(tiny_ce, quantize=False, batch_size=7)
    assert fast.max_length == MAX_LEN and fast.onnx_file.name == "model.fused.onnx"
    assert fast.onnx_file.parent == cache / "onnx" / f"{fast.weights_fingerprint}-seqcls"
    got = fast.scores(QUERY, _passages())
    assert got.shape == want.shape and got.dtype == np.float32
    assert np.abs(got - want).max() < 1e-4, np.abs(got - want).max()
    # the tolerance is far below what a broken export would give
    for bad in (_broken(ref, _passages(), drop_types=True), _broken(ref, _passages(), swap=True)):
        assert np.abs(bad - want).max() > 1e-2
    # same ranking and order-independent scores (length buckets keep the caller's order)
    perm = np.random.default_rng(1).permutation(30)
    shuffled = fast.scores(QUERY, [_passages()[i] for i in perm])
    np.testing.assert_allclose(shuffled, got[perm], atol=1e-5)
    assert [h.id for h in fast.rerank(QUERY, _passages())] == \
        [h.id for h in ref.rerank(QUERY, _passages())]


def test_int8_keeps_the_torch_ranking(cache, tiny_ce, torch_scores):
    ref, want = torch_scores
    fast = _onnx(tiny_ce, quantize=True, threads=2)
    assert fast.onnx_file.name == "model.fused.int8.onnx"
    got = fast.scores(QUERY, _passages())
    rho = _spearman(got, want)
    assert rho >= 0.95, rho  # measured 0.985
    for bad in (_broken(ref, _passages(), drop_types=True), _broken(ref, _passages(), swap=True)):
        assert _spearman(bad, want) < 0.95
    # one pair per call: a pair's score does not depend on the other passages
    one = fast.scores(QUERY, _passages()[5:6])[0]
    assert one == pytest.approx(float(got[5]), abs=1e-6)
    assert fast.scores(QUERY, []).shape == (0,)


def test_second_open_reuses_the_cached_export(cache, tiny_ce, monkeypatch):
    import rag.onnx_rerank as mod

    first = _onnx(tiny_ce, quantize=True)

    def boom(*a, **k):
        raise AssertionError("re-exported although the cache holds the graph")

    monkeypatch.setattr(mod, "_export_seqcls", boom)
    again = _onnx(tiny_ce, quantize=True)
    assert again.onnx_file == first.onnx_file
    np.testing.assert_array_equal(again.scores(QUERY, _passages()[:4]),
                                  first.scores(QUERY, _passages()[:4]))


def _registry(path, **options) -> ModelRegistry:
    reg = ModelRegistry()
    reg.register(ModelSpec("ce", "cross_encoder", "hf", path=str(path)))
    reg.register(ModelSpec("ce-fast", "cross_encoder", "hf", path=str(path),
                           options={"runtime": "onnx", **options}))
    return reg


def test_make_reranker_selects_the_onnx_runtime_from_the_registry(cache, tiny_ce):
    from rag.onnx_rerank import OnnxCrossEncoderReranker

    assert type(make_reranker("cross_encoder", "ce", registry=_registry(tiny_ce))) \
        is CrossEncoderReranker
    fast = make_reranker("cross_encoder", "ce-fast", registry=_registry(tiny_ce, threads=2))
    assert isinstance(fast, OnnxCrossEncoderReranker) and fast.quantized and fast.threads == 2
    exact = make_reranker("cross_encoder", "ce-fast", registry=_registry(tiny_ce,
                                                                         quantize="fp32"))
    assert not exact.quantized and exact.max_length == MAX_LEN
    # a directory given directly stays on torch (no options to read)
    assert type(make_reranker("cross_encoder", str(tiny_ce))) is CrossEncoderReranker


@pytest.mark.parametrize("options, device, field", [
    ({"quantize": "int4"}, "cpu", "models.ce-fast.options.quantize"),
    ({"threads": 0}, "cpu", "models.ce-fast.options.threads"),
    ({}, "cuda", "device"),
])
def test_bad_onnx_options_are_typed_errors(tiny_ce, options, device, field):
    with pytest.raises(ConfigError) as err:
        make_reranker("cross_encoder", "ce-fast", device=device,
                      registry=_registry(tiny_ce, **options))
    assert err.value.field == field


def test_unknown_runtime_and_missing_onnxruntime_are_typed_errors(tiny_ce, monkeypatch):
    reg = ModelRegistry()
    reg.register(ModelSpec("ce-x", "cross_encoder", "hf", path=str(tiny_ce),
                           options={"runtime": "tensorrt"}))
    with pytest.raises(ConfigError, match="torch or onnx"):
        make_reranker("cross_encoder", "ce-x", registry=reg)
    monkeypatch.setitem(sys.modules, "onnxruntime", None)  # import now fails
    with pytest.raises(ConfigError, match=r"pip install 'ragpilot\[models\]'"):
        make_reranker("cross_encoder", "ce-fast", registry=_registry(tiny_ce))


def test_two_label_head_scores_its_last_logit(cache, tmp_path):
    """A 2-label classifier (e.g. fine-tuned with cross-entropy): both runtimes read logit 1."""
    _tiny_bert(tmp_path, seed=1, layers=1, labels=2)
    want = CrossEncoderReranker(tmp_path).scores(QUERY, _passages(8))
    got = _onnx(tmp_path, quantize=False).scores(QUERY, _passages(8))
    assert np.abs(got - want).max() < 1e-4
