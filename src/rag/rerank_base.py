"""The reranker interface and what every cross-encoder runtime shares (rag.rerank for torch,
rag.onnx_rerank for ONNX Runtime); a module of its own so the two never import each other."""

from __future__ import annotations

import json
from abc import ABC, abstractmethod
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from rag.types import Hit, Passage


class Reranker(ABC):
    name: str = "reranker"

    @abstractmethod
    def scores(self, query: str, passages: Sequence[Passage]) -> np.ndarray:
        """One relevance score per passage (higher is better)."""

    def rerank(self, query: str, passages: Sequence[Passage], top_k: int | None = None
               ) -> list[Hit]:
        if not passages:
            return []
        s = self.scores(query, passages)
        hits = sorted((Hit(float(v), p.id) for v, p in zip(s, passages, strict=True)),
                      key=lambda h: (-h.score, h.id))
        return hits[:top_k] if top_k else hits


def trained_max_length(model_dir: Path) -> int | None:
    """`config.max_length` of a `ragpilot train-reranker` manifest, if there is one."""
    man = model_dir / "manifest.json"
    if not man.exists():
        return None
    try:
        value = json.loads(man.read_text()).get("config", {}).get("max_length")
    except (OSError, ValueError):
        return None
    return int(value) if isinstance(value, int) and value > 0 else None
