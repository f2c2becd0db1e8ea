"""A fast cross-encoder reranker: a local HF sequence-classification model on ONNX Runtime.

The twin of `rag.rerank.CrossEncoderReranker` (same weights, tokenisation, truncation and score)
built the way `rag.onnx_encoder` builds the fast bi-encoder: exported once per weights into
`<cache>/onnx/<weights fingerprint>-seqcls/` (file lock, atomic writes), fused by ONNX Runtime's
BERT optimizer, and dynamically quantised to int8 (7-bit per-channel weights). The exported
graph takes input_ids, attention_mask, token_type_ids (int64 [batch, seq]) and returns `score`
(float32 [batch]): the classifier's last logit, exactly the column CrossEncoderReranker reads.

Selection: a registry entry with `kind: cross_encoder` and `options: {runtime: onnx}` (optional
`quantize: int8 | fp32`, default int8, and `threads`), as `minilm-fast` does for the bi-encoder;
`rerank: cross_encoder, reranker_model: <that name>` then gives this reranker (rag.rerank
.make_reranker). No RAGConfig field changes, so config hashes stay what they were.

Pairs are tokenised with the model's `tokenizer.json` (HF `tokenizers`, longest-first truncation
to `max_length` as `transformers` does with `truncation=True`); `max_length` comes from the
`ragpilot train-reranker` manifest when there is one, else 256, as in CrossEncoderReranker.
fp32 runs length-bucketed padded batches (rag.batching); int8 runs one pair per call, because
dynamic quantisation fits activation scales per call and a padded batch would move a pair's
score with its batch-mates (see rag.onnx_encoder). `threads` worker threads each run whole
batches on one shared 1-thread session (ORT's own pool spins on a shared machine).

Checked against the torch reranker in tests/test_onnx_rerank.py (fp32 scores to 1e-4, int8
rank correlation).
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from rag.batching import length_buckets, pad_batch, run_longest_first
from rag.errors import ConfigError
from rag.models import cache_dir
from rag.rerank_base import Reranker, trained_max_length
from rag.types import Passage

EXTRA_HINT = "pip install 'ragpilot[models]'"


def _require_onnx() -> None:
    try:
        import onnx  # noqa: F401
        import onnxruntime  # noqa: F401
    except ImportError:
        raise ConfigError("reranker_model", "the ONNX cross-encoder needs onnxruntime and onnx: "
                                            f"{EXTRA_HINT}") from None


def _export_seqcls(model_dir: Path, out: Path) -> None:
    """torch.onnx.export of the sequence-classification model -> `score` [batch]."""
    import torch
    from transformers import AutoModelForSequenceClassification

    class _Score(torch.nn.Module):  # keyword call: the forward's positional order varies
        def __init__(self, inner):
            super().__init__()
            self.inner = inner
            # CrossEncoderReranker reads the last logit (the only one with 1 label); a positive
            # index, since the exporter warns that negative advanced indices can go wrong
            self.col = int(inner.config.num_labels) - 1

        def forward(self, input_ids, attention_mask, token_type_ids):
            logits = self.inner(input_ids=input_ids, attention_mask=attention_mask,
                                token_type_ids=token_type_ids).logits
            return logits[:, self.col]

    inner = AutoModelForSequenceClassification.from_pretrained(str(model_dir),
                                                               attn_implementation="eager")
    model = _Score(inner).eval()
    ids = torch.ones((2, 8), dtype=torch.long)
    types = torch.zeros_like(ids)
    types[:, 4:] = 1
    tmp = out.with_name("tmp." + out.name)
    axes = {0: "batch", 1: "seq"}
    with torch.inference_mode():
        torch.onnx.export(
            model, (ids, ids.clone(), types), str(tmp),
            input_names=["input_ids", "attention_mask", "token_type_ids"],
            output_names=["score"],
            dynamic_axes={"input_ids": axes, "attention_mask": axes, "token_type_ids": axes,
                          "score": {0: "batch"}},
            opset_version=17, dynamo=False)
    tmp.replace(out)


class OnnxCrossEncoderReranker(Reranker):
    """`scores(query, passages)` as CrossEncoderReranker computes them, on ONNX Runtime.

    `quantize`: int8 (default) or fp32. `threads`: worker threads (default
    $RAGPILOT_ENCODER_THREADS or 1). `batch_size`: pairs per fp32 call. `max_length`: query +
    passage tokens (default: the trained manifest's, else 256)."""

    name = "cross_encoder"

    def __init__(self, path: str | Path, quantize: bool = True, threads: int | None = None,
                 batch_size: int = 16, max_length: int | None = None):
        _require_onnx()
        from tokenizers import Tokenizer

        from rag.encoders import _fingerprint
        from rag.onnx_encoder import THREADS_ENV, _session, export_onnx

        p = Path(path)
        if not (p / "config.json").exists():
            raise ConfigError("reranker_model", f"{p} is not a model directory (config.json "
                                                "missing)")
        if not (p / "tokenizer.json").exists():
            raise ConfigError("reranker_model", f"{p} has no tokenizer.json (the ONNX reranker "
                                                "needs a fast tokenizer saved with the model)")
        self.path, self.quantized = p, bool(quantize)
        self.weights_fingerprint = _fingerprint(p)
        out = cache_dir() / "onnx" / f"{self.weights_fingerprint}-seqcls"
        self.onnx_file = export_onnx(p, out, quantize=self.quantized, export_raw=_export_seqcls)
        self.session = _session(self.onnx_file)
        self._inputs = {i.name for i in self.session.get_inputs()}
        self.threads = max(1, int(threads or os.environ.get(THREADS_ENV, 1)))
        self.batch_size = max(1, int(batch_size))
        self.max_length = int(max_length or trained_max_length(p) or 256)
        self.tokenizer = Tokenizer.from_file(str(p / "tokenizer.json"))
        self.tokenizer.no_padding()
        self.tokenizer.enable_truncation(self.max_length, strategy="longest_first")
        self.calls = 0  # pairs scored so far

    def _run(self, ids: list[list[int]], types: list[list[int]]) -> np.ndarray:
        tok, mask = pad_batch(ids)
        feed = {"input_ids": tok, "attention_mask": mask}
        if "token_type_ids" in self._inputs:  # an unused input is pruned from the graph
            feed["token_type_ids"] = pad_batch(types)[0]
        return self.session.run(["score"], feed)[0].reshape(-1)

    def scores(self, query: str, passages: Sequence[Passage]) -> np.ndarray:
        texts = [f"{p.title}. {p.text}" if p.title else p.text for p in passages]
        out = np.zeros(len(texts), dtype=np.float32)
        if not texts:
            return out
        self.calls += len(texts)
        enc = self.tokenizer.encode_batch([(query, t) for t in texts])
        ids, types = [e.ids for e in enc], [e.type_ids for e in enc]
        batches = length_buckets([len(x) for x in ids], 1 if self.quantized else self.batch_size)

        def run(rows: np.ndarray) -> None:
            out[rows] = self._run([ids[i] for i in rows], [types[i] for i in rows])

        run_longest_first(batches, run, self.threads, "onnx-rerank")
        return out


def _check_options(name: str, options: dict) -> tuple[bool, int | None]:
    """(quantize, threads) from a registry entry's options; typed errors name the key."""
    q = options.get("quantize", "int8")
    if q not in ("int8", "fp32"):
        raise ConfigError(f"models.{name}.options.quantize", f"must be int8 or fp32, got {q!r}")
    threads = options.get("threads")
    if threads is not None and (not isinstance(threads, int) or threads < 1):
        raise ConfigError(f"models.{name}.options.threads",
                          f"must be a positive integer, got {threads!r}")
    return q == "int8", threads


def from_spec(name: str, path: Path, options: dict, device: str = "cpu"
              ) -> OnnxCrossEncoderReranker:
    """The reranker for a registry entry with `options.runtime: onnx` (cpu only)."""
    if device != "cpu":
        raise ConfigError("device", f"{name}: the ONNX cross-encoder runs on cpu only; "
                                    "register the same path without `runtime: onnx` for a GPU")
    quantize, threads = _check_options(name, options)
    return OnnxCrossEncoderReranker(path, quantize=quantize, threads=threads)
