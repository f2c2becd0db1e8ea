"""`ragpilot demo`: the control plane's loop end to end on embedded defaults
(serving.demo.run_demo): index -> tune -> holdout report -> serve (stable = default, canary =
tuned) -> simulated users -> promotion -> summary, written to runs/demo/ (summary.json,
report.html). Exit 0 when the loop ran (whatever the promotion decided), 2 on bad input (a busy
port names --port), 130 on Ctrl-C (Serve and Ray stopped first)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from serving.cli.common import flags


def cmd_demo(args: argparse.Namespace) -> int:
    from serving.demo import run_demo

    try:
        with flags({"port": "--port", "policy_checkpoint": "--policy-checkpoint"}):
            run_demo(out=Path(args.out), fast=args.fast, seed=args.seed, port=args.port,
                     private_netns=args.private_netns, mlflow=not args.no_mlflow,
                     policy_checkpoint=args.policy_checkpoint, warm_start=not args.cold_start)
    except KeyboardInterrupt:
        print("interrupted: Serve and Ray were stopped", file=sys.stderr)
        return 130
    return 0


def add_parsers(sub) -> None:
    s = sub.add_parser("demo", help="the main job: index, tune, compare on holdout, serve, "
                                    "simulate users, promote or roll back")
    s.add_argument("--out", default="runs/demo")
    s.add_argument("--fast", action="store_true",
                   help="smaller tuning budget and fewer simulated requests (~2 min)")
    s.add_argument("--seed", type=int, default=0)
    s.add_argument("--port", type=int, default=8000, help="HTTP port on 127.0.0.1")
    s.add_argument("--private-netns", action="store_true",
                   help="run Ray/Serve in a private network namespace (loopback only; needs "
                        "CAP_SYS_ADMIN); the URLs printed are then reachable only from inside")
    s.add_argument("--policy-checkpoint", metavar="DIR",
                   help="a learned PPO policy (ragpilot tune --method ppo --checkpoint): its "
                        "config goes on instead of the searcher's when its valid reward is higher")
    s.add_argument("--cold-start", action="store_true",
                   help="the searcher does not try the default config first (then the tuned "
                        "config always differs from the default and is always rolled out)")
    s.add_argument("--no-mlflow", action="store_true", help="do not log runs to MLflow")
    s.set_defaults(func=cmd_demo, shows_own_progress=True)  # rag.progress stays off
