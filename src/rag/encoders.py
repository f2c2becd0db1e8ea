"""Bi-encoder: texts -> L2-normalised float32 vectors, from a local sentence-transformers folder
resolved through the model registry (default: the packaged all-MiniLM-L6-v2)."""

from __future__ import annotations

import hashlib
import threading
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from rag.errors import ConfigError
from rag.models import ModelRegistry, default_registry

_LOADED: dict[tuple[str, str], Encoder] = {}
_LOCK = threading.Lock()


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
        self.calls = 0  # texts encoded so far (lets tests prove a cache was used)

    @classmethod
    def from_registry(cls, name: str = "minilm", device: str = "cpu",
                      registry: ModelRegistry | None = None) -> Encoder:
        key = (name, device)
        with _LOCK:
            if key not in _LOADED:
                spec = (registry or default_registry()).get(name)
                _LOADED[key] = cls(name, spec.resolve(), device=device)
            return _LOADED[key]

    def encode(self, texts: Sequence[str], batch_size: int = 64, show_progress: bool = False,
               normalize: bool = True) -> np.ndarray:
        """(n, dim) float32; rows are unit length when `normalize`."""
        texts = list(texts)
        self.calls += len(texts)
        if not texts:
            return np.zeros((0, self.dim), dtype=np.float32)
        vecs = self.model.encode(texts, batch_size=batch_size, show_progress_bar=show_progress,
                                 convert_to_numpy=True, normalize_embeddings=normalize)
        return np.ascontiguousarray(vecs, dtype=np.float32)
