"""A fast bi-encoder: a sentence-transformers BERT model (mean pooling) on ONNX Runtime, int8.

The transformer is exported once from the local weights (`torch.onnx.export`, no download) into
`<cache>/onnx/<weights fingerprint>/model.onnx`, dynamically quantised to int8
(`onnxruntime.quantization.quantize_dynamic`, weights only; activations stay fp32) as
`model.int8.onnx`; both are guarded by a file lock and written atomically. Encoding tokenises
with the model's own `tokenizer.json` (HF `tokenizers`, no torch), sorts texts by token length
and batches neighbours together (length buckets: little padding), then mean-pools over the
attention mask and L2-normalises, exactly as sentence-transformers' Transformer -> Pooling(mean)
-> Normalize pipeline does.

Dynamic int8 quantises activations with one scale per MatMul input tensor, i.e. per batch: in
a padded batch a text's vector moved with its batch-mates (cosine down to 0.974 to the same
text alone). So the int8 encoder runs one text per call (no padding, a scale fitted to that
text: vectors independent of batching, as a cache keyed by text needs); fp32 ONNX uses the
length buckets (`batch_size` texts of similar length per call, rag.batching).

Measured on 200 SciFact abstracts (CPU time, one thread, one text per call): int8 36 ms and
fp32 59 ms per abstract (~190 / ~300 CPU s for SciFact's 5,183). Static int8 (per-tensor
activation scales calibrated on 130 abstracts: batch-independent) lost too much (cosine 0.94
to fp32), ORT's fused BERT graph and torch bf16 autocast (59 and 78 ms) saved nothing, so
none is used. On SciFact the int8 build costs ~333 CPU s, about what fp32 sentence-transformers
costs with its padded batches (bench/results/models.md).

Needs the optional `models` extra (onnxruntime, onnx); without it `OnnxEncoder` raises
ConfigError naming the extra. Quality versus fp32 sentence-transformers is checked in
tests/test_fast_encoder.py (cosine of embeddings) and bench/models.py (SciFact nDCG@10).
"""

from __future__ import annotations

import fcntl
import json
import os
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from rag.batching import l2_normalize, length_buckets, mean_pool, pad_batch
from rag.errors import ConfigError
from rag.models import cache_dir

THREADS_ENV = "RAGPILOT_ENCODER_THREADS"


def _require_onnx():
    try:
        import onnxruntime  # noqa: F401
    except ImportError:
        raise ConfigError("encoder", "the ONNX encoder needs onnxruntime and onnx: "
                                     "pip install 'ragpilot[models]'") from None


