"""Model adaptation benchmark: trained variants vs their bases, one function per section.

    python bench/adaptation.py                  # full: trained reranker on the test splits
    python bench/adaptation.py --quick          # < 2 min: a tiny training run, few queries
    python bench/adaptation.py --model NAME     # evaluate an already trained reranker

Reranker section (`section_reranker`): the cross-encoder trained from the packaged MiniLM
weights (`ragpilot train-reranker`, configs/rl/reranker.yaml) reranks the top-`depth` hybrid
candidates; compared with no reranking (the hybrid order) and with cosine reranking (the
bi-encoder), and a fixed 50/50 min-max fusion of the cross-encoder and hybrid scores (weight
fixed a priori, not tuned on test). SciFact test split (configs/splits/scifact.json: 200 of the
300 BEIR test queries; the other 100 are the valid split) -> ndcg@10, mrr@10; HotpotQA test
split (300 holdout questions, pooled distractor corpus) -> supporting-passage recall@2, @5.
95% bootstrap CIs per system, and paired-bootstrap CIs of the differences
(system "<a> - <b>", metric "delta_<metric>"). Training throughput (pairs/s, tokens/s) comes
from the model's manifest (or the quick run).

A generator section (SFT / DPO vs base) can be added as another `section_*` function returning
(rows, markdown, meta).
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from rag.env import configure_runtime_env  # noqa: E402

configure_runtime_env()

from bench.common import make_meta, metric_row, plain_row, write_results  # noqa: E402
from rag.corpus.loaders import data_root  # noqa: E402
from rag.metrics.retrieval import mrr_at_k, ndcg_at_k, recall_at_k  # noqa: E402
from rag.pipeline import mix_with_retrieval_rank  # noqa: E402
from rag.types import Hit  # noqa: E402
from rl.stats.bootstrap import paired_bootstrap  # noqa: E402

CONFIG = Path(__file__).resolve().parents[1] / "configs" / "rl" / "reranker.yaml"


# ---- reranker ---------------------------------------------------------------------------------
def _trained_reranker(args) -> tuple[str, dict[str, Any]]:
    """(model directory, training info): `--model`, the registered model of the config, or a
    fresh training run (always fresh and tiny for --quick)."""
    from rag.models import default_registry
    from rl.adaptation.reranker_config import RerankerTrainConfig
    from rl.adaptation.reranker_trainer import run_training

    cfg = RerankerTrainConfig.from_yaml(CONFIG)
    if args.quick:
        cfg = cfg.replace(name="reranker-quick", max_length=128, group_size=3, batch_groups=2,
                          max_items=24, eval=None, mlflow=False, checkpoint_every=4,
                          data={"retriever": "bm25", "depth": 20, "n_hard": 6, "n_easy": 4,
                                "sources": {"scifact": {"max_queries": 24}}})
        t0 = time.perf_counter()
        tmp = Path(tempfile.mkdtemp(prefix="rr-quick-"))
        s = run_training(cfg, run_dir=tmp / "run", register=False, models_dir=tmp / "models",
                         log=None)
        s["wall_s"] = round(time.perf_counter() - t0, 1)
        return s["model_dir"], {"trained_now": True, **s}
    name = args.model or cfg.name
    reg = default_registry()
    if Path(name).expanduser().is_dir():
        path = Path(name).expanduser()
    elif name in reg.names("cross_encoder") and not args.retrain:
        path = reg.get(name).resolve()
    else:
        s = run_training(cfg, log=print)
        return s["model_dir"], {"trained_now": True, **s}
    man = path / "manifest.json"
    return str(path), {"trained_now": False,
                       **(json.loads(man.read_text()) if man.exists() else {})}


def _candidates(dataset: str, split: str, depth: int, limit: int | None):
    from rl.adaptation.reranker_eval import candidate_queries, qrels_of
    from rl.common.data import TuningData

    data = TuningData.open(dataset)
    examples = [e for e in data.examples(split) if e.gold_passage_ids]
    if limit:
        examples = examples[:limit]
    return data, candidate_queries(data, examples, "hybrid", depth), qrels_of(examples)


def _score_systems(data, queries, ce) -> tuple[dict[str, dict[str, list[str]]], dict]:
    """Rankings per system {system: {qid: [ids best first]}} and CE latency."""
    from rag.rerank import CosineReranker

    dense = data.indexes.dense("flat")
    cos = CosineReranker(dense.encoder, dense.passage_embeddings)
    out: dict[str, dict[str, list[str]]] = {"hybrid": {}, "hybrid+cosine": {},
                                            "hybrid+ce": {}, "hybrid+ce-fused": {}}
    lat = []
    for qid, q, ps in queries:
        ids = [p.id for p in ps]
        out["hybrid"][qid] = ids
        out["hybrid+cosine"][qid] = [h.id for h in cos.rerank(q, ps)]
        t0 = time.perf_counter()
        s = ce.scores(q, ps)
        lat.append((time.perf_counter() - t0) * 1000)
        out["hybrid+ce"][qid] = [ids[i] for i in sorted(range(len(ids)),
                                                        key=lambda i: (-s[i], ids[i]))]
        # hybrid order as a score (its fused scores are rank-monotone), min-max with CE: the
        # pipeline's `rerank_mix: 0.5`
        out["hybrid+ce-fused"][qid] = [h.id for h in mix_with_retrieval_rank(
            s, [Hit(0.0, i) for i in ids], 0.5)]
    return out, {"ce_ms_per_query_p50": float(np.median(lat)) if lat else float("nan"),
                 "ce_ms_per_query_mean": float(np.mean(lat)) if lat else float("nan")}


def _metric_rows(dataset: str, rankings, qrels, metrics, seed: int) -> tuple[list[dict], dict]:
    fns = {"ndcg": ndcg_at_k, "mrr": mrr_at_k, "recall": recall_at_k}
    per: dict[str, dict[str, np.ndarray]] = {}
    rows = []
    for system, run in rankings.items():
        per[system] = {}
        for m in metrics:
            base, k = m.split("@")
            vals = np.array([fns[base](run[q], rel, int(k)) for q, rel in qrels.items()])
            per[system][m] = vals
            rows.append(metric_row(dataset, system, m, vals, seed=seed))
    for cand, ref in [("hybrid+ce", "hybrid"), ("hybrid+ce", "hybrid+cosine"),
                      ("hybrid+ce-fused", "hybrid")]:
        for m in metrics:
            r = paired_bootstrap(per[ref][m], per[cand][m], seed=seed)
            rows.append({"dataset": dataset, "system": f"{cand} - {ref}",
                         "metric": f"delta_{m}", "value": r.mean_diff, "ci_low": r.ci_low,
                         "ci_high": r.ci_high, "n": r.n, "p_value": r.p_value})
    return rows, per


def section_reranker(args) -> tuple[list[dict], str, dict]:
    from rag.rerank import CrossEncoderReranker

    t_start = time.perf_counter()
    model_dir, info = _trained_reranker(args)
    ce = CrossEncoderReranker(model_dir)  # max_length from the training manifest
    rows: list[dict] = []
    lat: dict[str, Any] = {}
    depth = 10 if args.quick else args.depth
    limits = {"scifact": 12, "hotpotqa": 12} if args.quick else dict(
        (kv.split("=", 1)[0], int(kv.split("=", 1)[1])) for kv in args.limit)
    specs = [("scifact", ["ndcg@10", "mrr@10"]), ("hotpotqa", ["recall@2", "recall@5"])]
    for dataset, metrics in specs:
        t0 = time.perf_counter()
        data, queries, qrels = _candidates(dataset, "test", depth, limits.get(dataset))
        rankings, lat[dataset] = _score_systems(data, queries, ce)
        r, _ = _metric_rows(dataset, rankings, qrels, metrics, args.seed)
        rows += r
        rows.append(plain_row(dataset, "hybrid+ce", "rerank_ms_per_query_p50",
                              lat[dataset]["ce_ms_per_query_p50"], len(queries)))
        lat[dataset]["eval_seconds"] = round(time.perf_counter() - t0, 1)
        print(f"{dataset}: {len(queries)} queries x top-{depth} in "
              f"{lat[dataset]['eval_seconds']} s", flush=True)
    n_seq = info.get("sequences") or 0
    for key in ("pairs_per_s", "tokens_per_s"):
        if info.get(key) is not None:
            rows.append(plain_row("train", "reranker-cpu-1thread", key, info[key], n_seq))
    md = _reranker_md(rows, depth, info, model_dir)
    meta = {"reranker": {"model_dir": model_dir, "depth": depth, "queries_limit": limits,
                         "latency": lat, "seconds": round(time.perf_counter() - t_start, 1),
                         "training": {k: v for k, v in info.items()
                                      if k not in ("config",)},
                         "config": info.get("config")}}
    return rows, md, meta


def _fmt(r: dict) -> str:
    if r["ci_low"] is None:
        return f"{r['value']:.4g}"
    return f"{r['value']:.4f} [{r['ci_low']:.4f}, {r['ci_high']:.4f}]"


def _reranker_md(rows: list[dict], depth: int, info: dict, model_dir: str) -> str:
    lines = [f"## Reranker: fine-tuned cross-encoder vs base (top-{depth} hybrid candidates)", ""]
    for ds in ("scifact", "hotpotqa"):
        ms = [r for r in rows if r["dataset"] == ds and not r["metric"].startswith("delta_")
              and r["metric"] != "rerank_ms_per_query_p50"]
        metrics = list(dict.fromkeys(r["metric"] for r in ms))
        n = ms[0]["n"] if ms else 0
        lines += [f"**{ds}** test split, n={n} (mean [95% bootstrap CI])", "",
                  "| system | " + " | ".join(metrics) + " |",
                  "|---|" + "---|" * len(metrics)]
        for system in dict.fromkeys(r["system"] for r in ms):
            cells = [_fmt(next(r for r in ms if r["system"] == system and r["metric"] == m))
                     for m in metrics]
            lines.append(f"| {system} | " + " | ".join(cells) + " |")
        deltas = [r for r in rows if r["dataset"] == ds and r["metric"].startswith("delta_")]
        lines += ["", "| paired difference | metric | mean [95% CI] | p |", "|---|---|---|---|"]
        lines += [f"| {r['system']} | {r['metric'][6:]} | {_fmt(r)} | {r['p_value']:.3g} |"
                  for r in deltas]
        lat = next((r for r in rows if r["dataset"] == ds
                    and r["metric"] == "rerank_ms_per_query_p50"), None)
        if lat:
            lines += ["", f"Cross-encoder rerank latency p50: {lat['value']:.0f} ms/query "
                          f"(top-{depth}, one thread)."]
        lines.append("")
    thr = {r["metric"]: r["value"] for r in rows if r["dataset"] == "train"}
    if thr:
        lines.append(f"Training throughput (CPU, 1 thread): {thr.get('pairs_per_s', 0):.2f} "
                     f"pairs/s, {thr.get('tokens_per_s', 0):.0f} tokens/s over "
                     f"{info.get('sequences', '?')} sequences, {info.get('steps', '?')} steps.")
    lines.append(f"Model: `{model_dir}`" + (f" (eval on the valid split at training: "
                                             f"{json.dumps(info.get('eval'))})"
                                             if info.get("eval") else ""))
    return "\n".join(lines)


# ---- main -------------------------------------------------------------------------------------
SECTIONS = {"reranker": section_reranker}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--depth", type=int, default=20, help="hybrid candidates to rerank (full)")
    ap.add_argument("--limit", action="append", default=[], metavar="DATASET=N",
                    help="evaluate only the first N test queries of DATASET (full runs)")
    ap.add_argument("--model", help="trained reranker: registry name or directory")
    ap.add_argument("--retrain", action="store_true", help="train even if the model exists")
    ap.add_argument("--sections", default=",".join(SECTIONS), help="comma list")
    args = ap.parse_args()
    root = data_root()
    rows: list[dict] = []
    mds: list[str] = []
    extra: dict[str, Any] = {"quick": args.quick}
    for name in args.sections.split(","):
        r, md, meta = SECTIONS[name](args)
        rows += r
        mds.append(md)
        extra.update(meta)
    meta = make_meta(args.seed, {"scifact": root / "scifact",
                                 "hotpotqa": root / "hotpotqa" / "hotpot_dev_distractor_1100.jsonl",
                                 "mtrag": root / "mtrag" / "mtragun-human" / "generation_tasks"
                                 / "reference.jsonl"}, extra)
    write_results("adaptation", rows, meta, "Model adaptation", "\n\n".join(mds))


if __name__ == "__main__":
    main()
