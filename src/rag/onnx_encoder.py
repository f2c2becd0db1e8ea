"""A fast bi-encoder: a sentence-transformers BERT model (mean pooling) on ONNX Runtime.

Export (once per weights, `<cache>/onnx/<weights fingerprint>/`, under a file lock, written
atomically): `torch.onnx.export` of the local weights with eager attention (no download), then
ONNX Runtime's BERT fusion (`onnxruntime.transformers.optimizer`: one `Attention` op per layer
with the Q/K/V projections in one GEMM, `SkipLayerNormalization`, `BiasGelu`,
`EmbedLayerNormalization`) -> `model.fused.onnx` (fp32, cosine 1.0000 to sentence-transformers);
then dynamic int8 (`quantize_dynamic`: weights int8 per output channel, 7-bit range, activations
quantised per call) of every MatMul and Attention -> `model.fused.int8.onnx`.

Runtime choices (the measurements behind them: docs/design-notes.md): 7-bit int8 weights
(`reduce_range`, no saturation on CPUs without VNNI), per-channel weight scales, and `threads`
= worker threads each running whole texts on one shared 1-thread session (ORT's intra-op pool
spins while it waits).

Encoding tokenises with the model's own `tokenizer.json` (HF `tokenizers`, no torch). int8
runs one text per call: dynamic quantisation fits activation scales per call, so in a padded
batch a text's vector would move with its batch-mates (cosine down to 0.974 to the same text
alone); per text there is no padding either, and vectors do not depend on batching (as a cache
keyed by text needs). fp32 sorts texts by token length and batches neighbours (rag.batching:
little padding). Both mean-pool over the attention mask and L2-normalise, exactly as
sentence-transformers' Transformer -> Pooling(mean) -> Normalize does.

`OnnxEncoder(..., quantize=False)` is also `rag.encoders.Encoder`'s twin for small (query-time)
calls when serving asks for it (rag.encoders.set_query_runtime): same vectors as torch, without
torch's per-module overhead.

Needs onnxruntime and onnx; without them `OnnxEncoder` raises ConfigError naming the packages.
Quality versus fp32 sentence-transformers is checked in tests/test_fast_encoder.py (cosine of
embeddings).
"""

from __future__ import annotations

import fcntl
import json
import logging
import os
from collections.abc import Callable, Sequence
from pathlib import Path

import numpy as np

from rag.batching import l2_normalize, length_buckets, mean_pool, pad_batch, run_longest_first
from rag.errors import ConfigError
from rag.models import cache_dir

THREADS_ENV = "RAGPILOT_ENCODER_THREADS"
FP32_FILE, INT8_FILE = "model.fused.onnx", "model.fused.int8.onnx"
"""Export file names (v2: eager-attention export + BERT fusion; `model.onnx` and
`model.int8.onnx` of the first version are left alone and never loaded)."""
_RAW_FILE = "model.eager.onnx"
log = logging.getLogger(__name__)


def _require_onnx():
    try:
        import onnxruntime  # noqa: F401
    except ImportError:
        raise ConfigError("encoder", "the ONNX encoder needs onnxruntime and onnx: "
                                     "pip install onnxruntime onnx") from None


