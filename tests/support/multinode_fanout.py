"""`ragpilot eval` and dense index encoding fanned out over a real two-node Ray cluster
(rl.common.fanout), each compared with the same work in one process: the pieces
tests/support/multinode.py (the test's cluster session) and bench/cluster.py (rows
eval-2-nodes / index-2-nodes) run.

- `prepare(root)` (before the cluster, in the driver: "1 node"): the synthetic world's indexes
  under `root` (bm25s, dense flat), the evaluation of every question (RAGConfig
  `variant=hybrid`), and the corpus vectors encoded by MiniLM;
- `run_eval(prep)`: `evaluate_fanout` with 2 workers (1 CPU each, SPREAD: one per node), every
  task opening the prepared index directory;
- `run_index(prep)`: `RayDocumentEncoder` with 2 workers over the corpus texts, then a FAISS
  flat index of the vectors.

Each reports the nodes that ran the tasks, whether the outputs equal the in-process ones (eval:
every answer, citation, context, candidate, token count and metric row; index: vectors allclose
1e-6, byte equality reported apart, the same top-10 for every passage as a query, the same
fingerprints), and wall seconds.
"""


from __future__ import annotations

import json
import sys
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
sys.path[:0] = [str(REPO / "src"), str(REPO)]

DATASET = "synthetic"
WORKERS = 2
CONFIG = {"variant": "hybrid", "bm25_backend": "bm25s"}
ENCODE_BATCH = 64


def _answer_record(a: Any) -> tuple:
    """Everything of an Answer but its latencies."""
    return (a.query_id, a.question, a.text, tuple(a.citations),
            tuple(json.dumps(c.to_dict(), sort_keys=True) for c in a.contexts),
            tuple(json.dumps(h.to_dict(), sort_keys=True) for h in a.candidates),
            a.tokens_in, a.tokens_out, a.config_hash, a.raw)


def prepare(root: Path) -> dict[str, Any]:
    """Step 1 (before the cluster): the in-process results the cluster runs are compared to."""
    from rag.config import RAGConfig
    from rag.corpus.loaders import load_dataset
    from rag.encoders import encode_documents
    from rag.evaluate import evaluate
    from rag.indexset import IndexSet
    from rag.pipeline import Pipeline
    from rl.common.fanout import passage_texts

    ds = load_dataset(DATASET)
    cfg = RAGConfig().replace(**CONFIG)
    idx = IndexSet.create(ds.corpus, root / "index", encoder=cfg.encoder, show_progress=False)
    # built before the clock starts: the tasks load these, so neither side's wall time
    # includes an index build (both include loading the models)
    idx.build_all(bm25=(cfg.bm25_backend,), dense=(cfg.dense_index,), graph=False)
    t0 = time.perf_counter()
    local = evaluate(Pipeline(idx, cfg), ds.examples)
    eval_s = time.perf_counter() - t0
    texts = passage_texts(ds.corpus)
    t0 = time.perf_counter()
    vecs = encode_documents(idx.encoder(), texts, batch_size=ENCODE_BATCH)
    return {"ds": ds, "cfg": cfg, "index": idx, "eval": local, "eval_s": eval_s,
            "texts": texts, "vectors": vecs, "encode_s": time.perf_counter() - t0}


def run_eval(prep: dict[str, Any]) -> dict[str, Any]:
    from rl.common.fanout import EvalSpec, evaluate_fanout

    spec = EvalSpec(DATASET, prep["cfg"].model_dump(mode="json"),
                    str(prep["index"].root.resolve()))
    t0 = time.perf_counter()
    res, info = evaluate_fanout(spec, prep["ds"].examples, workers=WORKERS)
    wall = time.perf_counter() - t0
    local = prep["eval"]
    same_answers = [_answer_record(a) for a in res.answers] == \
        [_answer_record(a) for a in local.answers]
    timing = ("_ms", "wall_s", "model_load_s", "workers", "nodes_used")
    means = {k: v for k, v in res.summary.items() if not k.endswith(timing)}
    return {"n": len(res.answers), "nodes": info.nodes, "shards": info.shards,
            "same_answers": same_answers, "same_rows": res.rows == local.rows,
            "same_means": means == {k: v for k, v in local.summary.items()
                                    if not k.endswith(timing)},
            "f1": res.summary.get("f1"), "wall_s": wall, "in_process_wall_s": prep["eval_s"]}


def run_index(prep: dict[str, Any]) -> dict[str, Any]:
    import numpy as np

    from rag.index.dense import _faiss, _make_index
    from rl.common.fanout import RayDocumentEncoder

    enc = prep["index"].encoder()
    ray_enc = RayDocumentEncoder(enc.name, workers=WORKERS, fingerprint=enc.fingerprint)
    t0 = time.perf_counter()
    vecs = ray_enc(prep["texts"], ENCODE_BATCH)
    wall = time.perf_counter() - t0
    here = prep["vectors"]
    faiss = _faiss()
    i1, i2 = _make_index(here, "flat"), _make_index(vecs, "flat")
    _, top1 = i1.search(here, 10)
    _, top2 = i2.search(here, 10)
    close = bool(vecs.shape == here.shape and np.allclose(vecs, here, rtol=0, atol=1e-6))
    return {"n": len(vecs), "nodes": ray_enc.runs[0].nodes, "shards": ray_enc.runs[0].shards,
            "vectors_allclose_1e-6": close,
            "max_abs_diff": float(np.abs(vecs - here).max()) if vecs.shape == here.shape
            else None,
            "vectors_bytes_identical": vecs.tobytes() == here.tobytes(),
            "index_bytes_identical": bytes(faiss.serialize_index(i1)) ==
            bytes(faiss.serialize_index(i2)),
            "same_top10": bool((top1 == top2).all()),
            "encoder_fingerprint": enc.fingerprint, "wall_s": wall,
            "in_process_wall_s": prep["encode_s"]}


def both(root: Path, prep: dict[str, Any], report: dict) -> None:
    """Steps 3 (inside `cluster_session`): report["eval"], report["index"]."""
    report["eval"] = run_eval(prep)
    report["index"] = run_index(prep)
