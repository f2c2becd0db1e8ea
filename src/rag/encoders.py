"""Bi-encoder: texts -> L2-normalised float32 vectors, from a model resolved through the
registry (default: the packaged all-MiniLM-L6-v2 on sentence-transformers).

`Encoder.from_registry(name)` picks the runtime from the registry entry: sentence-transformers
(default); ONNX Runtime int8 when `options.runtime == "onnx"` (rag.onnx_encoder, the `models`
extra); for GGUF embedders the batched PyTorch nomic-bert port when `options.runtime ==
"torch"` (rag.nomic_port), else llama.cpp (rag.llama_runtime). Every encoder has `encode`, and
`encode_queries` / `encode_documents` which add the model's query/document prefixes (options
`query_prefix` / `document_prefix`, e.g. nomic's "search_query: "); retrieval code calls
those through `encode_queries(encoder, texts)` / `encode_documents(...)` below, which fall back
to `encode` for encoders without them. `fingerprint` names weights and runtime, so cached
embeddings and dense indexes never mix models.

Query-time calls: `set_query_runtime("onnx")` (serving does, unless $RAGPILOT_QUERY_RUNTIME is
`torch`) makes every sentence-transformers `Encoder` run calls of at most `SMALL_CALL` texts on
ONNX Runtime fp32 (rag.onnx_encoder: the same weights, mean pooling and truncation; cosine
>= 0.99999 to torch, so indexes built by torch stay valid and the fingerprint is unchanged).
A one-question encode then costs ~2.6x less CPU (torch's per-module overhead dominates a
15-token input). Models it does not reproduce (not BERT, not mean pooling, not on CPU) and
machines without onnxruntime keep torch. Bulk encodes (indexing) always use torch.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import threading
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from rag.errors import ConfigError
from rag.models import ModelRegistry, ModelSpec, default_registry

_LOADED: dict[tuple[str, str], Encoder] = {}
_LOCK = threading.Lock()
QUERY_RUNTIME_ENV = "RAGPILOT_QUERY_RUNTIME"
SMALL_CALL = 8
"""Calls of at most this many texts are query-time calls (see set_query_runtime)."""
_QUERY_RUNTIME = {"mode": os.environ.get(QUERY_RUNTIME_ENV, "torch")}
log = logging.getLogger(__name__)


def set_query_runtime(mode: str) -> str:
    """`onnx` or `torch`: the runtime of small (query-time) `Encoder.encode` calls in this
    process, for encoders loaded before or after. $RAGPILOT_QUERY_RUNTIME=torch overrides an
    `onnx` request (an operator's escape hatch). Returns the mode in force."""
    if mode not in ("onnx", "torch"):
        raise ConfigError("query_runtime", f"must be 'onnx' or 'torch', got {mode!r}")
    if os.environ.get(QUERY_RUNTIME_ENV) == "torch":
        mode = "torch"
    _QUERY_RUNTIME["mode"] = mode
    return mode


def _fingerprint(folder: Path) -> str:
    """sha256 over the names, sizes and first MiB of the weight/config files (fast, stable)."""
    h = hashlib.sha256()
    for f in sorted(folder.rglob("*")):
        if f.is_file() and f.suffix in {".safetensors", ".bin", ".json", ".txt"}:
            h.update(f.relative_to(folder).as_posix().encode())
            h.update(str(f.stat().st_size).encode())
            with f.open("rb") as fh:
                h.update(fh.read(1 << 20))
    return h.hexdigest()[:16]


class Encoder:
    """A loaded bi-encoder. Use `Encoder.from_registry` so that callers share one model."""

    def __init__(self, name: str, path: Path, device: str = "cpu"):
        from sentence_transformers import SentenceTransformer

        if device == "cuda":
            import torch

            if not torch.cuda.is_available():
                raise ConfigError("device", "cuda requested but no GPU is visible to torch")
        self.name = name
        self.path = Path(path)
        self.device = device
        self.model = SentenceTransformer(str(self.path), device=device)
        self.dim = int(self.model.get_embedding_dimension()
                       if hasattr(self.model, "get_embedding_dimension")
                       else self.model.get_sentence_embedding_dimension())
        self.fingerprint = _fingerprint(self.path)
        self.query_prefix = self.document_prefix = ""
        self.calls = 0  # texts encoded so far (lets tests prove a cache was used)
        self._small: dict[str, object] = {}  # query runtime mode -> ONNX twin or None
        self._small_lock = threading.Lock()

    @classmethod
    def from_registry(cls, name: str = "minilm", device: str = "cpu",
                      registry: ModelRegistry | None = None) -> Encoder:
        key = (name, device)
        with _LOCK:
            if key not in _LOADED:
                spec = (registry or default_registry()).get(name)
                _LOADED[key] = _load(cls, spec, device)
            return _LOADED[key]

    def encode_queries(self, texts: Sequence[str], **kw) -> np.ndarray:
        return self.encode([self.query_prefix + t for t in texts], **kw)

    def encode_documents(self, texts: Sequence[str], **kw) -> np.ndarray:
        return self.encode([self.document_prefix + t for t in texts], **kw)

    def encode(self, texts: Sequence[str], batch_size: int = 64, show_progress: bool = False,
               normalize: bool = True) -> np.ndarray:
        """(n, dim) float32; rows are unit length when `normalize`."""
        texts = list(texts)
        self.calls += len(texts)
        if not texts:
            return np.zeros((0, self.dim), dtype=np.float32)
        twin = self._small_runtime() if len(texts) <= SMALL_CALL else None
        if twin is not None:
            return twin.encode(texts, normalize=normalize)
        vecs = self.model.encode(texts, batch_size=batch_size, show_progress_bar=show_progress,
                                 convert_to_numpy=True, normalize_embeddings=normalize)
        return np.ascontiguousarray(vecs, dtype=np.float32)

    def _small_runtime(self):
        """The ONNX fp32 twin for query-time calls, or None (torch): see set_query_runtime."""
        mode = _QUERY_RUNTIME["mode"]
        if mode == "torch" or self.device != "cpu":
            return None
        if mode not in self._small:
            with self._small_lock:
                if mode not in self._small:
                    self._small[mode] = self._onnx_twin()
        return self._small[mode]

    def _onnx_twin(self):
        """OnnxEncoder fp32 over the same weights when it reproduces this model (BERT, mean
        pooling); exported once into the cache. None, logged, otherwise."""
        why = None
        try:
            cfg = json.loads((self.path / "config.json").read_text())
            pool = self.path / "1_Pooling" / "config.json"
            mean = pool.exists() and json.loads(pool.read_text()).get("pooling_mode_mean_tokens")
            if cfg.get("model_type") != "bert" or not mean:
                why = "not a mean-pooled BERT model"
            elif not (self.path / "tokenizer.json").exists():
                why = "no tokenizer.json"
            else:
                from rag.onnx_encoder import OnnxEncoder

                return OnnxEncoder(self.name, self.path, self.fingerprint, quantize=False,
                                   threads=1)
        except Exception as exc:  # noqa: BLE001 - torch still answers
            why = f"{type(exc).__name__}: {exc}"
        log.warning("encoder %s: queries stay on torch (%s)", self.name, why)
        return None


def _load(cls, spec: ModelSpec, device: str):
    """The encoder for a registry entry, on the runtime its format/options name."""
    path = spec.resolve()
    runtime = spec.options.get("runtime")
    if spec.format == "gguf" and runtime == "torch":
        from rag.nomic_port import NomicPortEncoder

        enc = NomicPortEncoder(spec.name, path, threads=spec.options.get("threads"),
                               max_length=spec.options.get("max_length"), device=device)
    elif spec.format == "gguf" or runtime in ("llama_cpp", "llama"):
        if device != "cpu":
            raise ConfigError("device", f"{spec.name}: the llama.cpp encoder runs on cpu only")
        from rag.llama_runtime import LlamaCppEncoder

        enc = LlamaCppEncoder(spec.name, path, threads=spec.options.get("threads"))
    elif runtime == "onnx":
        if device != "cpu":
            raise ConfigError("device", f"{spec.name}: the ONNX encoder runs on cpu only; "
                                        "use the sentence-transformers entry on a GPU")
        from rag.onnx_encoder import OnnxEncoder

        enc = OnnxEncoder(spec.name, path, _fingerprint(path),
                          quantize=spec.options.get("quantize", "int8") == "int8",
                          threads=spec.options.get("threads"))
    elif spec.format in ("sentence_transformers", "hf"):
        enc = cls(spec.name, path, device=device)
    else:
        raise ConfigError("encoder", f"{spec.name!r}: unsupported format {spec.format!r}")
    enc.query_prefix = str(spec.options.get("query_prefix", ""))
    enc.document_prefix = str(spec.options.get("document_prefix", ""))
    return enc


def encode_queries(encoder, texts: Sequence[str], **kw) -> np.ndarray:
    """Query vectors: the encoder's `encode_queries` (prefixes) or plain `encode`."""
    fn = getattr(encoder, "encode_queries", None)
    return fn(list(texts), **kw) if fn else encoder.encode(list(texts), **kw)


def encode_documents(encoder, texts: Sequence[str], **kw) -> np.ndarray:
    """Passage vectors: the encoder's `encode_documents` (prefixes) or plain `encode`."""
    fn = getattr(encoder, "encode_documents", None)
    return fn(list(texts), **kw) if fn else encoder.encode(list(texts), **kw)
