"""Memoised retrieval: what makes a tuner step cheap.

`MemoIndexSet` stands in for an `IndexSet` inside a `Pipeline`. The first time a question meets a
retriever (bm25, dense, graph with given parameters) it runs the real retriever for the top
`depth` (100) candidates, times it (median of 3 runs: the steady-state cost), and stores hits + milliseconds in an on-disk
SQLite table keyed by corpus fingerprint, encoder, retriever and question. Later calls slice the
stored list. Query embeddings are memoised the same way, so cosine rerank and MMR stop
re-encoding. Hybrid fusion, rerank scoring, selection and generation still run for real: a config
is a recombination of cached candidate lists.

`MemoIndexSet` implements `rag.index.provider.IndexProvider`, so the tuner runs the real
`Pipeline`. Its latency comes from `stage_timer()` (`MemoStageTimer`): a stage costs the stored
cold cost of each memoised call it made (retrieval, query encoding: a median measured once and
stored) plus the wall time of everything else it ran for real (fusion, rerank scoring, MMR,
generation). The time spent inside memoised calls — a lookup, or on a miss the three timed runs
that measure the cost, or opening an index — is never charged, so a config costs the same
whether its retrievals were already memoised or not.

The memo file is versioned by `retrieval_version()` (a `rl.common.fingerprint.code_fingerprint`
of the retrievers' and encoders' code),
so a changed retriever recomputes its candidate lists (and, through `rows_version`, the rows).
"""

from __future__ import annotations

import functools
import json
import pickle
import sqlite3
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import numpy as np

from rag.indexset import IndexSet
from rag.pipeline import StageTimer
from rag.types import Hit
from rl.common.fingerprint import code_fingerprint

DEPTH = 100
RETRIEVAL_SOURCES = ("rag.index", "rag.indexset", "rag.encoders")
"""Modules whose code decides a memoised candidate list or query embedding."""
RETRIEVAL_STOP = ("rag.corpus", "rag.config", "rag.errors", "rag.progress")
"""Not followed: the corpus is keyed by its content fingerprint, retriever parameters by the
keyword arguments in each memo key, and error messages and progress lines change no result."""


class MemoStore:
    """key → (value, cold ms) in one SQLite file; values are pickled."""

    def __init__(self, path: str | Path):
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._mem: dict[str, tuple[Any, float]] = {}
        self._lock = threading.Lock()
        self._db = sqlite3.connect(str(self.path), check_same_thread=False)
        self._db.execute("PRAGMA journal_mode=WAL")
        self._db.execute("CREATE TABLE IF NOT EXISTS memo (key TEXT PRIMARY KEY, value BLOB, "
                         "ms REAL)")
        self._pending: list[tuple[str, bytes, float]] = []

    def get(self, key: str) -> tuple[Any, float] | None:
        with self._lock:
            if key in self._mem:
                return self._mem[key]
            row = self._db.execute("SELECT value, ms FROM memo WHERE key=?", (key,)).fetchone()
            if row is None:
                return None
            self._mem[key] = (pickle.loads(row[0]), float(row[1]))
            return self._mem[key]

    def put(self, key: str, value: Any, ms: float) -> None:
        with self._lock:
            self._mem[key] = (value, ms)
            self._pending.append((key, pickle.dumps(value), ms))
            if len(self._pending) >= 256:
                self._flush()

    def flush(self) -> None:
        with self._lock:
            self._flush()

    def _flush(self) -> None:
        if self._pending:
            self._db.executemany("INSERT OR REPLACE INTO memo VALUES (?, ?, ?)", self._pending)
            self._db.commit()
            self._pending.clear()


def _timed_median(call, repeats: int = 3) -> tuple[Any, float]:
    """Result of `call` and the median of `repeats` wall times in ms: one timing taken while
    another process holds the core can be 10x the steady-state cost."""
    times, out = [], None
    for _ in range(repeats):
        t0 = time.perf_counter()
        out = call()
        times.append((time.perf_counter() - t0) * 1000.0)
    return out, float(np.median(times))


class _Cost:
    """Running totals (ms) of the memoised calls made through one `MemoIndexSet`: `stored` = the
    stored cold costs they stand for, `spent` = wall time actually spent inside them (lookups,
    cost measurements, opening indexes). Not thread-safe: one question at a time (the
    evaluator computes tables under its lock)."""

    def __init__(self):
        self.stored = 0.0
        self.spent = 0.0

    def charge(self, stored_ms: float, since: float) -> None:
        """Add one memoised call: its stored cost, and the wall time since `since`
        (a `time.perf_counter()` taken when the call began)."""
        self.stored += stored_ms
        self.spent += (time.perf_counter() - since) * 1000.0


