"""Dense retrieval: bi-encoder embeddings in a FAISS index (exact flat or HNSW), inner product
on unit vectors (= cosine).

Corpus embeddings are cached on disk by (corpus fingerprint, encoder fingerprint), so rebuilding
an index for the same corpus and model encodes nothing. `device="cuda"` moves the index to the
GPU with faiss-gpu (the `gpu` extra); without it that is an error, never a silent fallback.
The FAISS device can also be chosen on its own, leaving the encoder where it is:
`faiss_device="gpu"`, the `indexes.faiss_device` setting of an IndexSet (rag.index.settings;
config files, the CLI, Serve index directories), or, for every index a process loads (IndexSet,
Serve replicas, the tuner) when neither is set, RAGPILOT_FAISS_DEVICE=cpu|gpu. Errors name the
key that asked for the GPU.
"""

from __future__ import annotations

import json
import os
import shutil
from contextlib import nullcontext
from functools import cache
from pathlib import Path

import numpy as np

from rag import progress
from rag.corpus import Corpus
from rag.encoders import encode_documents, encode_queries
from rag.errors import ConfigError
from rag.index.base import Retriever, check_top_n
from rag.index.settings import FAISS_DEVICE_ENV
from rag.models import cache_dir
from rag.types import Hit

HNSW_M = 32
HNSW_EF_CONSTRUCTION = 80
HNSW_EF_SEARCH = 128


EMBED_CHUNK = 128
"""Passages per encoder call while a corpus is embedded (the unit of its progress count): the
passages go longest first, as the encoder batches them, so chunking adds no padding."""