def export_onnx(model_dir: Path, out_dir: Path, quantize: bool = True,
                export_raw: Callable[[Path, Path], None] | None = None) -> Path:
    """Export the transformer in `model_dir` to `out_dir/model.fused.onnx` (inputs input_ids,
    attention_mask, token_type_ids: int64 [batch, seq]; output last_hidden_state float32
    [batch, seq, dim]) and, when `quantize`, `out_dir/model.fused.int8.onnx`. Returns the file
    to load. Idempotent; safe under concurrent callers (threads and processes).

    `export_raw(model_dir, out_file)` writes the unfused graph (default: the bi-encoder's
    hidden states; rag.onnx_rerank passes a sequence-classification head's logit)."""
    want = out_dir / (INT8_FILE if quantize else FP32_FILE)
    if want.exists():
        return want
    out_dir.mkdir(parents=True, exist_ok=True)
    with (out_dir / ".lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        fp32 = out_dir / FP32_FILE
        if not fp32.exists():
            raw = out_dir / _RAW_FILE
            if not raw.exists():
                (export_raw or _export_fp32)(model_dir, raw)
            _fuse(raw, fp32, json.loads((model_dir / "config.json").read_text()))
        if quantize and not want.exists():
            import onnx
            from onnxruntime.quantization import QuantType, quantize_dynamic

            tmp = want.with_name("tmp." + want.name)
            quantize_dynamic(str(fp32), str(tmp), weight_type=QuantType.QInt8, per_channel=True,
                             reduce_range=True, op_types_to_quantize=["MatMul", "Attention"],
                             extra_options={"DefaultTensorType": onnx.TensorProto.FLOAT})
            tmp.replace(want)
    return want


def _fuse(raw: Path, out: Path, config: dict) -> None:
    """ORT's BERT graph fusion of `raw` into `out` (falls back to a copy of the unfused graph,
    logged, when the fusion does not apply: same numbers, only slower)."""
    import shutil

    tmp = out.with_name("tmp." + out.name)
    try:
        from onnxruntime.transformers import optimizer

        model = optimizer.optimize_model(str(raw), model_type="bert",
                                         num_heads=int(config["num_attention_heads"]),
                                         hidden_size=int(config["hidden_size"]), opt_level=1)
        if not model.get_fused_operator_statistics().get("Attention"):
            raise ValueError("no Attention op fused")
        model.save_model_to_file(str(tmp))
    except Exception as exc:  # noqa: BLE001 - the unfused graph computes the same vectors
        log.warning("ONNX BERT fusion not applied (%s: %s); using the unfused graph",
                    type(exc).__name__, exc)
        shutil.copyfile(raw, tmp)
    tmp.replace(out)


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

    # eager attention: the SDPA export wraps the mask in IsNaN/Where nodes that block fusion
    inner = AutoModel.from_pretrained(str(model_dir), attn_implementation="eager")
    model = _Hidden(inner).eval()
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


def _session(onnx_file: Path):
    """A 1-thread CPU session (callers parallelise over texts, see the module docstring)."""
    import onnxruntime as ort

    opts = ort.SessionOptions()
    opts.intra_op_num_threads = 1
    opts.inter_op_num_threads = 1
    opts.add_session_config_entry("session.intra_op.allow_spinning", "0")
    opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    return ort.InferenceSession(str(onnx_file), opts, providers=["CPUExecutionProvider"])


class OnnxEncoder:
    """Same contract as `rag.encoders.Encoder`: `encode(texts) -> (n, dim)` float32 unit rows;
    `fingerprint` names the weights AND the runtime/precision, so dense indexes built with it
    never mix with fp32 ones.

    `threads`: worker threads, each encoding whole texts (default $RAGPILOT_ENCODER_THREADS
    or 1). `quantize`: int8 (default) or fp32. `max_length`: tokens per text (default the
    model's `max_seq_length`, 256 for MiniLM).
    """

    def __init__(self, name: str, path: Path, weights_fingerprint: str, quantize: bool = True,
                 threads: int | None = None, max_length: int | None = None):
        _require_onnx()
        from tokenizers import Tokenizer

        self.name, self.path = name, Path(path)
        self.device = "cpu"
        tag = "int8v2" if quantize else "fp32"  # v2: fused graph, 7-bit per-channel weights
        out = cache_dir() / "onnx" / weights_fingerprint  # per weights, whatever the name
        self.onnx_file = export_onnx(self.path, out, quantize=quantize)
        self.threads = max(1, int(threads or os.environ.get(THREADS_ENV, 1)))
        self.session = _session(self.onnx_file)
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
        if self.max_length != int(cfg.get("max_seq_length", self.max_length)):
            self.fingerprint += f"-len{self.max_length}"
        self.query_prefix = self.document_prefix = ""
        self.calls = 0

    def _run(self, ids: list[list[int]]) -> np.ndarray:
        """Mean-pooled (not normalised) vectors of one padded batch."""
        tok, mask = pad_batch(ids)
        feed = {"input_ids": tok, "attention_mask": mask}
        if "token_type_ids" in self._inputs:
            feed["token_type_ids"] = np.zeros_like(tok)
        return mean_pool(self.session.run(["last_hidden_state"], feed)[0], mask)

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

        def run(rows: np.ndarray) -> None:
            out[rows] = self._run([ids[i] for i in rows])
            if bar:
                bar.update(len(rows))

        run_longest_first(batches, run, self.threads, "onnx-encode")
        if bar:
            bar.close()
        if normalize:
            out = l2_normalize(out)
        return np.ascontiguousarray(out, dtype=np.float32)

    def encode_queries(self, texts: Sequence[str], **kw) -> np.ndarray:
        return self.encode([self.query_prefix + t for t in texts], **kw)

    def encode_documents(self, texts: Sequence[str], **kw) -> np.ndarray:
        return self.encode([self.document_prefix + t for t in texts], **kw)
