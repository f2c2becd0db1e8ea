"""The main job on embedded defaults: a generated multi-hop world, tantivy + FAISS + graph
indexes, a handful of configs evaluated end to end, a table printed and files written.

Runs on a fresh machine with nothing but the installed packages (no ../shared, no network).
"""

from __future__ import annotations

import json
import time
from pathlib import Path

from rich.console import Console
from rich.table import Table

from rag.config import RAGConfig

BASE = RAGConfig(generator="extractive", prompt_id="cite_concise", k=4, n_candidates=30)

DEMO_CONFIGS: list[tuple[str, RAGConfig]] = [
    ("bm25", BASE.replace(variant="bm25")),
    ("dense", BASE.replace(variant="dense")),
    ("hybrid w=0.5", BASE.replace(variant="hybrid", fusion_weight=0.5)),
    ("hybrid rrf", BASE.replace(variant="hybrid", normalisation="rrf")),
    ("graph (PPR)", BASE.replace(variant="graph")),
    ("hybrid + cosine rerank", BASE.replace(variant="hybrid", rerank="cosine")),
    ("hybrid + MMR 0.6", BASE.replace(variant="hybrid", mmr_lambda=0.6)),
]

COLUMNS = [("recall@k", "recall@k"), ("em", "EM"), ("f1", "F1"),
           ("sp_f1", "SP F1"), ("citation_precision", "cite P"), ("total_p95_ms", "p95 ms")]


def run_demo(out: Path = Path("runs/demo"), with_llm: bool = True, quick: bool = False,
             seed: int = 0, console: Console | None = None, mlflow: bool = True) -> list[dict]:
    """Build, evaluate, print; returns one summary dict per config (also in out/summary.json)."""
    from rag.corpus.synthetic import make_synthetic_world
    from rag.evaluate import evaluate
    from rag.indexset import IndexSet
    from rag.pipeline import Pipeline

    if console is None:  # piped output (CI logs) gets rich's 80 columns: too narrow here
        console = Console()
        if not console.is_terminal:
            console = Console(width=120)
    t0 = time.perf_counter()
    world = make_synthetic_world(seed=seed)
    examples = list(world.examples)[: 60 if quick else None]
    console.print(f"[bold]ragpilot demo[/] · synthetic world seed={seed}: "
                  f"{len(world.corpus)} passages, {len(examples)} questions")
    indexes = IndexSet.create(world.corpus, out / "index", encoder=BASE.encoder,
                              manifest={"dataset": "synthetic", "seed": seed})
    secs = indexes.build_all(bm25=("tantivy",), dense=("flat",), graph=True)
    console.print("indexes: " + ", ".join(f"{k} {v:.1f}s" for k, v in secs.items()))

    configs = list(DEMO_CONFIGS)
    if with_llm:
        configs.append(("hybrid + SmolLM2-135M", BASE.replace(
            variant="hybrid", generator="smollm2-135m-instruct", max_new_tokens=24)))
    pipe = Pipeline(indexes, BASE)
    results = []
    for label, cfg in configs:
        subset = examples if cfg.generator == "extractive" else examples[: 10 if quick else 30]
        res = evaluate(pipe.with_config(cfg), subset)
        run_dir = res.write(out / "runs" / cfg.config_hash)
        if mlflow:
            from rl.common.tracking import log_eval_run, tracking_uri

            log_eval_run("ragpilot_demo", label, cfg, res.summary, indexes.manifest,
                         tracking_uri(out), artifacts=run_dir)
        results.append({"label": label, "config_hash": cfg.config_hash,
                        "variant": cfg.variant, "generator": cfg.generator, **res.summary})

    table = Table(title=f"{len(examples)} synthetic multi-hop questions (LLM row: first "
                        f"{10 if quick else 30})")
    table.add_column("config", no_wrap=True)
    table.add_column("hash")
    for _, head in COLUMNS:
        table.add_column(head, justify="right")
    for r in results:
        table.add_row(r["label"], r["config_hash"][:8],
                      *(f"{r.get(k, float('nan')):.3f}" if k != "total_p95_ms"
                        else f"{r.get(k, float('nan')):.1f}" for k, _ in COLUMNS))
    console.print(table)
    (out / "summary.json").write_text(json.dumps(results, indent=2, sort_keys=True))
    console.print(f"wrote {out}/summary.json and per-config predictions under {out}/runs/ "
                  f"({time.perf_counter() - t0:.1f} s)")
    if mlflow:
        from rl.common.tracking import tracking_uri

        console.print(f"MLflow experiment 'ragpilot_demo' in {tracking_uri(out)} "
                      f"(browse: .venv/bin/mlflow ui --backend-store-uri {tracking_uri(out)})")
    return results
