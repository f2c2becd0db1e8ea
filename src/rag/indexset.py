"""All candidate indexes of one corpus, in one directory, built once and reloaded lazily.

Layout under `root`:
    corpus.jsonl          the passages (ids are what every index returns)
    manifest.json         dataset manifest: inputs + sha256, counts, encoder, built indexes
    bm25-tantivy/ bm25-bm25s/ dense-flat/ dense-hnsw/ graph/

An index a config asks for that was not built yet is built on first use and persisted (dense
indexes reuse the cached corpus embeddings, so that is cheap).
"""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path
from typing import Any

from rag.corpus import Corpus
from rag.errors import ConfigError, DataError
from rag.index.base import Retriever


class IndexSet:
    """Lazily-loaded retrievers over one corpus. Thread-safe for loading."""

    def __init__(self, root: str | Path, corpus: Corpus, encoder: str = "minilm",
                 device: str = "cpu", show_progress: bool = False):
        self.root = Path(root)
        self.corpus = corpus
        self.encoder_name = encoder
        self.device = device
        self.show_progress = show_progress
        self._cache: dict[str, Any] = {}
        self._lock = threading.RLock()
        self.build_seconds: dict[str, float] = {}

    # ---- construction ---------------------------------------------------------------------
    @classmethod
    def create(cls, corpus: Corpus, root: str | Path, encoder: str = "minilm",
               manifest: dict[str, Any] | None = None, device: str = "cpu",
               show_progress: bool = True) -> IndexSet:
        """Write the corpus and manifest under `root` (indexes are built on demand)."""
        root = Path(root)
        root.mkdir(parents=True, exist_ok=True)
        corpus.save(root / "corpus.jsonl")
        meta = dict(manifest or {})
        meta.update({"corpus_fingerprint": corpus.fingerprint(), "passages": len(corpus),
                     "encoder": encoder})
        (root / "manifest.json").write_text(json.dumps(meta, indent=2, sort_keys=True))
        return cls(root, corpus, encoder=encoder, device=device, show_progress=show_progress)

    @classmethod
    def open(cls, root: str | Path, device: str = "cpu", show_progress: bool = False) -> IndexSet:
        root = Path(root)
        if not (root / "corpus.jsonl").exists():
            raise DataError(str(root), "not an index directory (no corpus.jsonl); run "
                                       "`ragpilot index` first")
        manifest = json.loads((root / "manifest.json").read_text())
        return cls(root, Corpus.load(root / "corpus.jsonl"), encoder=manifest.get("encoder",
                   "minilm"), device=device, show_progress=show_progress)

    @property
    def manifest(self) -> dict[str, Any]:
        return json.loads((self.root / "manifest.json").read_text())

    def build_all(self, bm25: tuple[str, ...] = ("tantivy",), dense: tuple[str, ...] = ("flat",),
                  graph: bool = True) -> dict[str, float]:
        """Build (or load) the named indexes now; returns seconds spent per index."""
        for b in bm25:
            self.bm25(b)
        for d in dense:
            self.dense(d)
        if graph:
            self.graph()
        return dict(self.build_seconds)

    # ---- accessors ----------------------------------------------------------------------
    def encoder(self):
        from rag.encoders import Encoder

        return Encoder.from_registry(self.encoder_name, device=self.device)

    def bm25(self, backend: str = "tantivy") -> Retriever:
        from rag.index.bm25 import BM25sRetriever, TantivyBM25

        classes = {"tantivy": TantivyBM25, "bm25s": BM25sRetriever}
        if backend not in classes:
            raise ConfigError("bm25_backend", f"unknown backend {backend!r}")
        cls = classes[backend]
        return self._get(f"bm25-{backend}", lambda d: cls.load(d),
                         lambda d: cls.build(self.corpus, directory=d))

    def dense(self, kind: str = "flat"):
        from rag.index.dense import DenseRetriever

        if kind not in ("flat", "hnsw"):
            raise ConfigError("dense_index", f"unknown index {kind!r}")
        return self._get(
            f"dense-{kind}",
            lambda d: DenseRetriever.load(d, encoder=self.encoder()),
            lambda d: DenseRetriever.build(self.corpus, self.encoder(), index=kind, directory=d,
                                           show_progress=self.show_progress, device=self.device),
        )

    def graph(self, bm25_backend: str = "tantivy", dense_kind: str = "flat"):
        """The entity graph, seeded by this set's bm25 and dense retrievers."""
        from rag.index.graph import GraphRetriever

        seeds = [self.bm25(bm25_backend), self.dense(dense_kind)]
        g = self._get("graph", lambda d: GraphRetriever.load(d),
                      lambda d: GraphRetriever.build(self.corpus, directory=d))
        key = f"graph@{bm25_backend}+{dense_kind}"
        with self._lock:
            if key not in self._cache:
                self._cache[key] = GraphRetriever(g.B, g.ids, g.entities, seeds=seeds)
            return self._cache[key]

    def _get(self, name: str, load, build):
        with self._lock:
            if name not in self._cache:
                d = self.root / name
                if d.exists() and any(d.iterdir()):
                    self._cache[name] = load(d)
                else:
                    t0 = time.perf_counter()
                    self._cache[name] = build(d)
                    self.build_seconds[name] = time.perf_counter() - t0
            return self._cache[name]
