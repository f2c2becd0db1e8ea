"""BM25 retrievers: tantivy (Rust, on-disk; the default) and bm25s (pure Python/numpy).

Both index title + text, lower-case, drop English stop words and stem (Porter/Snowball), the
set-up that brings SciFact nDCG@10 to Anserini's BM25 reference (see bench/results/retrieval.md).
User text never reaches a query parser unescaped: queries are reduced to word tokens first, so
punctuation, quotes and AND/OR/NOT are ordinary text.
"""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import numpy as np

from rag.corpus import Corpus
from rag.errors import ConfigError
from rag.index.base import Retriever, check_top_n
from rag.types import Hit

_WORD = re.compile(r"[^\W_]+", re.UNICODE)
TOKENIZER = "ragpilot_en"


def query_terms(query: str) -> list[str]:
    """Word tokens of a user query (lower-cased); raises ConfigError when there are none."""
    if not isinstance(query, str) or not query.strip():
        raise ConfigError("query", "must be a non-empty string")
    return [w.lower() for w in _WORD.findall(query)]


def _analyzer():
    import tantivy

    return (tantivy.TextAnalyzerBuilder(tantivy.Tokenizer.simple())
            .filter(tantivy.Filter.remove_long(40))
            .filter(tantivy.Filter.lowercase())
            .filter(tantivy.Filter.stopword("english"))
            .filter(tantivy.Filter.stemmer("english"))
            .build())


def _schema():
    import tantivy

    sb = tantivy.SchemaBuilder()
    sb.add_text_field("body", stored=False, tokenizer_name=TOKENIZER)
    sb.add_integer_field("row", stored=True, fast=True)
    return sb.build()


class TantivyBM25(Retriever):
    """BM25 (k1=1.2, b=0.75, tantivy's scorer) over an on-disk tantivy index."""

    kind = "bm25"

    def __init__(self, index, ids: list[str], directory: Path):
        self._index = index
        self._ids = ids
        self.directory = directory
        self._searcher = index.searcher()

    @classmethod
    def build(cls, corpus: Corpus, directory: str | Path | None = None,
              heap_mb: int = 256) -> TantivyBM25:
        import tempfile

        import tantivy

        d = Path(directory) if directory else Path(tempfile.mkdtemp(prefix="bm25-"))
        if d.exists():  # a rebuild replaces the old index (its schema may differ)
            shutil.rmtree(d)
        d.mkdir(parents=True)
        index = tantivy.Index(_schema(), path=str(d))
        index.register_tokenizer(TOKENIZER, _analyzer())
        writer = index.writer(heap_size=heap_mb * 1_000_000, num_threads=1)
        for row, p in enumerate(corpus):
            writer.add_document(tantivy.Document(body=f"{p.title}\n{p.text}", row=row))
        writer.commit()
        writer.wait_merging_threads()
        ids = corpus.ids
        (d / "ids.json").write_text(json.dumps(ids))
        index.reload()
        return cls(index, ids, d)

    def save(self, directory: str | Path) -> None:
        d = Path(directory)
        if d.resolve() != self.directory.resolve():
            shutil.copytree(self.directory, d, dirs_exist_ok=True)

    @classmethod
    def load(cls, directory: str | Path) -> TantivyBM25:
        import tantivy

        d = Path(directory)
        if not (d / "ids.json").exists():
            raise ConfigError("bm25", f"{d} holds no tantivy index (ids.json missing)")
        index = tantivy.Index.open(str(d))
        index.register_tokenizer(TOKENIZER, _analyzer())
        return cls(index, json.loads((d / "ids.json").read_text()), d)

    def search(self, query: str, top_n: int = 10) -> list[Hit]:
        top_n = check_top_n(top_n)
        terms = query_terms(query)
        if not terms:
            return []
        parsed = self._index.parse_query(" ".join(terms), ["body"])
        res = self._searcher.search(parsed, limit=top_n, count=False)
        out = []
        for score, addr in res.hits:
            row = self._searcher.doc(addr)["row"][0]
            out.append(Hit(float(score), self._ids[row]))
        out.sort(key=lambda h: (-h.score, h.id))
        return out


class BM25sRetriever(Retriever):
    """BM25 (Lucene variant, k1=0.9, b=0.4 as Anserini's BEIR runs) with the bm25s package."""

    kind = "bm25"

    def __init__(self, model, ids: list[str], stemmer):
        self._model = model
        self._ids = ids
        self._stemmer = stemmer

    @staticmethod
    def _make_stemmer():
        try:
            import Stemmer  # PyStemmer, optional

            return Stemmer.Stemmer("english")
        except ImportError:
            return None

    @classmethod
    def build(cls, corpus: Corpus, directory: str | Path | None = None,
              k1: float = 0.9, b: float = 0.4) -> BM25sRetriever:
        import bm25s

        stemmer = cls._make_stemmer()
        tokens = bm25s.tokenize([f"{p.title}\n{p.text}" for p in corpus], stopwords="en",
                                stemmer=stemmer, show_progress=False)
        model = bm25s.BM25(k1=k1, b=b, method="lucene")
        model.index(tokens, show_progress=False)
        r = cls(model, corpus.ids, stemmer)
        if directory:
            r.save(directory)
        return r

    def save(self, directory: str | Path) -> None:
        d = Path(directory)
        d.mkdir(parents=True, exist_ok=True)
        self._model.save(str(d))
        (d / "ids.json").write_text(json.dumps(self._ids))

    @classmethod
    def load(cls, directory: str | Path) -> BM25sRetriever:
        import bm25s

        d = Path(directory)
        return cls(bm25s.BM25.load(str(d)), json.loads((d / "ids.json").read_text()),
                   cls._make_stemmer())

    def search(self, query: str, top_n: int = 10) -> list[Hit]:
        import bm25s

        top_n = check_top_n(top_n)
        terms = query_terms(query)
        if not terms:
            return []
        q = bm25s.tokenize([" ".join(terms)], stopwords="en", stemmer=self._stemmer,
                           show_progress=False, return_ids=False)
        if not q or not q[0]:
            return []
        vocab = self._model.vocab_dict
        q_ids = [[vocab[t] for t in q[0] if t in vocab]]
        if not q_ids[0]:
            return []
        scores = self._model.get_scores(q_ids[0])
        n = min(top_n, len(self._ids))
        top = np.argpartition(-scores, n - 1)[:n]
        hits = [Hit(float(scores[i]), self._ids[i]) for i in top if scores[i] > 0]
        hits.sort(key=lambda h: (-h.score, h.id))
        return hits


def make_bm25(backend: str, corpus: Corpus, directory: str | Path | None = None) -> Retriever:
    if backend == "tantivy":
        return TantivyBM25.build(corpus, directory)
    if backend == "bm25s":
        return BM25sRetriever.build(corpus, directory)
    raise ConfigError("bm25_backend", f"unknown backend {backend!r} (tantivy | bm25s)")
