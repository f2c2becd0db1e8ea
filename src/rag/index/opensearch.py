"""OpenSearch as a candidate source: BM25 and kNN (the same MiniLM unit vectors as the FAISS
index, from the same embedding cache) in one index, plus hybrid retrieval.

    r = OpenSearchRetriever.build(corpus, encoder, url="http://127.0.0.1:9200",
                                  index="ragpilot-hotpotqa", mode="hybrid")
    r.search("who founded the company?", top_n=50)      # -> list[Hit], best first

Modes: `bm25` (a `match` query on `body` = "title\\ntext", analysed like the tantivy index:
lower-case, English stop words, English stemmer; BM25 k1=1.2, b=0.75 are OpenSearch's defaults
too), `knn` (`knn` query on a `knn_vector` field, Lucene HNSW, cosine), `hybrid`. Hybrid runs
client-side by default: both queries, then `rag.fusion.hybrid_fuse` with the config's weight and
normalisation, exactly what the local hybrid pipeline does, so results are comparable across
backends. `hybrid="server"` sends one `hybrid` query through a search pipeline with the
normalization processor (needs the neural-search plugin; `search_pipeline_body`).

Selected by configuration with `indexes: {lexical: opensearch, dense: opensearch, opensearch:
{url: ...}}` (rag.index.settings): the IndexSet then checks the cluster answers when it is created
or opened (`check_reachable`: OpenSearchUnreachable naming the key otherwise), builds one index
`<index_prefix>-<corpus fingerprint>` on first use and queries it in bm25 and knn mode.

Needs the `opensearch` extra (opensearch-py). The server is never started here:
tests/test_opensearch_contract.py compares this backend with the local ones against the server
in $RAGPILOT_OPENSEARCH_URL (docs/operations.md).
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any, ClassVar
from urllib.parse import urlsplit

import numpy as np

from rag.corpus import Corpus
from rag.encoders import encode_queries
from rag.errors import ConfigError, DataError
from rag.index.base import Retriever, check_top_n
from rag.index.bm25 import query_terms
from rag.index.settings import OPENSEARCH_URL_ENV, check_url, public_url
from rag.types import Hit

URL_ENV = OPENSEARCH_URL_ENV
MODES = ("bm25", "knn", "hybrid")
ANALYZER = "ragpilot_en"
VECTOR_FIELD = "embedding"
BULK_DOCS = 500


# ---- request bodies (pure functions: unit-tested without a server) -----------------------------
def index_body(dim: int, engine: str = "lucene", space_type: str = "cosinesimil",
               m: int = 16, ef_construction: int = 128, ef_search: int = 128) -> dict[str, Any]:
    """Settings and mappings: one shard, the English analyser, `body` text, `pid` keyword and a
    `knn_vector` of `dim` dimensions (HNSW)."""
    if dim < 1:
        raise ConfigError("opensearch.dim", f"must be >= 1, got {dim}")
    return {
        "settings": {
            "index": {"number_of_shards": 1, "number_of_replicas": 0, "knn": True,
                      "knn.algo_param.ef_search": ef_search},
            "analysis": {"analyzer": {ANALYZER: {
                "type": "custom", "tokenizer": "standard",
                "filter": ["lowercase", "stop", "ragpilot_stem"]}},
                "filter": {"ragpilot_stem": {"type": "stemmer", "language": "english"}}},
        },
        "mappings": {"properties": {
            "pid": {"type": "keyword"},
            "title": {"type": "text", "analyzer": ANALYZER},
            "body": {"type": "text", "analyzer": ANALYZER},
            VECTOR_FIELD: {"type": "knn_vector", "dimension": int(dim), "method": {
                "name": "hnsw", "engine": engine, "space_type": space_type,
                "parameters": {"m": m, "ef_construction": ef_construction}}},
        }},
    }


def bulk_actions(corpus: Corpus, vecs: np.ndarray, index: str) -> Iterator[dict[str, Any]]:
    """The bulk API's action/document pairs: `index` with `_id` = passage id, then the doc."""
    if vecs.shape[0] != len(corpus):
        raise ConfigError("opensearch.embeddings", f"{vecs.shape[0]} vectors for "
                                                   f"{len(corpus)} passages")
    for p, v in zip(corpus, vecs, strict=True):
        yield {"index": {"_index": index, "_id": p.id}}
        yield {"pid": p.id, "title": p.title or "", "body": f"{p.title}\n{p.text}",
               VECTOR_FIELD: [float(x) for x in v]}


