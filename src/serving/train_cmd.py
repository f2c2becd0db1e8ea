"""`ragpilot train-reranker`: build a cross-encoder reranker from the packaged MiniLM weights.

    ragpilot train-reranker --config configs/rl/reranker.yaml
    ragpilot train-reranker --set max_items=40 --set name=reranker-tiny     # a small run

Mines (query, gold, hard negatives) from the train splits, trains with checkpoints (re-running
the same command after a kill resumes), saves `<cache>/models/<name>/v<N>/` and registers
`<name>`, `<name>@v<N>`, `<name>@best` so `rerank: cross_encoder, reranker_model: <name>` picks
it. Prints a JSON summary (throughput, eval metrics, paths).
"""

from __future__ import annotations

import argparse
import json
from typing import Any

import yaml

from rag.errors import ConfigError


def _config(path: str | None, overrides: list[str]):
    from rl.adaptation.reranker_config import RerankerTrainConfig

    cfg = RerankerTrainConfig.from_yaml(path) if path else RerankerTrainConfig()
    changes: dict[str, Any] = {}
    for item in overrides or []:
        if "=" not in item:
            raise ConfigError("--set", f"expected key=value, got {item!r}")
        key, value = item.split("=", 1)
        changes[key.strip()] = yaml.safe_load(value)
    return cfg.replace(**changes) if changes else cfg


def cmd_train_reranker(args: argparse.Namespace) -> int:
    from rag.env import configure_runtime_env
    from rl.adaptation.reranker_trainer import run_training

    configure_runtime_env()
    cfg = _config(args.config, args.set)
    if args.stop_after is not None and args.stop_after < 1:
        raise ConfigError("--stop-after", "must be >= 1")
    summary = run_training(cfg, run_dir=args.run_dir, stop_after=args.stop_after,
                           register=not args.no_register,
                           log=lambda m: print(m, flush=True))
    print(json.dumps(summary, indent=1))
    return 0


def add_parsers(sub) -> None:
    s = sub.add_parser("train-reranker", help="train a cross-encoder reranker (MiniLM init)")
    s.add_argument("--config", default="configs/rl/reranker.yaml",
                   help="YAML with a `reranker:` mapping")
    s.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                   help="override a top-level key, e.g. --set max_items=100")
    s.add_argument("--run-dir", help="checkpoint directory (default: under the cache)")
    s.add_argument("--stop-after", type=int, help="stop after N steps (resume later)")
    s.add_argument("--no-register", action="store_true",
                   help="do not add the model to the local registry / MLflow")
    s.set_defaults(func=cmd_train_reranker)
