"""Retrieval benchmark on BEIR SciFact (test qrels, 300 queries).

    python bench/retrieval.py            # full: all 5,183 docs, all 300 test queries
    python bench/retrieval.py --quick    # < 2 min: 50 queries over a 1,500-doc sub-corpus

Systems: BM25 (tantivy, bm25s), dense MiniLM (FAISS flat, HNSW), hybrid (min-max convex
fusion with w chosen on SciFact *train* queries, and RRF), graph (PPR), each without and with
cosine reranking. Metrics per query: ndcg@10, recall@100, mrr@10 (trec_eval definitions), with
bootstrap 95% CIs over queries; retrieval latency p50/p95; index build time and peak RSS.
Writes bench/results/retrieval.json and bench/results/retrieval.md.
"""

from __future__ import annotations

import multiprocessing as mp
import resource
import shutil
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.common import make_meta, metric_row, parser, write_results  # noqa: E402
from rag.config import RAGConfig  # noqa: E402
from rag.corpus import Corpus  # noqa: E402
from rag.corpus.loaders import data_root, load_beir  # noqa: E402
from rag.fusion import fuse_scores  # noqa: E402
from rag.indexset import IndexSet  # noqa: E402
from rag.metrics.retrieval import per_query_scores  # noqa: E402
from rag.models import cache_dir  # noqa: E402
from rag.pipeline import Pipeline  # noqa: E402

WEIGHTS = [0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9]


def _build_in_child(root: str, name: str, conn, cache: str | None) -> None:
    if cache:  # a fresh cache: the dense build must encode the whole corpus (cold build)
        import os

        os.environ["RAGPILOT_CACHE"] = cache
    idx = IndexSet.open(root)
    t0 = time.perf_counter()
    if name.startswith("bm25-"):
        idx.bm25(name.split("-", 1)[1])
    elif name.startswith("dense-"):
        idx.dense(name.split("-", 1)[1])
    else:  # the entity graph alone (its seed retrievers are built separately)
        from rag.index.graph import GraphRetriever

        GraphRetriever.build(idx.corpus, directory=idx.root / "graph")
    conn.send((time.perf_counter() - t0, resource.getrusage(resource.RUSAGE_SELF).ru_maxrss))
    conn.close()


def build_measured(root: Path, name: str, cold: bool) -> tuple[float, float]:
    """Build one index in a fresh process: (seconds, peak RSS MiB of that process). `cold`
    builds into a throw-away copy with an empty embedding cache, so encoding is included."""
    ctx = mp.get_context("spawn")
    parent, child = ctx.Pipe()
    cache = None
    if cold:
        tmp = Path(tempfile.mkdtemp(prefix="bench-build-"))
        (tmp / "idx").mkdir()
        for f in ("corpus.jsonl", "manifest.json"):
            shutil.copy(root / f, tmp / "idx" / f)
        root, cache = tmp / "idx", str(tmp / "cache")
    p = ctx.Process(target=_build_in_child, args=(str(root), name, child, cache))
    p.start()
    secs, rss_kib = parent.recv()
    p.join()
    if cold:
        shutil.rmtree(Path(root).parent, ignore_errors=True)
    return secs, rss_kib / 1024.0


def rank_all(pipe: Pipeline, questions, rerank: bool):
    """Candidates (+ rerank) for each question: ({qid: {doc: score}}, latencies ms)."""
    run, lat = {}, []
    for qid, q in questions:
        t0 = time.perf_counter()
        hits = pipe.candidates(q)
        if rerank:
            hits = pipe.rerank(q, hits)
        lat.append((time.perf_counter() - t0) * 1000)
        n = len(hits)
        # rank-preserving scores so ties in the stage's own scores cannot reorder the list
        run[qid] = {h.id: float(n - i) for i, h in enumerate(hits)}
    return run, np.array(lat)


def choose_fusion_weight(pipe: Pipeline, train_qs, qrels) -> tuple[float, dict[float, float]]:
    """Grid over w on train queries, reusing one bm25 and one dense hit list per query."""
    sparse = {qid: pipe.indexes.bm25("tantivy").search(q, 100) for qid, q in train_qs}
    dense = {qid: pipe.indexes.dense("flat").search(q, 100) for qid, q in train_qs}
    scores = {}
    for w in WEIGHTS:
        run = {}
        for qid, _ in train_qs:
            fused = fuse_scores([sparse[qid], dense[qid]], [1 - w, w], method="minmax",
                                top_n=100)
            run[qid] = {h.id: float(len(fused) - i) for i, h in enumerate(fused)}
        scores[w] = float(np.mean(per_query_scores(run, qrels, "ndcg@10")))
    best = max(scores, key=lambda w: (scores[w], -abs(w - 0.5)))
    return best, scores


