"""The one interface every candidate source implements.

A retriever is built from a Corpus, persisted to a directory, and reloaded without
recomputation. `search` returns at most `top_n` hits (top_n <= 100), best first, with the
retriever's own score (not normalised: fusion does that).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Sequence
from pathlib import Path
from typing import ClassVar

from rag.config import MAX_CANDIDATES
from rag.errors import ConfigError
from rag.types import Hit


class Retriever(ABC):
    """Top-N candidate retrieval over a fixed corpus."""

    kind: ClassVar[str] = "base"

    @abstractmethod
    def search(self, query: str, top_n: int = 10) -> list[Hit]:
        """Best-first hits for one query string."""

    def search_batch(self, queries: Sequence[str], top_n: int = 10) -> list[list[Hit]]:
        """Hits for many queries; backends override this when batching is faster."""
        return [self.search(q, top_n) for q in queries]

    @abstractmethod
    def save(self, directory: str | Path) -> None:
        """Persist everything needed by `load` under `directory` (created if missing)."""

    @classmethod
    @abstractmethod
    def load(cls, directory: str | Path) -> Retriever:
        """Reload a retriever saved by `save`, without recomputing embeddings or postings."""


def check_top_n(top_n: int) -> int:
    if not 1 <= int(top_n) <= MAX_CANDIDATES:
        raise ConfigError("top_n", f"must be in [1, {MAX_CANDIDATES}], got {top_n}")
    return int(top_n)
