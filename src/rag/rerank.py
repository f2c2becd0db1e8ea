"""Rerankers behind one interface: rescore (query, passages) and return hits best first.

- `none`: no reranking (the pipeline skips the stage; `NoRerank` keeps the given order).
- `cosine`: bi-encoder cosine between query and passage (reuses stored passage vectors when a
  lookup is given, so only the query is encoded).
- `cross_encoder`: a sequence-classification model from a LOCAL directory (no cross-encoder ships
  on PyPI: train one with the model-adaptation tools, register it in configs/rag/models.yaml).
  A registry entry with `options: {runtime: onnx}` runs the same model on ONNX Runtime, int8 by
  default (rag.onnx_rerank, the `models` extra).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path

import numpy as np

from rag.encoders import encode_documents, encode_queries
from rag.errors import ConfigError
from rag.models import ModelRegistry, default_registry
from rag.rerank_base import Reranker, trained_max_length
from rag.types import Passage

__all__ = ["Reranker", "NoRerank", "CosineReranker", "CrossEncoderReranker", "make_reranker"]


class NoRerank(Reranker):
    """Keeps the incoming order (scores decrease with position)."""

    name = "none"

    def scores(self, query: str, passages: Sequence[Passage]) -> np.ndarray:
        return -np.arange(len(passages), dtype=np.float64)


class CosineReranker(Reranker):
    name = "cosine"

    def __init__(self, encoder, passage_vectors: Callable[[list[str]], np.ndarray] | None = None):
        self.encoder = encoder
        self.passage_vectors = passage_vectors

    def scores(self, query: str, passages: Sequence[Passage]) -> np.ndarray:
        q = encode_queries(self.encoder, [query])[0]
        if self.passage_vectors is not None:
            vecs = self.passage_vectors([p.id for p in passages])
        else:
            vecs = encode_documents(self.encoder, [f"{p.title}. {p.text}" if p.title else p.text
                                                   for p in passages])
        return vecs @ q


class CrossEncoderReranker(Reranker):
    """A local (query, passage) -> relevance logit model, batched.

    `max_length` (query + passage tokens) defaults to the length the model was trained with when
    its directory has a `manifest.json` from `ragpilot train-reranker` (`config.max_length`),
    else 256: serving must cut inputs where training did."""

    name = "cross_encoder"

    def __init__(self, path: str | Path, device: str = "cpu", batch_size: int = 32,
                 max_length: int | None = None):
        import torch
        from transformers import AutoModelForSequenceClassification, AutoTokenizer

        p = Path(path)
        if not (p / "config.json").exists():
            raise ConfigError("reranker_model", f"{p} is not a model directory (config.json "
                                                "missing)")
        self.tokenizer = AutoTokenizer.from_pretrained(str(p))
        self.model = AutoModelForSequenceClassification.from_pretrained(str(p)).to(device).eval()
        if max_length is None:
            max_length = trained_max_length(p) or 256
        self.device, self.batch_size, self.max_length = device, batch_size, max_length
        self._torch = torch

    def scores(self, query: str, passages: Sequence[Passage]) -> np.ndarray:
        texts = [f"{p.title}. {p.text}" if p.title else p.text for p in passages]
        out = []
        with self._torch.inference_mode():
            for i in range(0, len(texts), self.batch_size):
                batch = self.tokenizer([query] * len(texts[i:i + self.batch_size]),
                                       texts[i:i + self.batch_size], truncation=True,
                                       max_length=self.max_length, padding=True,
                                       return_tensors="pt").to(self.device)
                logits = self.model(**batch).logits
                out.append((logits[:, -1] if logits.shape[-1] > 1 else logits[:, 0]).float()
                           .cpu().numpy())
        return np.concatenate(out)


def make_reranker(kind: str, model: str = "minilm", device: str = "cpu",
                  registry: ModelRegistry | None = None,
                  passage_vectors: Callable[[list[str]], np.ndarray] | None = None) -> Reranker:
    """kind: none | cosine | cross_encoder; model: a registry name or a local directory (a
    cross_encoder entry with `options.runtime: onnx` runs on rag.onnx_rerank)."""
    reg = registry or default_registry()
    if kind == "none":
        return NoRerank()
    if kind == "cosine":
        from rag.encoders import Encoder

        return CosineReranker(Encoder.from_registry(model, device=device, registry=reg),
                              passage_vectors)
    if kind == "cross_encoder":
        path = Path(model).expanduser()
        if not path.exists():
            spec = reg.get(model)
            if spec.kind != "cross_encoder":
                raise ConfigError("reranker_model", f"{model!r} is a {spec.kind}, not a "
                                                    "cross_encoder; train one or give a path")
            path = spec.resolve()
            runtime = spec.options.get("runtime", "torch")
            if runtime == "onnx":
                from rag.onnx_rerank import from_spec

                return from_spec(spec.name, path, spec.options, device=device)
            if runtime != "torch":
                raise ConfigError(f"models.{spec.name}.options.runtime",
                                  f"must be torch or onnx for a cross_encoder, got {runtime!r}")
        return CrossEncoderReranker(path, device=device)
    raise ConfigError("rerank", f"unknown reranker {kind!r} (none | cosine | cross_encoder)")
