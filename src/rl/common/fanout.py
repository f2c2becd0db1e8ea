"""Evaluation and dense-index encoding as Ray tasks: `ragpilot eval` and
`ragpilot index` with `--workers N` or a cluster address.

    evaluate_fanout(spec, examples, workers)  -> (rag.evaluate.EvalResult, FanoutInfo)
    RayDocumentEncoder(encoder name, workers)  -> `encode(texts, batch_size)` over Ray tasks
    prime_embeddings(corpus, encoder, encode)  -> the corpus vectors, encoded by `encode`, put
                                                  where the FAISS build reads them

Contract: the same outputs as in-process for the same inputs. The work splits into contiguous
shards whose boundaries fall on multiples of the batch size, so every generator batch (eval) and
encoder batch (index) holds exactly the texts it holds in one process; results come back in
order (shard i before shard i+1). Each task asks for 1 CPU and tasks are spread over the nodes
(`SPREAD`). Latencies differ (they are measured where the task ran); nothing else does.

An eval task builds its Pipeline on its node from an `EvalSpec` (dataset, index directory,
index settings, config: plain data): it opens `spec.index_root` when that directory is there
(shared storage, or the same machine), else creates the dataset's index set under this node's
cache (`$RAGPILOT_CACHE/indexes/fanout/<corpus fingerprint>-<encoder>`). The Pipeline is kept
per worker process and the index directories on the node's disk, so later tasks there load
instead of building; a file lock keeps two processes of one node from building one directory
at once.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

LOCK_NAME = ".fanout.lock"


def shard_bounds(n: int, shards: int, align: int) -> list[tuple[int, int]]:
    """Split range(n) into at most `shards` contiguous, non-empty (start, stop) pieces whose
    inner boundaries are multiples of `align` (>= 1), as even as that allows; [] for n = 0."""
    if n <= 0:
        return []
    align = max(1, align)
    blocks = -(-n // align)
    shards = max(1, min(shards, blocks))
    base, extra = divmod(blocks, shards)
    out, start = [], 0
    for i in range(shards):
        stop = min(n, start + (base + (i < extra)) * align)
        out.append((start, stop))
        start = stop
    return out


def _ray(address: str | None):
    from rl.common.runtime import init_ray

    init_ray(address=address)
    import ray

    return ray


def _worker_count(ray, workers: int | None) -> int:
    """`workers` (>= 1), or 0/None = one per CPU the cluster offers."""
    if workers:
        return workers
    return max(1, int(ray.cluster_resources().get("CPU", 1)))


def _node_id() -> str:
    import ray

    return ray.get_runtime_context().get_node_id()


@contextlib.contextmanager
def _dir_lock(root: Path) -> Iterator[None]:
    """An exclusive lock on `root` between the processes of one node (fcntl)."""
    root.mkdir(parents=True, exist_ok=True)
    with (root / LOCK_NAME).open("w") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def _gather(ray, refs: list, progress: Callable[[int], None] | None) -> list:
    """ray.get of `refs` in their order; `progress(k)` as the k-th finishes."""
    if progress is not None:
        pending, done = list(refs), 0
        while pending:
            ready, pending = ray.wait(pending, num_returns=1)
            done += len(ready)
            progress(done)
    return ray.get(refs)


# ---- evaluation -------------------------------------------------------------------------------
@dataclass(frozen=True)
class EvalSpec:
    """What an eval task needs to build the Pipeline on its node (plain, picklable data)."""

    dataset: str
    """A dataset name or a path `rag.corpus.loaders.load_dataset` reads (for the corpus when
    `index_root` is not on the task's node)."""
    config: dict[str, Any]
    """The RAGConfig as `model_dump(mode="json")`."""
    index_root: str | None = None
    """An index directory (`ragpilot index`); used where it exists, else one is built."""
    indexes: Any = None
    """The `indexes:` settings (rag.index.settings.IndexSettings) or None."""
    batch_size: int = 8
    """Questions per generator batch (`Pipeline.run_batch`); shards align to it."""


@dataclass
class FanoutInfo:
    """Where the work ran: per shard (start, stop, node id, seconds), and the totals."""

    shards: list[dict[str, Any]] = field(default_factory=list)

    @property
    def nodes(self) -> list[str]:
        return sorted({s["node_id"] for s in self.shards})

    def to_dict(self) -> dict[str, Any]:
        return {"workers": len(self.shards), "nodes_used": len(self.nodes),
                "shards": self.shards}


_PIPELINES: dict[tuple, Any] = {}


def _pipeline(spec: EvalSpec):
    """This process's Pipeline for `spec` (built once, indexes loaded or built on this node)."""
    from rag.config import RAGConfig
    from rag.indexset import IndexSet
    from rag.pipeline import Pipeline

    cfg = RAGConfig.from_dict(spec.config)
    key = (spec.dataset, spec.index_root, repr(spec.indexes), cfg.config_hash)
    if key not in _PIPELINES:
        root = Path(spec.index_root) if spec.index_root else None
        if root is not None and (root / "corpus.jsonl").exists():
            indexes = IndexSet.open(root, indexes=spec.indexes)
        else:
            from rag.corpus.loaders import load_dataset
            from rag.models import cache_dir

            corpus = load_dataset(spec.dataset).corpus
            root = (cache_dir() / "indexes" / "fanout"
                    / f"{corpus.fingerprint()[:16]}-{cfg.encoder}")
            with _dir_lock(root):
                indexes = (IndexSet.open(root, indexes=spec.indexes)
                           if (root / "corpus.jsonl").exists()
                           else IndexSet.create(corpus, root, encoder=cfg.encoder,
                                                show_progress=False, indexes=spec.indexes))
        _PIPELINES[key] = (Pipeline(indexes, cfg), root)
    return _PIPELINES[key]


def eval_shard(spec: EvalSpec, examples: Sequence[Any]) -> dict[str, Any]:
    """Answer and score `examples` with the spec's Pipeline (the body of one Ray task):
    {"answers", "rows", "model_load_s", "wall_s", "node_id"}. Models and indexes are loaded
    (under the node's lock: the first task there may build them) before the timed part, as
    `rag.evaluate.evaluate` does."""
    from rag.evaluate import score_answers

    t_load = time.perf_counter()
    pipe, root = _pipeline(spec)
    if examples:
        pipe.load_models()
        with _dir_lock(root):
            pipe.retrieve(examples[0].question.strip())  # warm-up: builds/loads indexes
    load_s = time.perf_counter() - t_load
    t0 = time.perf_counter()
    answers = pipe.run_batch([e.question for e in examples], [e.id for e in examples],
                             batch_size=spec.batch_size)
    wall = time.perf_counter() - t0
    return {"answers": answers, "rows": score_answers(answers, examples, pipe.config.k),
            "model_load_s": load_s, "wall_s": wall, "node_id": _node_id()}


def evaluate_fanout(spec: EvalSpec, examples: Sequence[Any], workers: int | None = None,
                    ray_address: str | None = None,
                    progress: Callable[[int, int], None] | None = None):
    """`rag.evaluate.evaluate` over Ray tasks: `examples` split into `workers` shards (None/0:
    one per CPU of the cluster) aligned on `spec.batch_size`, one task each (1 CPU, spread
    over the nodes), merged in query order. Returns (EvalResult, FanoutInfo); the summary
    has the same keys as in-process (`wall_s`: the driver's wall time of the tasks;
    `model_load_s`: the slowest task's load) plus `workers` and `nodes_used`.
    `progress(shards done, shards)`; `ray_address`: the cluster (default $RAY_ADDRESS, else
    a local runtime)."""
    from rag.config import RAGConfig
    from rag.evaluate import EvalResult, summarize

    ray = _ray(ray_address)
    bounds = shard_bounds(len(examples), _worker_count(ray, workers), spec.batch_size)
    task = ray.remote(num_cpus=1, scheduling_strategy="SPREAD")(eval_shard)
    t0 = time.perf_counter()
    refs = [task.remote(spec, list(examples[a:b])) for a, b in bounds]
    parts = _gather(ray, refs, None if progress is None
                    else (lambda k: progress(k, len(refs))))
    wall = time.perf_counter() - t0
    answers = [a for p in parts for a in p["answers"]]
    rows = [r for p in parts for r in p["rows"]]
    info = FanoutInfo([{"start": a, "stop": b, "node_id": p["node_id"],
                        "wall_s": p["wall_s"], "model_load_s": p["model_load_s"]}
                       for (a, b), p in zip(bounds, parts, strict=True)])
    summary = summarize(answers, rows, wall_s=wall,
                        model_load_s=max((p["model_load_s"] for p in parts), default=0.0))
    summary.update({"workers": len(bounds), "nodes_used": len(info.nodes)})
    return EvalResult(RAGConfig.from_dict(spec.config), answers, rows, summary), info


# ---- dense index encoding -----------------------------------------------------------------------
def encode_shard(encoder_name: str, texts: Sequence[str], batch_size: int,
                 device: str = "cpu") -> dict[str, Any]:
    """Passage vectors of `texts` with the registered encoder `encoder_name`, loaded once per
    worker process (`Encoder.from_registry`): {"vectors", "node_id", "fingerprint"}."""
    from rag.encoders import Encoder, encode_documents

    enc = Encoder.from_registry(encoder_name, device=device)
    return {"vectors": encode_documents(enc, list(texts), batch_size=batch_size),
            "node_id": _node_id(), "fingerprint": enc.fingerprint}


def passage_texts(corpus: Any) -> list[str]:
    """What a passage's dense vector encodes: "title. text" (the text alone when untitled),
    as `rag.index.dense.embed_corpus` builds it (tests/test_eval_fanout.py checks both agree)."""
    return [f"{p.title}. {p.text}" if p.title else p.text for p in corpus]


def embedding_cache_path(corpus: Any, encoder: Any) -> Path:
    """The file `rag.index.dense.embed_corpus` reads a corpus's vectors from (its formula)."""
    from rag.index import dense

    # through the dense module's own name, so whatever cache dir it sees is the one used here
    return dense.cache_dir() / "embeddings" / f"{corpus.fingerprint()}-{encoder.fingerprint}.npy"


def prime_embeddings(corpus: Any, encoder: Any, encode: Callable[..., np.ndarray],
                     batch_size: int = 64) -> bool:
    """Encode `corpus` with `encode` (e.g. a RayDocumentEncoder) and store the vectors where
    the FAISS build (`rag.index.dense.embed_corpus`, called by `IndexSet.dense`) reads them, so
    the index is built from them without encoding in this process. `encoder`: the driver's
    encoder of the index (its fingerprint and dim name the file). False, doing nothing, when
    the file is already there with the right shape. The dense module itself is not changed:
    its code is part of the tuner's retrieval-cache fingerprint (rl.common.memo)."""
    path = embedding_cache_path(corpus, encoder)
    if path.exists() and np.load(path, mmap_mode="r").shape == (len(corpus), encoder.dim):
        return False
    vecs = np.ascontiguousarray(encode(passage_texts(corpus), batch_size), dtype=np.float32)
    if vecs.shape != (len(corpus), encoder.dim):
        raise ValueError(f"encode returned {vecs.shape}, expected {(len(corpus), encoder.dim)}")
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(f".{os.getpid()}.tmp.npy")
    np.save(tmp, vecs)
    tmp.replace(path)  # atomic: a concurrent reader sees the old file or the whole new one
    return True


class RayDocumentEncoder:
    """`encode(texts, batch_size) -> (n, dim) float32` over Ray tasks (`prime_embeddings`
    stores them for the FAISS build): the texts split into `workers` shards (None/0: one per CPU of the cluster) aligned on `batch_size`,
    each encoded by `encoder_name` on its node, concatenated in order. Each call appends its
    FanoutInfo to `runs`. A node whose weights differ (another encoder fingerprint than
    `fingerprint`, when given) is an error: its vectors would not match the index's model."""

    def __init__(self, encoder_name: str, workers: int | None = None,
                 ray_address: str | None = None, device: str = "cpu",
                 fingerprint: str | None = None):
        self.encoder_name, self.workers, self.device = encoder_name, workers, device
        self.ray_address, self.fingerprint = ray_address, fingerprint
        self.runs: list[FanoutInfo] = []

    def __call__(self, texts: Sequence[str], batch_size: int = 64) -> np.ndarray:
        ray = _ray(self.ray_address)
        bounds = shard_bounds(len(texts), _worker_count(ray, self.workers), batch_size)
        task = ray.remote(num_cpus=1, scheduling_strategy="SPREAD")(encode_shard)
        t0 = time.perf_counter()
        parts = ray.get([task.remote(self.encoder_name, list(texts[a:b]), batch_size,
                                     self.device) for a, b in bounds])
        wall = time.perf_counter() - t0
        for p in parts:
            if self.fingerprint and p["fingerprint"] != self.fingerprint:
                raise RuntimeError(f"node {p['node_id']} loaded {self.encoder_name} with "
                                   f"fingerprint {p['fingerprint']}, the driver has "
                                   f"{self.fingerprint}: install the same weights there")
        self.runs.append(FanoutInfo([{"start": a, "stop": b, "node_id": p["node_id"],
                                      "wall_s": wall} for (a, b), p in
                                     zip(bounds, parts, strict=True)]))
        if not parts:
            return np.zeros((0, 0), dtype=np.float32)
        return np.ascontiguousarray(np.concatenate([p["vectors"] for p in parts]),
                                    dtype=np.float32)
