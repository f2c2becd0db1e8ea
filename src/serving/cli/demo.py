"""`ragpilot demo`: the main job on embedded defaults (serving.demo.run_demo)."""

from __future__ import annotations

import argparse
from pathlib import Path


def cmd_demo(args: argparse.Namespace) -> int:
    from serving.demo import run_demo

    run_demo(out=Path(args.out), with_llm=not args.no_llm, quick=args.quick,
             mlflow=not args.no_mlflow)
    return 0


def add_parsers(sub) -> None:
    s = sub.add_parser("demo", help="the main job: index a generated corpus, compare configs")
    s.add_argument("--out", default="runs/demo")
    s.add_argument("--no-llm", action="store_true", help="skip the SmolLM2 generator run")
    s.add_argument("--quick", action="store_true")
    s.add_argument("--no-mlflow", action="store_true", help="do not log runs to MLflow")
    s.set_defaults(func=cmd_demo)