def main() -> None:
    args = parser(__doc__, seed=True).parse_args()

    scifact = data_root() / "scifact"
    test = load_beir(scifact, split="test")
    train = load_beir(scifact, split="train")
    corpus, test_ex, train_ex = test.corpus, list(test.examples), list(train.examples)
    rng = np.random.default_rng(args.seed)
    if args.quick:
        test_ex = test_ex[:50]
        train_ex = train_ex[:100]
        keep = {d for e in test_ex + train_ex for d in e.qrels}
        others = [p.id for p in corpus if p.id not in keep]
        keep |= set(rng.choice(others, size=1500 - len(keep), replace=False).tolist())
        corpus = Corpus([p for p in corpus if p.id in keep])
    else:
        train_ex = train_ex[:300]

    root = cache_dir() / "bench" / f"scifact-{corpus.fingerprint()}"
    if not (root / "corpus.jsonl").exists():
        IndexSet.create(corpus, root, manifest={"dataset": "scifact"})
    build = {}
    for name in ["bm25-tantivy", "bm25-bm25s", "dense-flat", "dense-hnsw", "graph"]:
        # full runs time every index cold in its own process; quick runs reuse what exists
        if not args.quick or not (root / name).exists():
            build[name] = build_measured(root, name, cold=not args.quick)
    idx = IndexSet.open(root)
    for name in ["bm25-tantivy", "bm25-bm25s", "dense-flat", "dense-hnsw", "graph"]:
        if not (root / name).exists():  # cold builds went elsewhere: build here (cached)
            {"b": lambda n: idx.bm25(n.split("-", 1)[1]), "d": lambda n: idx.dense(
                n.split("-", 1)[1]), "g": lambda n: idx.graph()}[name[0]](name)

    qrels = {e.id: dict(e.qrels) for e in test_ex}
    train_qrels = {e.id: dict(e.qrels) for e in train_ex}
    test_qs = [(e.id, e.question) for e in test_ex]
    base = RAGConfig(n_candidates=100, k=10, rerank_depth=100, generator="extractive")
    pipe = Pipeline(idx, base)
    w_best, w_scores = choose_fusion_weight(pipe, [(e.id, e.question) for e in train_ex],
                                            train_qrels)
    systems = {
        "bm25-tantivy": base.replace(variant="bm25"),
        "bm25-bm25s": base.replace(variant="bm25", bm25_backend="bm25s"),
        "dense-flat": base.replace(variant="dense"),
        "dense-hnsw": base.replace(variant="dense", dense_index="hnsw"),
        f"hybrid-minmax-w{w_best}": base.replace(variant="hybrid", fusion_weight=w_best),
        "hybrid-rrf": base.replace(variant="hybrid", normalisation="rrf"),
        "graph-ppr": base.replace(variant="graph"),
    }
    ds = "scifact/test" if not args.quick else "scifact/test[:50]-sub1500"
    rows, table = [], []
    for name, cfg in systems.items():
        for rerank in (False, True):
            if rerank and name.startswith("bm25-bm25s"):
                continue
            c = cfg.replace(rerank="cosine") if rerank else cfg
            run, lat = rank_all(pipe.with_config(c), test_qs, rerank)
            sysname = name + ("+cosine" if rerank else "")
            line = {"system": sysname}
            for metric in ("ndcg@10", "recall@100", "mrr@10"):
                vals = per_query_scores(run, qrels, metric)
                rows.append(metric_row(ds, sysname, metric, vals, seed=args.seed))
                line[metric] = float(np.mean(vals))
            for pct in (50, 95):
                rows.append({"dataset": ds, "system": sysname, "metric": f"p{pct}_ms",
                             "value": float(np.percentile(lat, pct)), "ci_low": None,
                             "ci_high": None, "n": len(lat)})
                line[f"p{pct}_ms"] = float(np.percentile(lat, pct))
            table.append(line)
            print(f"{sysname:<28} " + " ".join(f"{k} {v:.4f}" for k, v in line.items()
                                               if k != "system"), flush=True)
    for name, (secs, rss) in build.items():
        rows.append({"dataset": ds, "system": name, "metric": "build_s", "value": secs,
                     "ci_low": None, "ci_high": None, "n": len(corpus)})
        rows.append({"dataset": ds, "system": name, "metric": "build_peak_rss_mib",
                     "value": rss, "ci_low": None, "ci_high": None, "n": len(corpus)})
    for w, s in w_scores.items():
        rows.append({"dataset": "scifact/train", "system": f"hybrid-minmax-w{w}",
                     "metric": "ndcg@10", "value": s, "ci_low": None, "ci_high": None,
                     "n": len(train_ex)})
    md = ["| system | ndcg@10 | recall@100 | mrr@10 | p50 ms | p95 ms |", "|---|---|---|---|---|---|"]
    md += [f"| {t['system']} | {t['ndcg@10']:.4f} | {t['recall@100']:.4f} | {t['mrr@10']:.4f} "
           f"| {t['p50_ms']:.1f} | {t['p95_ms']:.1f} |" for t in table]
    if build:
        md += ["", "| index | build s | peak RSS MiB |", "|---|---|---|"]
        md += [f"| {n} | {s:.1f} | {r:.0f} |" for n, (s, r) in build.items()]
        md += ["", "Each index built in a fresh process"
               + (" with an empty embedding cache: dense builds include encoding the corpus "
                  "with MiniLM on one thread; dense-hnsw (like dense-flat) "
                  "includes loading the encoder and encoding." if not args.quick else ".")]
    md += ["", f"Hybrid weight w={w_best} chosen on {len(train_ex)} SciFact train queries "
               f"(ndcg@10 by w: " + ", ".join(f"{w}: {s:.3f}" for w, s in w_scores.items())
           + ")."]
    write_results("retrieval", rows, make_meta(args.seed, {"scifact": scifact},
                  extra={"quick": args.quick, "corpus_passages": len(corpus),
                         "queries": len(test_ex)}),
                  md_title="Retrieval on SciFact", md_body="\n".join(md))


if __name__ == "__main__":
    main()