def bulk_ndjson(actions: Sequence[dict[str, Any]]) -> str:
    return "".join(json.dumps(a, ensure_ascii=False) + "\n" for a in actions)


def bm25_body(query: str, top_n: int) -> dict[str, Any]:
    """A `match` query over word tokens only (no query syntax reaches the server)."""
    return {"size": top_n, "_source": False,
            "query": {"match": {"body": {"query": " ".join(query_terms(query))}}}}


def knn_body(vector: np.ndarray, top_n: int) -> dict[str, Any]:
    return {"size": top_n, "_source": False,
            "query": {"knn": {VECTOR_FIELD: {"vector": [float(x) for x in vector],
                                             "k": top_n}}}}


def hybrid_body(query: str, vector: np.ndarray, top_n: int) -> dict[str, Any]:
    """The server-side `hybrid` query (bm25 first, knn second: the pipeline's weight order)."""
    return {"size": top_n, "_source": False, "query": {"hybrid": {"queries": [
        bm25_body(query, top_n)["query"], knn_body(vector, top_n)["query"]]}}}


def search_pipeline_body(fusion_weight: float, normalisation: str = "min_max") -> dict[str, Any]:
    """Normalization processor: `fusion_weight` on knn, 1 - w on bm25 (RAGConfig semantics)."""
    if not 0.0 <= fusion_weight <= 1.0:
        raise ConfigError("fusion_weight", f"must be in [0, 1], got {fusion_weight}")
    return {"description": "ragpilot hybrid: bm25 + knn",
            "phase_results_processors": [{"normalization-processor": {
                "normalization": {"technique": normalisation},
                "combination": {"technique": "arithmetic_mean",
                                "parameters": {"weights": [1.0 - fusion_weight,
                                                           fusion_weight]}}}}]}


def hits_from_response(resp: dict[str, Any]) -> list[Hit]:
    hits = [Hit(float(h["_score"]), str(h["_id"])) for h in resp["hits"]["hits"]]
    hits.sort(key=lambda h: (-h.score, h.id))
    return hits


class OpenSearchUnreachable(ConfigError):
    """The configured OpenSearch cluster did not answer (down, wrong URL, refused credentials).
    `field` names the setting that supplied the URL."""


def connect(url: str | None = None, timeout: float = 30.0, verify: bool | None = None,
            key: str = URL_ENV):
    """An opensearch-py client for `url` (else $RAGPILOT_OPENSEARCH_URL); no request is sent.
    Credentials may sit in the URL (https://user:pass@host:9200). `verify=None`: TLS checks
    unless RAGPILOT_OPENSEARCH_VERIFY=0. Errors name `key`, the setting the URL came from."""
    if not url and os.environ.get(URL_ENV):
        url, key = os.environ[URL_ENV], URL_ENV
    if not url:
        raise ConfigError(key, "no OpenSearch URL: set it or RAGPILOT_OPENSEARCH_URL")
    try:
        from opensearchpy import OpenSearch
    except ImportError:
        raise ConfigError("opensearch", "opensearch-py is not installed: pip install "
                                        "'ragpilot[opensearch]'") from None
    try:
        check_url(url)
    except ValueError as exc:
        raise ConfigError(key, str(exc)) from None
    parts = urlsplit(url)
    auth = (parts.username, parts.password or "") if parts.username else None
    if verify is None:
        verify = os.environ.get("RAGPILOT_OPENSEARCH_VERIFY", "1") != "0"
    return OpenSearch(hosts=[{"host": parts.hostname, "port": parts.port or 9200,
                              "scheme": parts.scheme}], http_auth=auth,
                      use_ssl=parts.scheme == "https", verify_certs=verify,
                      ssl_show_warn=verify, timeout=timeout)


