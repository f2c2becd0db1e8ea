"""What a `rag.pipeline.Pipeline` needs from its indexes: the `IndexProvider` protocol.

Two classes implement it: `rag.indexset.IndexSet` (the real indexes, what Serve and offline
evaluation run on) and `rl.common.memo.MemoIndexSet` (the same retrievers behind an on-disk
memo, what the tuner runs on). Because the pipeline is typed against this protocol, the tuner
scores configs through the very stage code Serve runs; only where candidates come from differs.

The protocols are structural (`typing.Protocol`, checkable with `isinstance` for the methods and
attributes they name); neither implementation inherits from them.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol, runtime_checkable

import numpy as np

from rag.corpus import Corpus
from rag.types import Hit


@runtime_checkable
class CandidateSource(Protocol):
    """A retriever: best-first hits for one query string (at most `top_n`, <= 100)."""

    def search(self, query: str, top_n: int = 10) -> list[Hit]: ...


@runtime_checkable
class GraphSource(Protocol):
    """The entity-graph retriever: a search with its personalised-PageRank parameters
    (`damping` in (0, 1), `n_seeds` seed passages from its bm25 and dense seeds)."""

    def search(self, query: str, top_n: int = 10, damping: float | None = None,
               n_seeds: int | None = None) -> list[Hit]: ...


class QueryEncoder(Protocol):
    """A bi-encoder's query side: one unit-length row per text."""

    def encode(self, texts: Sequence[str]) -> np.ndarray: ...


@runtime_checkable
class DenseSource(Protocol):
    """A dense retriever, plus what cosine rerank and MMR selection read from it: its query
    encoder, a query's embedding and the stored (unit-length) passage embeddings by id."""

    encoder: QueryEncoder

    def search(self, query: str, top_n: int = 10) -> list[Hit]: ...

    def embed_query(self, query: str) -> np.ndarray: ...

    def passage_embeddings(self, ids: list[str]) -> np.ndarray: ...


@runtime_checkable
class IndexProvider(Protocol):
    """The retrievers of one corpus, by name, and the corpus itself.

    `bm25(backend)`: lexical candidates (tantivy | bm25s, or the backend the set is pinned to);
    `dense(kind)`: dense candidates (flat | hnsw); `graph(bm25_backend, dense_kind)`: the entity
    graph seeded by those two; `corpus[id]` the passage (title, text) of a hit;
    `encoder_name` the bi-encoder of the dense indexes (cosine rerank with the same model reuses
    the stored passage vectors)."""

    corpus: Corpus
    encoder_name: str

    def bm25(self, backend: str = "tantivy") -> CandidateSource: ...

    def dense(self, kind: str = "flat") -> DenseSource: ...

    def graph(self, bm25_backend: str | None = None, dense_kind: str = "flat") -> GraphSource: ...
