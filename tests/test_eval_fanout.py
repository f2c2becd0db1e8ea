"""`ragpilot eval` and `ragpilot index` as Ray tasks (issue 23 item 2, rl.common.fanout) give
the in-process results: on the synthetic world, eval with 2 workers writes the same per-query
outputs (answers, citations, contexts, candidates, tokens, scores) and the same metric means as
eval in one process; the dense index built from vectors encoded by 2 Ray tasks
(`rl.common.fanout.prime_embeddings`) has the same
vectors (allclose 1e-6), the same FAISS search results and the same fingerprints (corpus,
encoder) as the in-process build. A local Ray runtime of 2 CPUs (one per session: run Ray
tests serially); the two-node version of the same checks is in bench/cluster.py."""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import pytest

from serving.cli import main

pytestmark = pytest.mark.ray

REPO = Path(__file__).resolve().parents[1]
LATENCY_KEYS = {"latency_ms"}


@pytest.fixture(scope="module")
def local_ray():
    """A local Ray runtime of 2 CPUs whose workers import this checkout."""
    import ray

    from rl.common.runtime import init_ray

    old = os.environ.get("PYTHONPATH")
    os.environ["PYTHONPATH"] = os.pathsep.join([str(REPO / "src"), str(REPO)]
                                               + ([old] if old else []))
    init_ray(num_cpus=2)
    yield ray
    ray.shutdown()
    if old is None:
        os.environ.pop("PYTHONPATH", None)
    else:
        os.environ["PYTHONPATH"] = old


def _jsonl(path: Path) -> list[dict]:
    return [json.loads(x) for x in path.read_text().splitlines() if x]


def _outputs(run: Path) -> list[dict]:
    """Per query: the prediction (latency apart), its contexts and candidates, its scores."""
    preds = [{k: v for k, v in p.items() if k not in LATENCY_KEYS}
             for p in _jsonl(run / "predictions.jsonl")]
    return list(zip(preds, _jsonl(run / "contexts.jsonl"), _jsonl(run / "scores.jsonl"),
                    strict=True))


def test_eval_on_two_workers_equals_in_process(local_ray, world_indexes, tmp_path, capsys):
    base = ["eval", "--dataset", "synthetic", "--split", "all", "--index",
            str(world_indexes.root), "--limit", "20", "--set", "variant=hybrid"]
    assert main([*base, "--out", str(tmp_path / "one")]) == 0
    assert main([*base, "--workers", "2", "--out", str(tmp_path / "two")]) == 0
    assert "evaluated as 2 Ray tasks" in capsys.readouterr().err
    one, two = _outputs(tmp_path / "one"), _outputs(tmp_path / "two")
    assert len(one) == len(two) == 20
    assert one == two  # in query order, field for field
    s1 = json.loads((tmp_path / "one" / "summary.json").read_text())
    s2 = json.loads((tmp_path / "two" / "summary.json").read_text())
    assert s2["workers"] == 2
    timing = ("_ms", "wall_s", "model_load_s", "workers", "nodes_used")
    assert {k: v for k, v in s1.items() if not k.endswith(timing)} == \
        {k: v for k, v in s2.items() if not k.endswith(timing)}


def test_shards_follow_batches_and_keep_order(local_ray, world, world_indexes):
    from rag.config import RAGConfig
    from rl.common.fanout import EvalSpec, evaluate_fanout, shard_bounds

    assert shard_bounds(20, 2, 8) == [(0, 16), (16, 20)]
    assert shard_bounds(5, 4, 8) == [(0, 5)]
    assert shard_bounds(0, 3, 8) == []
    assert shard_bounds(24, 3, 8) == [(0, 8), (8, 16), (16, 24)]
    examples = world.examples[:11]
    spec = EvalSpec("synthetic", RAGConfig().replace(variant="bm25").model_dump(mode="json"),
                    str(world_indexes.root), batch_size=4)
    result, info = evaluate_fanout(spec, examples, workers=3)
    assert [(s["start"], s["stop"]) for s in info.shards] == [(0, 4), (4, 8), (8, 11)]
    assert [a.query_id for a in result.answers] == [e.id for e in examples]
    assert result.summary["n"] == 11 and result.summary["workers"] == 3


def _build(tmp_path: Path, name: str, monkeypatch, *extra: str) -> Path:
    """`ragpilot index` (bm25s + dense flat, no graph) into tmp_path/name, with an empty
    embedding cache, so the corpus is encoded by this build."""
    import rag.index.dense as dense

    cache = tmp_path / f"cache-{name}"
    monkeypatch.setattr(dense, "cache_dir", lambda: cache)
    out = tmp_path / name
    assert main(["index", "--dataset", "synthetic", "--out", str(out), "--bm25", "bm25s",
                 "--dense", "flat", "--no-graph", *extra]) == 0
    assert list((cache / "embeddings").glob("*.npy")), "the corpus was not encoded here"
    return out


def test_index_encoded_by_ray_tasks_equals_in_process(local_ray, tmp_path, monkeypatch,
                                                      capsys):
    from rag.index.dense import DenseRetriever

    one = _build(tmp_path, "one", monkeypatch)
    two = _build(tmp_path, "two", monkeypatch, "--workers", "2")
    assert "dense encoding: 2 Ray tasks on 1 node(s)" in capsys.readouterr().out
    v1 = np.load(one / "dense-flat" / "embeddings.npy")
    v2 = np.load(two / "dense-flat" / "embeddings.npy")
    assert v1.shape == v2.shape and v1.dtype == v2.dtype == np.float32
    np.testing.assert_allclose(v2, v1, rtol=0, atol=1e-6)
    assert json.loads((one / "dense-flat" / "meta.json").read_text()) == \
        json.loads((two / "dense-flat" / "meta.json").read_text())  # ids, encoder fingerprint
    m1, m2 = (json.loads((d / "manifest.json").read_text()) for d in (one, two))
    assert m1["corpus_fingerprint"] == m2["corpus_fingerprint"]
    r1, r2 = DenseRetriever.load(one / "dense-flat"), DenseRetriever.load(two / "dense-flat")
    q = v1[:10]
    top1 = [[h.id for h in hits] for hits in r1.search_vectors(q, 5)]
    top2 = [[h.id for h in hits] for hits in r2.search_vectors(q, 5)]
    assert top1 == top2


def test_ray_encoder_spreads_batches_in_order(local_ray, world):
    from rag.encoders import Encoder, encode_documents
    from rl.common.fanout import RayDocumentEncoder, passage_texts

    texts = passage_texts(world.corpus)[:40]
    enc = RayDocumentEncoder("minilm", workers=2,
                             fingerprint=Encoder.from_registry("minilm").fingerprint)
    vecs = enc(texts, 16)
    assert [(s["start"], s["stop"]) for s in enc.runs[0].shards] == [(0, 32), (32, 40)]
    here = encode_documents(Encoder.from_registry("minilm"), texts, batch_size=16)
    np.testing.assert_allclose(vecs, here, rtol=0, atol=1e-6)
    bad = RayDocumentEncoder("minilm", workers=1, fingerprint="not-the-weights")
    with pytest.raises(RuntimeError, match="fingerprint"):
        bad(texts[:4], 16)
