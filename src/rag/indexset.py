"""All candidate indexes of one corpus, in one directory, built once and reloaded lazily.

Layout under `root`:
    corpus.jsonl          the passages (ids are what every index returns)
    manifest.json         dataset manifest: inputs + sha256, counts, encoder, `indexes` (the
                          backend settings, rag.index.settings; the URL without credentials)
    bm25-tantivy/ bm25-bm25s/ dense-flat/ dense-hnsw/ graph/ opensearch/

An index a config asks for that was not built yet is built on first use and persisted (dense
indexes reuse the cached corpus embeddings, so that is cheap).

Backends (`indexes:` settings, rag.index.settings; stored at `create` and reused by `open`, which
may change where they run but not which they are): lexical candidates from tantivy/bm25s (as the
RAGConfig's `bm25_backend` says, or pinned) or OpenSearch BM25; dense candidates from FAISS
(`dense_index` flat | hnsw, on `faiss_device`) or OpenSearch kNN. Both OpenSearch modes share one
OpenSearch index, `<index_prefix>-<corpus fingerprint>`, built on first use. What the settings
ask is checked when the set is created or opened: a GPU faiss build for `faiss_device: gpu`, a
reachable cluster for OpenSearch; each failure is a ConfigError naming the key, never a fallback.
"""

from __future__ import annotations

import json
import os
import threading
import time
from contextlib import nullcontext
from pathlib import Path
from typing import Any

from rag import progress
from rag.corpus import Corpus
from rag.errors import ConfigError, CorpusMismatchError, DataError
from rag.index.base import Retriever
from rag.index.settings import FAISS_DEVICE_ENV, SECTION, IndexSettings, coerce, public_url
from rag.index.settings import OPENSEARCH_URL_ENV as URL_ENV

FAISS_DEVICE_KEY = f"{SECTION}.faiss_device"
OPENSEARCH_URL_KEY = f"{SECTION}.opensearch.url"