def check_reachable(client, url: str, key: str = URL_ENV, timeout: float = 10.0
                    ) -> dict[str, Any]:
    """The cluster's info (`GET /`), or OpenSearchUnreachable naming `key` and the URL (without
    credentials). Called when an IndexSet that uses OpenSearch is created or opened."""
    try:
        info = client.info(request_timeout=timeout)
    except Exception as exc:  # connection refused, timeout, 401/403, TLS: all mean unusable
        detail = str(exc)[:300]
        if not detail.startswith(type(exc).__name__):
            detail = f"{type(exc).__name__}: {detail}"
        raise OpenSearchUnreachable(key, f"OpenSearch at {_public(url)} is not reachable: "
                                         f"{detail}") from None
    if not isinstance(info, dict) or "version" not in info:
        raise OpenSearchUnreachable(key, f"{_public(url)} answered GET / without a version: "
                                         "not an OpenSearch cluster")
    return info


_public = public_url  # `url` without credentials (what meta.json stores)


class OpenSearchRetriever(Retriever):
    """BM25 / kNN / hybrid candidates from one OpenSearch index."""

    kind: ClassVar[str] = "opensearch"

    def __init__(self, client, index: str, mode: str = "hybrid", encoder=None,
                 fusion_weight: float = 0.5, normalisation: str = "minmax",
                 hybrid: str = "client", url: str = ""):
        if mode not in MODES:
            raise ConfigError("opensearch.mode", f"unknown mode {mode!r} ({' | '.join(MODES)})")
        if hybrid not in ("client", "server"):
            raise ConfigError("opensearch.hybrid", f"must be client or server, got {hybrid!r}")
        if mode != "bm25" and encoder is None:
            raise ConfigError("encoder", f"mode {mode} needs the bi-encoder of the index")
        if not 0.0 <= fusion_weight <= 1.0:
            raise ConfigError("fusion_weight", f"must be in [0, 1], got {fusion_weight}")
        self.client, self.index, self.mode, self.encoder = client, index, mode, encoder
        self.fusion_weight, self.normalisation, self.hybrid = fusion_weight, normalisation, hybrid
        self.url = url
        self.pipeline = f"{index}-hybrid"
        self._vecs: np.ndarray | None = None
        self._row: dict[str, int] = {}

    def with_mode(self, mode: str) -> OpenSearchRetriever:
        """The same index and connection, queried in another mode (bm25 | knn | hybrid)."""
        r = OpenSearchRetriever(self.client, self.index, mode, self.encoder, self.fusion_weight,
                                self.normalisation, self.hybrid, url=self.url)
        r._vecs, r._row = self._vecs, self._row
        return r

    def attach_embeddings(self, vecs: np.ndarray, ids: Sequence[str]) -> None:
        """Local copies of the indexed passage vectors, so that cosine rerank and MMR (which
        need `passage_embeddings`) work on this backend like on FAISS."""
        if vecs.shape[0] != len(ids):
            raise ConfigError("opensearch.embeddings", f"{vecs.shape[0]} vectors for "
                                                       f"{len(ids)} passages")
        self._vecs, self._row = vecs, {pid: i for i, pid in enumerate(ids)}

    # ---- construction -----------------------------------------------------------------------
    @classmethod
    def build(cls, corpus: Corpus, encoder, url: str | None = None, index: str = "ragpilot",
              mode: str = "hybrid", client=None, directory: str | Path | None = None,
              replace: bool = True, **kwargs: Any) -> OpenSearchRetriever:
        """Create `index` (dropped first when `replace`), bulk-index the passages with their
        cached embeddings, refresh. `client` defaults to `connect(url)`."""
        from rag.index.dense import embed_corpus

        url = url or os.environ.get(URL_ENV, "")
        client = client if client is not None else connect(url)
        vecs = embed_corpus(corpus, encoder, show_progress=False)
        if client.indices.exists(index=index):
            if not replace:
                raise ConfigError("opensearch.index", f"index {index!r} exists (replace=False)")
            client.indices.delete(index=index)
        client.indices.create(index=index, body=index_body(vecs.shape[1]))
        actions = list(bulk_actions(corpus, vecs, index))
        step = 2 * BULK_DOCS
        for i in range(0, len(actions), step):
            resp = client.bulk(body=bulk_ndjson(actions[i:i + step]))
            if resp.get("errors"):
                bad = next(it for it in resp["items"] if "error" in next(iter(it.values())))
                raise DataError(f"opensearch.bulk[{index}]", json.dumps(bad)[:500])
        client.indices.refresh(index=index)
        r = cls(client, index, mode, encoder, url=_public(url) if url else "", **kwargs)
        if r.mode == "hybrid" and r.hybrid == "server":
            r.ensure_pipeline()
        if directory:
            r.save(directory)
        return r

    def ensure_pipeline(self) -> None:
        """Create/update the search pipeline of server-side hybrid (neural-search plugin)."""
        method = {"minmax": "min_max", "zscore": "z_score"}.get(self.normalisation, "min_max")
        self.client.transport.perform_request(
            "PUT", f"/_search/pipeline/{self.pipeline}",
            body=search_pipeline_body(self.fusion_weight, method))

    def save(self, directory: str | Path) -> None:
        d = Path(directory)
        d.mkdir(parents=True, exist_ok=True)
        (d / "opensearch.json").write_text(json.dumps({
            "url": self.url, "index": self.index, "mode": self.mode,
            "encoder": getattr(self.encoder, "name", None), "fusion_weight": self.fusion_weight,
            "normalisation": self.normalisation, "hybrid": self.hybrid}, indent=2))

    @classmethod
    def load(cls, directory: str | Path, client=None, encoder=None) -> OpenSearchRetriever:
        """Reconnect to the index described in `directory` ($RAGPILOT_OPENSEARCH_URL wins over
        the stored URL, e.g. to add credentials)."""
        p = Path(directory) / "opensearch.json"
        if not p.exists():
            raise ConfigError("opensearch", f"{directory} holds no opensearch.json")
        meta = json.loads(p.read_text())
        if encoder is None and meta["mode"] != "bm25" and meta.get("encoder"):
            from rag.encoders import Encoder

            encoder = Encoder.from_registry(meta["encoder"])
        url = os.environ.get(URL_ENV) or meta["url"]
        client = client if client is not None else connect(url)
        return cls(client, meta["index"], meta["mode"], encoder, meta["fusion_weight"],
                   meta["normalisation"], meta["hybrid"], url=_public(url) if url else "")

    # ---- queries ----------------------------------------------------------------------------
    def _search(self, body: dict[str, Any], **params: Any) -> list[Hit]:
        return hits_from_response(self.client.search(index=self.index, body=body, **params))

    def search_bm25(self, query: str, top_n: int) -> list[Hit]:
        return self._search(bm25_body(query, top_n)) if query_terms(query) else []

    def search_knn(self, vector: np.ndarray, top_n: int) -> list[Hit]:
        return self._search(knn_body(vector, top_n))

    def embed_query(self, query: str) -> np.ndarray:
        """The query's unit vector (the DenseRetriever method MMR uses)."""
        if not isinstance(query, str) or not query.strip():
            raise ConfigError("query", "must be a non-empty string")
        if self.encoder is None:
            raise ConfigError("encoder", "this OpenSearch retriever has no bi-encoder")
        return encode_queries(self.encoder, [query])[0]

    def passage_embeddings(self, ids: list[str]) -> np.ndarray:
        """Stored unit vectors of the given passage ids (see `attach_embeddings`)."""
        if self._vecs is None:
            raise ConfigError("opensearch.embeddings", "no local passage vectors attached "
                                                       "(IndexSet attaches them)")
        return self._vecs[[self._row[i] for i in ids]]

    def search_vectors(self, qvecs: np.ndarray, top_n: int) -> list[list[Hit]]:
        """kNN hits for each query vector (the DenseRetriever method)."""
        top_n = check_top_n(top_n)
        return [self.search_knn(v, top_n) for v in np.asarray(qvecs, dtype=np.float32)]

    def search(self, query: str, top_n: int = 10) -> list[Hit]:
        top_n = check_top_n(top_n)
        if self.mode == "bm25":
            return self.search_bm25(query, top_n)
        terms = query_terms(query)  # raises on empty queries, like the local backends
        vec = encode_queries(self.encoder, [query])[0]
        if self.mode == "knn":
            return self.search_knn(vec, top_n)
        if self.hybrid == "server":
            return self._search(hybrid_body(query, vec, top_n),
                                params={"search_pipeline": self.pipeline})
        from rag.fusion import hybrid_fuse

        sparse = self.search_bm25(query, top_n) if terms else []
        return hybrid_fuse(sparse, self.search_knn(vec, top_n), self.fusion_weight,
                           self.normalisation, top_n=top_n)