def embed_corpus(corpus: Corpus, encoder, batch_size: int = 64, show_progress: bool = True,
                 use_cache: bool = True) -> np.ndarray:
    """(len(corpus), dim) unit vectors of "title. text", from the on-disk cache when present.
    Encoded longest first in near-equal chunks of at most `EMBED_CHUNK` passages (one call when
    the corpus is smaller), counted as a `rag.progress` stage unless `show_progress` is False."""
    path = cache_dir() / "embeddings" / f"{corpus.fingerprint()}-{encoder.fingerprint}.npy"
    if use_cache and path.exists():
        vecs = np.load(path)
        if vecs.shape == (len(corpus), encoder.dim):
            return vecs
    texts = [f"{p.title}. {p.text}" if p.title else p.text for p in corpus]
    chunks = -(-len(texts) // EMBED_CHUNK) or 1  # equal sizes: no short tail chunk
    if chunks == 1:
        order = np.arange(len(texts))
    else:
        order = np.argsort([-len(t) for t in texts], kind="stable")
    bounds = np.linspace(0, len(texts), chunks + 1).round().astype(int)
    parts = []
    with progress.stage(f"embed {len(texts)} passages ({getattr(encoder, 'name', 'encoder')})",
                        len(texts), "passages") if show_progress else nullcontext() as st:
        for lo, hi in zip(bounds[:-1], bounds[1:], strict=True):
            parts.append(encode_documents(encoder, [texts[i] for i in order[lo:hi]],
                                          batch_size=batch_size))
            if st is not None:
                st.update(int(hi))
    vecs = parts[0] if len(parts) == 1 else np.concatenate(parts)
    vecs = vecs[np.argsort(order)] if chunks > 1 else vecs  # back to corpus order
    if use_cache:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(".tmp.npy")
        np.save(tmp, vecs)
        tmp.replace(path)
    return vecs


@cache
def _faiss():
    """The faiss module, from exactly one of the `cpu` (faiss-cpu) or `gpu` (faiss-gpu-cu12)
    extras: both share the files of the `faiss` package, so having both is refused."""
    from importlib import metadata

    builds = []
    for dist in ("faiss-cpu", "faiss-gpu-cu12"):
        try:
            metadata.distribution(dist)
            builds.append(dist)
        except metadata.PackageNotFoundError:
            pass
    if len(builds) > 1:
        raise ConfigError("indexes.dense", "faiss-cpu and faiss-gpu-cu12 are both installed and "
                          "overwrite each other's files; keep one (docs/operations.md)")
    try:
        import faiss
    except ModuleNotFoundError:
        raise ConfigError("indexes.dense", "FAISS is not installed: pip install 'ragpilot[cpu]' "
                          "(or 'ragpilot[gpu]' on a GPU machine)") from None

    faiss.omp_set_num_threads(1)  # single-query serving: threads only add overhead here
    return faiss


def _make_index(vecs: np.ndarray, kind: str):
    faiss = _faiss()
    dim = vecs.shape[1]
    if kind == "flat":
        index = faiss.IndexFlatIP(dim)
    elif kind == "hnsw":
        index = faiss.IndexHNSWFlat(dim, HNSW_M, faiss.METRIC_INNER_PRODUCT)
        index.hnsw.efConstruction = HNSW_EF_CONSTRUCTION
    else:
        raise ConfigError("dense_index", f"unknown index {kind!r} (flat | hnsw)")
    index.add(vecs)
    return index


_DEVICES = {"cpu": "cpu", "cuda": "cuda", "gpu": "cuda"}


def faiss_gpu_available() -> bool:
    """True when the installed faiss is a GPU build and sees at least one GPU."""
    faiss = _faiss()
    return hasattr(faiss, "StandardGpuResources") and faiss.get_num_gpus() > 0


def resolve_faiss_device(device: str, faiss_device: str | None = None,
                         faiss_key: str = "faiss_device") -> tuple[str, str]:
    """(cpu | cuda, the key that chose it): `faiss_device` (reported as `faiss_key`), else
    $RAGPILOT_FAISS_DEVICE, else the retriever's `device`."""
    for key, value in ((faiss_key, faiss_device),
                       (FAISS_DEVICE_ENV, os.environ.get(FAISS_DEVICE_ENV) or None),
                       ("device", device)):
        if value is not None:
            if value not in _DEVICES:
                raise ConfigError(key, f"unknown device {value!r} (cpu | gpu | cuda)")
            return _DEVICES[value], key
    return "cpu", "device"


def _to_device(index, device: str, key: str = "device", kind: str = "flat"):
    if _DEVICES.get(device, device) == "cpu":
        return index
    faiss = _faiss()
    if device not in _DEVICES:
        raise ConfigError(key, f"unknown device {device!r} (cpu | gpu | cuda)")
    if kind == "hnsw":
        raise ConfigError(key, "faiss has no GPU HNSW index: use dense_index flat on the GPU "
                               "(exact search, fast there) or this key = cpu")
    if not faiss_gpu_available():
        raise ConfigError(key, f"{device} requested but this faiss has no GPU support or sees "
                               "no GPU; install the gpu extra (faiss-gpu-cu12) or set "
                               f"{key} to cpu")
    return faiss.index_cpu_to_gpu(faiss.StandardGpuResources(), 0, index)


class DenseRetriever(Retriever):
    """FAISS search over unit-length passage embeddings."""

    kind = "dense"

    def __init__(self, index, vecs: np.ndarray, ids: list[str], encoder, index_kind: str,
                 device: str = "cpu", faiss_device: str | None = None,
                 faiss_key: str = "faiss_device"):
        self._cpu_index = index
        self.faiss_device, key = resolve_faiss_device(device, faiss_device, faiss_key)
        self._index = _to_device(index, self.faiss_device, key, index_kind)
        self._vecs = vecs
        self._ids = ids
        self._row = {pid: i for i, pid in enumerate(ids)}
        self.encoder = encoder
        self.index_kind = index_kind
        self.device = device
        if index_kind == "hnsw" and self.faiss_device == "cpu":
            self._index.hnsw.efSearch = HNSW_EF_SEARCH

    @classmethod
    def build(cls, corpus: Corpus, encoder, index: str = "flat",
              directory: str | Path | None = None, batch_size: int = 64,
              show_progress: bool = True, device: str = "cpu", faiss_device: str | None = None,
              faiss_key: str = "faiss_device") -> DenseRetriever:
        vecs = embed_corpus(corpus, encoder, batch_size=batch_size, show_progress=show_progress)
        r = cls(_make_index(vecs, index), vecs, corpus.ids, encoder, index, device=device,
                faiss_device=faiss_device, faiss_key=faiss_key)
        if directory:
            r.save(directory)
        return r

    def save(self, directory: str | Path) -> None:
        d = Path(directory)
        if d.exists():
            shutil.rmtree(d)
        d.mkdir(parents=True)
        _faiss().write_index(self._cpu_index, str(d / "index.faiss"))
        np.save(d / "embeddings.npy", self._vecs)
        (d / "meta.json").write_text(json.dumps({"ids": self._ids, "index": self.index_kind,
                                                 "encoder": self.encoder.name,
                                                 "encoder_fingerprint":
                                                     self.encoder.fingerprint}))

    @classmethod
    def load(cls, directory: str | Path, encoder=None, device: str = "cpu",
             faiss_device: str | None = None, faiss_key: str = "faiss_device"
             ) -> DenseRetriever:
        d = Path(directory)
        if not (d / "meta.json").exists():
            raise ConfigError("dense", f"{d} holds no dense index (meta.json missing)")
        meta = json.loads((d / "meta.json").read_text())
        if encoder is None:
            from rag.encoders import Encoder

            encoder = Encoder.from_registry(meta["encoder"], device=device)
        if encoder.fingerprint != meta["encoder_fingerprint"]:
            raise ConfigError("encoder", f"index in {d} was built with another encoder "
                                         f"({meta['encoder']}); rebuild it")
        index = _faiss().read_index(str(d / "index.faiss"))
        return cls(index, np.load(d / "embeddings.npy"), meta["ids"], encoder, meta["index"],
                   device=device, faiss_device=faiss_device, faiss_key=faiss_key)

    # ---- queries ------------------------------------------------------------------------
    def embed_query(self, query: str) -> np.ndarray:
        if not isinstance(query, str) or not query.strip():
            raise ConfigError("query", "must be a non-empty string")
        return encode_queries(self.encoder, [query])[0]

    def passage_embeddings(self, ids: list[str]) -> np.ndarray:
        """Stored unit vectors of the given passage ids, in that order."""
        return self._vecs[[self._row[i] for i in ids]]

    def search_vectors(self, qvecs: np.ndarray, top_n: int) -> list[list[Hit]]:
        top_n = check_top_n(top_n)
        scores, rows = self._index.search(np.ascontiguousarray(qvecs, dtype=np.float32),
                                          min(top_n, len(self._ids)))
        return [[Hit(float(s), self._ids[r]) for s, r in zip(srow, rrow, strict=True) if r >= 0]
                for srow, rrow in zip(scores, rows, strict=True)]

    def search(self, query: str, top_n: int = 10) -> list[Hit]:
        check_top_n(top_n)
        return self.search_vectors(self.embed_query(query)[None, :], top_n)[0]

    def search_batch(self, queries, top_n: int = 10) -> list[list[Hit]]:
        check_top_n(top_n)
        for q in queries:
            if not isinstance(q, str) or not q.strip():
                raise ConfigError("query", "must be a non-empty string")
        return self.search_vectors(encode_queries(self.encoder, list(queries)), top_n)