def _read_manifest(root: Path) -> dict[str, Any]:
    """An index directory's manifest.json; missing or not a JSON object is a DataError naming
    the directory (a hand-edited or half-copied directory was a traceback)."""
    path = root / "manifest.json"
    if not path.is_file():
        raise DataError(str(root), "has corpus.jsonl but no manifest.json: not a complete index "
                                   "directory; run `ragpilot index` again")
    try:
        manifest = json.loads(path.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise DataError(str(path), f"not JSON ({exc})") from None
    if not isinstance(manifest, dict):
        raise DataError(str(path), "expected a JSON object")
    return manifest


class IndexSet:
    """Lazily-loaded retrievers over one corpus. Thread-safe for loading."""

    def __init__(self, root: str | Path, corpus: Corpus, encoder: str = "minilm",
                 device: str = "cpu", show_progress: bool = True,
                 indexes: IndexSettings | dict[str, Any] | None = None):
        """`show_progress`: builds and loads report as `rag.progress` stages (shown only where
        an entry point turned progress on); False keeps this set silent."""
        self.root = Path(root)
        self.corpus = corpus
        self.encoder_name = encoder
        self.device = device
        self.show_progress = show_progress
        self.settings = coerce(indexes)
        self._cache: dict[str, Any] = {}
        self._lock = threading.RLock()
        self.build_seconds: dict[str, float] = {}
        self._os_client = None
        self._check_backends()

    # ---- construction ---------------------------------------------------------------------
    @classmethod
    def create(cls, corpus: Corpus, root: str | Path, encoder: str = "minilm",
               manifest: dict[str, Any] | None = None, device: str = "cpu",
               show_progress: bool = True,
               indexes: IndexSettings | dict[str, Any] | None = None) -> IndexSet:
        """Write the corpus and manifest (with the backend settings `indexes`) under `root`;
        indexes are built on demand. The settings are checked before anything is written. A
        `root` that already holds an index must hold this corpus's (its built indexes are
        reused); another corpus's, or an empty corpus, is a DataError and nothing is
        written."""
        settings = coerce(indexes)
        root = Path(root)
        if len(corpus) == 0:
            raise DataError(str(root), "the corpus has no passages: nothing to index")
        if (root / "manifest.json").is_file():  # its sub-indexes would be reused: they
            had = _read_manifest(root).get("corpus_fingerprint")  # must be of this corpus
            if had != corpus.fingerprint():
                raise DataError(str(root), f"holds the index of another corpus (fingerprint "
                                           f"{had}, this one {corpus.fingerprint()}); index "
                                           "into a new directory, or delete this one first")
        idx = cls(root, corpus, encoder=encoder, device=device, show_progress=show_progress,
                  indexes=settings)
        root.mkdir(parents=True, exist_ok=True)
        corpus.save(root / "corpus.jsonl")
        meta = dict(manifest or {})
        stored = settings.to_manifest()
        if settings.uses_opensearch:
            stored["opensearch"]["url"] = public_url(idx.opensearch_url()[0])
        meta.update({"corpus_fingerprint": corpus.fingerprint(), "passages": len(corpus),
                     "encoder": encoder, SECTION: stored})
        (root / "manifest.json").write_text(json.dumps(meta, indent=2, sort_keys=True))
        return idx

    @classmethod
    def open(cls, root: str | Path, device: str = "cpu", show_progress: bool = True,
             indexes: IndexSettings | dict[str, Any] | None = None) -> IndexSet:
        """Reopen `root` with the backend settings stored in its manifest (directories made
        before they were stored: the defaults), so it is served by the backends it was built
        for. `indexes` may change where they run, for this process only (`faiss_device`,
        `opensearch.url|timeout_s|verify_tls`); naming another backend (`lexical`, `dense`,
        `opensearch.index_prefix`) is a ConfigError: index into a new directory instead.
        Precedence of the FAISS device and the OpenSearch URL: `indexes` > the environment
        ($RAGPILOT_FAISS_DEVICE, $RAGPILOT_OPENSEARCH_URL) > the manifest."""
        root = Path(root)
        if not (root / "corpus.jsonl").exists():
            raise DataError(str(root), "not an index directory (no corpus.jsonl); run "
                                       "`ragpilot index` first")
        manifest = _read_manifest(root)
        corpus = Corpus.load(root / "corpus.jsonl")
        built = manifest.get("corpus_fingerprint")
        if built is not None and built != corpus.fingerprint():
            raise DataError(str(root), f"corpus.jsonl (fingerprint {corpus.fingerprint()}) is "
                                       f"not the corpus this directory was indexed from "
                                       f"({built}): its indexes would return ids it does not "
                                       "hold; index again into a new directory")
        if len(corpus) == 0:
            raise DataError(str(root), "the index holds no passages; index a non-empty corpus")
        stored = stored_settings(root, manifest)
        given = coerce(indexes) if indexes is not None else IndexSettings()
        check_same_backends(root, stored, given)
        over = given.model_dump(mode="json", exclude_unset=True)
        over_os = over.get("opensearch", {})
        if over.get("faiss_device") is None:  # null defers: environment, else manifest
            over.pop("faiss_device", None)
        if over_os.get("url") is None:
            over_os.pop("url", None)
        settings = stored.overridden(over)
        if "faiss_device" not in over and os.environ.get(FAISS_DEVICE_ENV):
            settings = settings.overridden({"faiss_device": None})
        if "url" not in over_os and os.environ.get(URL_ENV):
            settings = settings.overridden({"opensearch": {"url": None}})
        return cls(root, corpus, encoder=manifest.get("encoder", "minilm"), device=device,
                   show_progress=show_progress, indexes=settings)

    def check_corpus(self, corpus: Corpus, dataset: str) -> None:
        """Refuse to serve `dataset` from an index of another corpus: CorpusMismatchError (both
        fingerprints) unless the fingerprint recorded at build time (or, for directories made
        before it was recorded, the stored corpus's) equals `corpus.fingerprint()`."""
        built = self.manifest.get("corpus_fingerprint") or self.corpus.fingerprint()
        if built != corpus.fingerprint():
            raise CorpusMismatchError(str(self.root), built, corpus.fingerprint(), dataset)

    @property
    def manifest(self) -> dict[str, Any]:
        return _read_manifest(self.root)

    def build_all(self, bm25: tuple[str, ...] | None = None, dense: tuple[str, ...] = ("flat",),
                  graph: bool = True) -> dict[str, float]:
        """Build (or load) the named indexes now; returns seconds spent per index. `bm25=None`:
        the lexical backend of the settings (tantivy when they leave it to the config)."""
        bm25 = tuple(bm25) if bm25 else (self.default_bm25_backend(),)
        for b in bm25:
            self.bm25(b)
        for d in dense:
            self.dense(d)
        if graph:
            self.graph(bm25[0], dense[0] if dense else "flat")
        return dict(self.build_seconds)

    def default_bm25_backend(self) -> str:
        lex = self.settings.lexical
        return lex if lex in ("tantivy", "bm25s") else "tantivy"

    # ---- backend checks ---------------------------------------------------------------------
    def _check_backends(self) -> None:
        """Fail now, naming the key, when the settings ask for what this machine lacks."""
        s = self.settings
        if s.dense == "faiss" and (s.faiss_device or os.environ.get(FAISS_DEVICE_ENV)):
            from rag.index.dense import faiss_gpu_available, resolve_faiss_device

            device, key = resolve_faiss_device("cpu", s.faiss_device, FAISS_DEVICE_KEY)
            if device == "cuda" and not faiss_gpu_available():
                raise ConfigError(key, "gpu requested but this faiss has no GPU support or "
                                       "sees no GPU; install the gpu extra (faiss-gpu-cu12, "
                                       f"docs/operations.md) or set {key} to cpu")
        if s.uses_opensearch:
            self.opensearch_client()

    def opensearch_url(self) -> tuple[str, str]:
        """(URL, the key it came from): `indexes.opensearch.url`, else $RAGPILOT_OPENSEARCH_URL."""
        if self.settings.opensearch.url:
            return self.settings.opensearch.url, OPENSEARCH_URL_KEY
        if os.environ.get(URL_ENV):
            return os.environ[URL_ENV], URL_ENV
        raise ConfigError(OPENSEARCH_URL_KEY, "OpenSearch is selected (indexes.lexical="
                          f"{self.settings.lexical}, indexes.dense={self.settings.dense}) but "
                          f"no URL is set: give indexes.opensearch.url or {URL_ENV}")

    def opensearch_client(self):
        """The checked opensearch-py client of the settings (connects once per index set):
        OpenSearchUnreachable (a ConfigError) naming the URL's key when it does not answer."""
        from rag.index.opensearch import check_reachable, connect

        with self._lock:
            if self._os_client is None:
                o = self.settings.opensearch
                url, key = self.opensearch_url()
                client = connect(url, timeout=o.timeout_s, key=key,
                                 verify=None if o.verify_tls else False)
                check_reachable(client, url, key, timeout=min(o.timeout_s, 10.0))
                self._os_client = client
            return self._os_client

    # ---- accessors ----------------------------------------------------------------------
    def encoder(self):
        from rag.encoders import Encoder

        return Encoder.from_registry(self.encoder_name, device=self.device)

    def bm25(self, backend: str = "tantivy") -> Retriever:
        """Lexical candidates: the local `backend` (a RAGConfig's bm25_backend), or OpenSearch
        BM25 when the settings say `lexical: opensearch`."""
        from rag.index.bm25 import BM25sRetriever, TantivyBM25

        lex = self.settings.lexical
        if lex == "opensearch":
            return self._opensearch("bm25")
        classes = {"tantivy": TantivyBM25, "bm25s": BM25sRetriever}
        if backend not in classes:
            raise ConfigError("bm25_backend", f"unknown backend {backend!r}")
        if lex is not None and backend != lex:
            raise ConfigError(f"{SECTION}.lexical", f"this index set serves lexical retrieval "
                              f"with {lex}, but the pipeline config asks for bm25_backend="
                              f"{backend}: set bm25_backend: {lex} or drop indexes.lexical")
        cls = classes[backend]
        return self._get(f"bm25-{backend}", lambda d: cls.load(d),
                         lambda d: cls.build(self.corpus, directory=d))

    def dense(self, kind: str = "flat"):
        """Dense candidates: FAISS `kind` (flat | hnsw) on the configured FAISS device, or
        OpenSearch kNN when the settings say `dense: opensearch`."""
        from rag.index.dense import DenseRetriever

        if kind not in ("flat", "hnsw"):
            raise ConfigError("dense_index", f"unknown index {kind!r}")
        if self.settings.dense == "opensearch":
            return self._opensearch("knn")
        fd = self.settings.faiss_device
        return self._get(
            f"dense-{kind}",
            lambda d: DenseRetriever.load(d, encoder=self.encoder(), device=self.device,
                                          faiss_device=fd, faiss_key=FAISS_DEVICE_KEY),
            lambda d: DenseRetriever.build(self.corpus, self.encoder(), index=kind, directory=d,
                                           show_progress=self.show_progress, device=self.device,
                                           faiss_device=fd, faiss_key=FAISS_DEVICE_KEY),
        )

    def _opensearch(self, mode: str):
        """The OpenSearch retriever in `mode` (bm25 | knn) over this corpus's OpenSearch index,
        which is (re)built on first use when the cluster lacks it or holds another count."""
        from rag.index.dense import embed_corpus
        from rag.index.opensearch import OpenSearchRetriever

        key = f"opensearch@{mode}"
        with self._lock:
            if key in self._cache:
                return self._cache[key]
            client = self.opensearch_client()
            name = self.settings.opensearch.index_name(self.corpus.fingerprint())
            url = self.opensearch_url()[0]

            def build(d):
                return OpenSearchRetriever.build(self.corpus, self.encoder(), url=url,
                                                 index=name, mode=mode, client=client,
                                                 directory=d)

            def load(d):
                r = OpenSearchRetriever.load(d, client=client, encoder=self.encoder())
                if (r.index != name or not client.indices.exists(index=name)
                        or client.count(index=name)["count"] != len(self.corpus)):
                    t0 = time.perf_counter()
                    r = build(d)
                    self.build_seconds["opensearch"] = time.perf_counter() - t0
                return r

            base = self._get("opensearch", load, build)
            view = base.with_mode(mode)
            if mode == "knn":
                view.attach_embeddings(embed_corpus(self.corpus, view.encoder),
                                       self.corpus.ids)
            self._cache[key] = view
            return view

    def graph(self, bm25_backend: str | None = None, dense_kind: str = "flat"):
        """The entity graph, seeded by this set's bm25 and dense retrievers."""
        from rag.index.graph import GraphRetriever

        bm25_backend = bm25_backend or self.default_bm25_backend()
        seeds = [self.bm25(bm25_backend), self.dense(dense_kind)]
        g = self._get("graph", lambda d: GraphRetriever.load(d),
                      lambda d: GraphRetriever.build(self.corpus, directory=d))
        key = f"graph@{bm25_backend}+{dense_kind}"
        with self._lock:
            if key not in self._cache:
                self._cache[key] = g.with_seeds(seeds)
            return self._cache[key]

    def _get(self, name: str, load, build):
        """The retriever `name`: cached, else loaded from `root`/name, else built there (its
        seconds in `build_seconds`); a load or build is a progress stage."""
        with self._lock:
            if name not in self._cache:
                d = self.root / name
                built = d.exists() and any(d.iterdir())
                what = (f"{'load' if built else 'build'} index {name} "
                        f"({len(self.corpus)} passages)")
                with progress.stage(what) if self.show_progress else nullcontext():
                    if built:
                        self._cache[name] = load(d)
                    else:
                        t0 = time.perf_counter()
                        self._cache[name] = build(d)
                        self.build_seconds[name] = time.perf_counter() - t0
            return self._cache[name]


def stored_settings(root: str | Path, manifest: dict[str, Any]) -> IndexSettings:
    """The backend settings in an index directory's manifest (defaults when it has none)."""
    try:
        return IndexSettings.from_dict(manifest.get(SECTION), SECTION)
    except ConfigError as exc:
        raise DataError(str(Path(root) / "manifest.json"), str(exc)) from None


def check_same_backends(root: str | Path, stored: IndexSettings, given: IndexSettings) -> None:
    """ConfigError when `given` explicitly names another backend than the directory's."""
    pairs = [(k, getattr(stored, k), getattr(given, k)) for k in ("lexical", "dense")
             if k in given.model_fields_set]
    if "index_prefix" in given.opensearch.model_fields_set:
        pairs.append(("opensearch.index_prefix", stored.opensearch.index_prefix,
                      given.opensearch.index_prefix))
    for key, was, now in pairs:
        if was != now:
            raise ConfigError(f"{SECTION}.{key}", f"{root} was indexed with {key}: "
                              f"{json.dumps(was)}, this config says {json.dumps(now)}; index "
                              "into a new directory (`ragpilot index --config ...`) or drop the "
                              "key")