class MemoStageTimer(StageTimer):
    """A `StageTimer` for pipelines over a `MemoIndexSet`: a stage's latency = its wall time
    minus the time spent inside memoised calls + their stored cold costs (ms). The memoised
    part is therefore the same number however often (and in which order) configs are
    evaluated; the rest is the measured time of the work that ran for real."""

    def __init__(self, cost: _Cost):
        super().__init__()
        self._cost = cost
        self.stored_ms: dict[str, float] = {}
        """The memoised part of each stage's latency (stored cold costs, ms)."""

    @contextmanager
    def stage(self, name: str) -> Iterator[None]:
        stored0, spent0 = self._cost.stored, self._cost.spent
        t0 = time.perf_counter()
        try:
            yield
        finally:
            wall = (time.perf_counter() - t0) * 1000.0
            real = max(wall - (self._cost.spent - spent0), 0.0)
            self.stored_ms[name] = self._cost.stored - stored0
            self.latency_ms[name] = real + self.stored_ms[name]


class MemoRetriever:
    def __init__(self, inner, name: str, store: MemoStore, cost: _Cost, depth: int = DEPTH):
        self.inner, self.name, self.store, self.cost, self.depth = inner, name, store, cost, depth

    def _key(self, query: str, kw: dict[str, Any]) -> str:
        return json.dumps([self.name, self.depth, sorted(kw.items()), query])

    def search(self, query: str, top_n: int = 10, **kw: Any) -> list[Hit]:
        t0 = time.perf_counter()
        key = self._key(query, kw)
        got = self.store.get(key)
        if got is None or (len(got[0]) < top_n and top_n > self.depth):
            n = max(top_n, self.depth)
            hits, ms = _timed_median(lambda: self.inner.search(query, n, **kw))
            got = (list(hits), ms)
            self.store.put(key, *got)
        self.cost.charge(got[1], t0)
        return list(got[0][:top_n])

    def __getattr__(self, name: str):
        return getattr(self.inner, name)


class _MemoEncoder:
    """`encode([query])` through the memoised query embeddings of a MemoDense."""

    def __init__(self, dense: MemoDense):
        self._dense = dense

    def encode(self, texts, **_: Any) -> np.ndarray:
        return np.stack([self._dense.embed_query(t) for t in texts])


class MemoDense(MemoRetriever):
    def __init__(self, inner, name: str, store: MemoStore, cost: _Cost, depth: int = DEPTH):
        super().__init__(inner, name, store, cost, depth)
        self.encoder = _MemoEncoder(self)

    def embed_query(self, query: str) -> np.ndarray:
        t0 = time.perf_counter()
        key = json.dumps([self.name, "embed", query])
        got = self.store.get(key)
        if got is None:
            got = _timed_median(lambda: self.inner.embed_query(query))
            self.store.put(key, *got)
        self.cost.charge(got[1], t0)
        return got[0]

    def passage_embeddings(self, ids: list[str]) -> np.ndarray:
        return self.inner.passage_embeddings(ids)


class MemoIndexSet:
    """An `IndexProvider` (`rag.index.provider`) over `indexes` with memoised retrievers: what
    the tuner's `Pipeline` runs on. Time its stages with `stage_timer()`."""

    def __init__(self, indexes: IndexSet, store_dir: str | Path):
        self.inner = indexes
        self.corpus = indexes.corpus
        self.encoder_name = indexes.encoder_name
        fp = indexes.corpus.fingerprint()
        self.store = MemoStore(Path(store_dir) / f"memo-{fp}-{indexes.encoder_name}-"
                                                 f"r{retrieval_version()}.sqlite")
        self._cost = _Cost()
        self._wrapped: dict[str, Any] = {}

    def stage_timer(self) -> MemoStageTimer:
        """A fresh timer for one question of a `Pipeline` over this set."""
        return MemoStageTimer(self._cost)

    def _wrap(self, name: str, make) -> Any:
        if name not in self._wrapped:
            t0 = time.perf_counter()
            w = make()
            # load models and page in index files now, so no stored cold cost includes them
            w.inner.search("warm up query", 5)
            self._wrapped[name] = w
            self._cost.charge(0.0, t0)  # a one-time load is no stage's cost
        return self._wrapped[name]

    def bm25(self, backend: str = "tantivy"):
        return self._wrap(f"bm25-{backend}", lambda: MemoRetriever(
            self.inner.bm25(backend), f"bm25-{backend}", self.store, self._cost))

    def dense(self, kind: str = "flat"):
        return self._wrap(f"dense-{kind}", lambda: MemoDense(
            self.inner.dense(kind), f"dense-{kind}", self.store, self._cost))

    def graph(self, bm25_backend: str | None = None, dense_kind: str = "flat"):
        bm25_backend = bm25_backend or self.inner.default_bm25_backend()
        name = f"graph@{bm25_backend}+{dense_kind}"
        return self._wrap(name, lambda: MemoRetriever(
            self.inner.graph(bm25_backend, dense_kind), name, self.store, self._cost))

    def flush(self) -> None:
        self.store.flush()


@functools.cache
def retrieval_version() -> str:
    """Fingerprint of the retrieval code (`RETRIEVAL_SOURCES` and what they import, minus
    `RETRIEVAL_STOP`): part of the memo file's name and of `rl.kernel.evaluator.rows_version`."""
    return code_fingerprint(RETRIEVAL_SOURCES, RETRIEVAL_STOP)
