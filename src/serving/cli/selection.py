"""`ragpilot select run|ablate`: episode-level context selection from the shell.

    ragpilot select run --dataset hotpotqa --split test --limit 50 [--ppo] [--config Y]
                        [--set reward.mmr_lambda=0.4] [--out runs/select.json]
        trains BC -> RAFT (-> PPO) on the train split (model selection on valid) and compares
        the policy with retrieve-then-rerank on `--split` (same passage budget).
    ragpilot select ablate [--quick] [--dataset hotpotqa]
        the ablation table of bench/selection.py (K, MMR lambda, reranker, shaping) as JSON rows.
Training runs as Ray tasks (rl.selection.runner): BC, then RAFT (-> PPO) and one task per
ablation arm, num_cpus=1 each, at most `--parallel` (default 2) at a time, on a local Ray
runtime started the project's way (rl.common.runtime.init_ray: the machine's CPUs, dashboard off,
loopback) or, when RAY_ADDRESS is set (`ray job submit -- ragpilot select ablate ...` sets it),
on that cluster. `--local` trains in this process instead (debugging; same numbers for the same
seed). Pools (memoised retrieval) are built by this process either way.
Bad input (unknown config key, bad value, unknown split) exits 2 naming the field.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from rag.errors import ConfigError
from serving.cli.common import add_set_argument, output_file, with_sets


def _config(args: argparse.Namespace):
    from rl.selection.config import SelectionConfig

    return with_sets(SelectionConfig.load(args.config), args.set)


def _runner(args: argparse.Namespace):
    """Ray tasks by default, in-process with --local (after the config is validated)."""
    if args.parallel < 1:
        raise ConfigError("--parallel", "must be >= 1")
    from rl.selection.runner import make_runner

    return make_runner(local=args.local, parallel=args.parallel)


def _limit(value: int | None, flag: str) -> int | None:
    if value is not None and value < 1:
        raise ConfigError(flag, "must be >= 1")
    return value


def cmd_select_run(args: argparse.Namespace) -> int:
    cfg = _config(args)
    if args.out:
        output_file(args.out, "--out", "JSON")  # before Ray starts
    if args.split != "test":
        raise ConfigError("--split", "only test (the holdout) is reported: train trains the "
                                     "policy and valid selects the model")
    from rl.selection.ablate import Sizes, run_dataset

    n = _limit(args.limit, "--limit")
    sizes = Sizes(train=_limit(args.train_limit, "--train-limit"), valid=n, test=n,
                  ppo_iterations=None if args.ppo else 0, faithfulness=args.faithfulness)
    rows, info = run_dataset(args.dataset, cfg, sizes, ablations=False, runner=_runner(args))
    _emit(rows, info, args.out)
    return 0


def cmd_select_ablate(args: argparse.Namespace) -> int:
    cfg = _config(args)
    if args.out:
        output_file(args.out, "--out", "JSON")  # before Ray starts
    from rl.selection.ablate import Sizes, run_dataset

    sizes = Sizes(train=60, valid=30, test=40, ks=(20, 50), lambdas=(0.2, 0.8),
                  ppo_iterations=0) if args.quick else Sizes(valid=150, ppo_iterations=0)
    rows, info = run_dataset(args.dataset, cfg, sizes, ablations=True, runner=_runner(args))
    _emit(rows, info, args.out)
    return 0


def _emit(rows: list[dict], info: dict, out: str | None) -> None:
    for r in rows:
        lo, hi = r.get("ci_low"), r.get("ci_high")
        ci = f" [{lo:.4f}, {hi:.4f}]" if lo is not None and hi is not None else ""
        print(f"{r['system']:<40} {r['metric']:<20} {r['value']:.4f}{ci} n={r['n']}")
    for what, why in (info.get("ablation_notes") or {}).items():
        print(f"ablation:{what:<31} {why}")
    if info.get("runner"):
        print(f"training: {info['runner']}")
    if out:
        from rag.model_registry_writer import write_atomic

        write_atomic(Path(out), json.dumps({"rows": rows, "info": info}, indent=1,
                                           default=str))
        print(f"wrote {out}")


def add_parsers(sub) -> None:
    s = sub.add_parser("select", help="episode-level context selection (BC -> RAFT -> PPO)")
    ss = s.add_subparsers(dest="select_command", required=True)
    for name, func, hlp in (("run", cmd_select_run, "train and compare with retrieve-then-rerank"),
                            ("ablate", cmd_select_ablate, "K / MMR lambda / reranker / shaping")):
        p = ss.add_parser(name, help=hlp)
        p.add_argument("--dataset", default="hotpotqa", choices=("hotpotqa", "mtrag"))
        p.add_argument("--config", help="selection YAML (default configs/rl/selection.yaml)")
        add_set_argument(p, help="dotted override, e.g. env.k=50")
        p.add_argument("--out", help="write rows + info as JSON here")
        p.add_argument("--local", "--no-ray", dest="local", action="store_true",
                       help="train in this process instead of as Ray tasks (debugging)")
        p.add_argument("--parallel", type=int, default=2, metavar="N",
                       help="Ray tasks in flight at most (default 2; raise it on a cluster)")
        if name == "run":
            p.add_argument("--split", default="test")
            p.add_argument("--limit", type=int, help="evaluation queries (default all)")
            p.add_argument("--train-limit", type=int, help="training queries (default all)")
            p.add_argument("--ppo", action="store_true", help="also run RLlib PPO from BC+RAFT")
            p.add_argument("--faithfulness", action="store_true",
                           help="score faithfulness (MTRAG; ~10 answers/s)")
        else:
            p.add_argument("--quick", action="store_true")
        p.set_defaults(func=func)