def export_onnx(model_dir: Path, out_dir: Path, quantize: bool = True) -> Path:
    """Export the transformer in `model_dir` to `out_dir/model.onnx` (inputs input_ids,
    attention_mask, token_type_ids: int64 [batch, seq]; output last_hidden_state float32
    [batch, seq, dim]) and, when `quantize`, `out_dir/model.int8.onnx`. Returns the file to
    load. Idempotent; safe under concurrent callers."""
    want = out_dir / ("model.int8.onnx" if quantize else "model.onnx")
    if want.exists():
        return want
    out_dir.mkdir(parents=True, exist_ok=True)
    with (out_dir / ".lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        fp32 = out_dir / "model.onnx"
        if not fp32.exists():
            _export_fp32(model_dir, fp32)
        if quantize and not want.exists():
            from onnxruntime.quantization import QuantType, quantize_dynamic

            tmp = want.with_name("tmp." + want.name)
            # per-channel int8 MatMul weights only: mean cosine 0.995 to fp32 on SciFact
            # abstracts (per-tensor over all ops: 0.937), and the fastest variant tried.
            quantize_dynamic(str(fp32), str(tmp), weight_type=QuantType.QInt8, per_channel=True,
                             op_types_to_quantize=["MatMul"])
            tmp.replace(want)
    return want


def _export_fp32(model_dir: Path, out: Path) -> None:
    import torch
    from transformers import AutoModel

    class _Hidden(torch.nn.Module):  # keyword call: the forward's positional order varies
        def __init__(self, inner):
            super().__init__()
            self.inner = inner

        def forward(self, input_ids, attention_mask, token_type_ids):
            return self.inner(input_ids=input_ids, attention_mask=attention_mask,
                              token_type_ids=token_type_ids).last_hidden_state

    model = _Hidden(AutoModel.from_pretrained(str(model_dir))).eval()
    ids = torch.ones((2, 8), dtype=torch.long)
    tmp = out.with_name("tmp." + out.name)
    axes = {0: "batch", 1: "seq"}
    with torch.inference_mode():
        torch.onnx.export(
            model, (ids, ids.clone(), torch.zeros_like(ids)), str(tmp),
            input_names=["input_ids", "attention_mask", "token_type_ids"],
            output_names=["last_hidden_state"],
            dynamic_axes={"input_ids": axes, "attention_mask": axes, "token_type_ids": axes,
                          "last_hidden_state": axes},
            opset_version=17, dynamo=False)
    tmp.replace(out)


class OnnxEncoder:
    """Same contract as `rag.encoders.Encoder`: `encode(texts) -> (n, dim)` float32 unit rows;
    `fingerprint` names the weights AND the runtime/precision, so dense indexes built with it
    never mix with fp32 ones.

    `threads`: ONNX Runtime intra-op threads (default $RAGPILOT_ENCODER_THREADS or 1: more
    only helps on an idle machine). `quantize`: int8 weights (default) or fp32.
    """

    def __init__(self, name: str, path: Path, weights_fingerprint: str, quantize: bool = True,
                 threads: int | None = None, max_length: int | None = None):
        _require_onnx()
        import onnxruntime as ort
        from tokenizers import Tokenizer

        self.name, self.path = name, Path(path)
        self.device = "cpu"
        tag = "int8" if quantize else "fp32"
        out = cache_dir() / "onnx" / weights_fingerprint  # per weights, whatever the name
        onnx_file = export_onnx(self.path, out, quantize=quantize)
        self.threads = int(threads or os.environ.get(THREADS_ENV, 1))
        opts = ort.SessionOptions()
        opts.intra_op_num_threads = self.threads
        opts.inter_op_num_threads = 1
        opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
        self.session = ort.InferenceSession(str(onnx_file), opts,
                                            providers=["CPUExecutionProvider"])
        self._inputs = {i.name for i in self.session.get_inputs()}
        cfg = json.loads((self.path / "sentence_bert_config.json").read_text()) \
            if (self.path / "sentence_bert_config.json").exists() else {}
        self.max_length = int(max_length or cfg.get("max_seq_length", 256))
        self.tokenizer = Tokenizer.from_file(str(self.path / "tokenizer.json"))
        self.tokenizer.no_padding()
        self.tokenizer.enable_truncation(self.max_length)
        self.dim = int(json.loads((self.path / "config.json").read_text())["hidden_size"])
        self.quantized = quantize
        self.fingerprint = f"{weights_fingerprint}-onnx-{tag}"
        self.query_prefix = self.document_prefix = ""
        self.calls = 0

    def encode(self, texts: Sequence[str], batch_size: int = 16, show_progress: bool = False,
               normalize: bool = True) -> np.ndarray:
        """(n, dim) float32, rows unit length when `normalize`; order follows `texts`."""
        texts = list(texts)
        self.calls += len(texts)
        out = np.zeros((len(texts), self.dim), dtype=np.float32)
        if not texts:
            return out
        ids = [e.ids for e in self.tokenizer.encode_batch(texts)]
        if self.quantized:
            batch_size = 1  # per-text activation scale: see the module docstring
        batches = length_buckets([len(x) for x in ids], batch_size)
        bar = None
        if show_progress:
            from tqdm import tqdm

            bar = tqdm(total=len(texts), desc=f"encode {self.name}", unit="text",
                       mininterval=5.0)  # one text per step with int8: keep logs short

        for rows in batches:
            tok, mask = pad_batch([ids[i] for i in rows])
            feed = {"input_ids": tok, "attention_mask": mask}
            if "token_type_ids" in self._inputs:
                feed["token_type_ids"] = np.zeros_like(tok)
            out[rows] = mean_pool(self.session.run(["last_hidden_state"], feed)[0], mask)
            if bar:
                bar.update(len(rows))
        if bar:
            bar.close()
        if normalize:
            out = l2_normalize(out)
        return np.ascontiguousarray(out, dtype=np.float32)

    def encode_queries(self, texts: Sequence[str], **kw) -> np.ndarray:
        return self.encode([self.query_prefix + t for t in texts], **kw)

    def encode_documents(self, texts: Sequence[str], **kw) -> np.ndarray:
        return self.encode([self.document_prefix + t for t in texts], **kw)
