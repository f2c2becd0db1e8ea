"""`ragpilot router train`: the per-query router (which config answers each question: the
supervised router over the config portfolio, `rl.routing.train`) trained on a dataset, checked
on its holdout split against the best static config and the static default, and saved as a
policy directory the Serve app serves. `--learner ppo` trains the residual PPO policy over that
router instead (`rl.routing.train_ppo`: RLlib, minutes per seed on 2 cores) and checks it
against the router, best static and the default. `--learner cascade` fits the threshold
cascade (`rl.routing.cascade`: a cheap config answers, a calibrated confidence on the question's
features and that attempt's signals escalates to a stronger config or abstains, at the best
static config's valid tokens) and checks its quality and tokens apart against best static.

    ragpilot router train --dataset hotpotqa --out runs/policy/hotpotqa [--max-train 250]
    ragpilot router train --dataset path/to/beir-folder --out runs/policy/mine \
        --add-config tuned=runs/my-tune/best_config.yaml --equal-cost
    ragpilot router train --learner ppo --ppo-seeds 3 --out runs/policy/synthetic-ppo
    ragpilot router train --learner cascade --dataset hotpotqa --out runs/policy/hotpotqa-cascade

Output: the holdout report (report.md in the directory) and the verdict on stdout; serve the
directory with `serve: {policy: {dir: DIR}, traffic: {mode: policy}}`. Each stage (rows,
features, the router's cross-validation, PPO's iterations) says what it did on stderr. Bad input
exits 2 naming the flag. `ragpilot policy train` is the command's old name, accepted for one
release with a one-line deprecation notice on stderr.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from rag import progress
from rag.errors import ConfigError
from serving.cli.common import add_settings_argument, flags, tuner_settings

FLAGS = {"extra": "--add-config", "dataset": "--dataset", "out": "--out",
         "max_train": "--max-train", "seeds": "--ppo-seeds", "iters": "--ppo-iters",
         "resume": "--resume"}


def _extra(specs: list[str] | None):
    from rag.config import RAGConfig

    out = []
    for spec in specs or []:
        name, sep, path = spec.partition("=")
        if not sep or not name or not path:
            raise ConfigError("--add-config", f"{spec!r}: expected NAME=PATH (a rag: YAML, "
                                              "e.g. best_config.yaml of ragpilot tune)")
        if not Path(path).is_file():
            raise ConfigError("--add-config", f"{path} is not a file" if Path(path).exists()
                              else f"{path} does not exist")
        out.append((name, RAGConfig.from_yaml(path)))
    return out


DEPRECATED_GROUP = "policy"
"""The command group's old name (`ragpilot policy train`), kept for one release."""


def cmd_train(args: argparse.Namespace) -> int:
    from rl.routing.train import train_cascade_policy, train_router_policy

    if args.command == DEPRECATED_GROUP:
        print("deprecated: `ragpilot policy train` is now `ragpilot router train` (the old name "
              "will be removed in the next release)", file=sys.stderr)
    if args.max_train is not None and args.max_train < 2:
        raise ConfigError("--max-train", "must be >= 2")
    if args.seed < 0:  # numpy's generators take no negative seed
        raise ConfigError("--seed", "must be >= 0")
    extra = _extra(args.add_config)
    settings = tuner_settings(args)
    if args.learner != "ppo":
        for flag, given in (("--ppo-config", args.ppo_config), ("--ppo-seeds", args.ppo_seeds),
                            ("--ppo-iters", args.ppo_iters), ("--resume", args.resume or None)):
            if given is not None:
                raise ConfigError(flag, "applies to --learner ppo only")
    # a stage, so a log hears from it every ~10 s between the training's own lines
    with progress.stage(f"router train --learner {args.learner} on {args.dataset}"):
        if args.learner == "ppo":
            run = _train_ppo(args, settings, extra)
        elif args.learner == "cascade":
            if args.equal_cost:
                raise ConfigError("--equal-cost", "--learner cascade always holds its valid "
                                                  "tokens to best static's")
            with flags(FLAGS):
                run = train_cascade_policy(args.dataset, settings, args.out, seed=args.seed,
                                           max_train=args.max_train, extra=extra, log=_stderr,
                                           overwrite=args.overwrite)
        else:
            with flags(FLAGS):
                run = train_router_policy(args.dataset, settings, args.out, seed=args.seed,
                                          max_train=args.max_train, extra=extra,
                                          equal_cost=args.equal_cost, log=_stderr,
                                          overwrite=args.overwrite)
    from serving.serve_yaml import SERVE_FILE, policy_args, write_serve_yaml

    serve = write_serve_yaml(run.out / SERVE_FILE,
                             policy_args(args.dataset, settings.base_config(), run.out),
                             note=f"ragpilot router train, policy {run.out}")
    print((run.out / "report.md").read_text())
    for w in run.warnings:
        print(f"warning: {w}", file=sys.stderr)
    print(f"wrote {run.out} (policy.json, model.pkl, report.json, report.md, {SERVE_FILE}); "
          f"verdict: {run.verdict}")
    if run.verdict in ("router", "ppo-policy", "cascade"):
        print(f"serve it: ragpilot serve --config {serve}")
    elif run.verdict == "supervised-router":
        print(f"serve the router: {run.reason}. Train and serve it "
              f"(ragpilot router train without --learner ppo), or serve this policy anyway "
              f"to log exploration data (ragpilot serve --config {serve})")
    else:  # written all the same: serving it logs propensities that a later run can learn from
        who = {"ppo": "PPO policy", "cascade": "cascade"}.get(args.learner, "router")
        print(f"the {who} is not ahead of the best static config `{run.best_static}` on the "
              f"holdout: serve that config, or serve the policy anyway to log exploration "
              f"data (ragpilot serve --config {serve})")
    return 0


def _stderr(message: str) -> None:
    """Progress lines go to stderr: stdout carries the report."""
    print(message, file=sys.stderr, flush=True)


def _train_ppo(args: argparse.Namespace, settings, extra):
    from rl.routing.settings import PPOPolicySettings
    from rl.routing.train_ppo import train_ppo_policy

    if args.equal_cost:
        raise ConfigError("--equal-cost", "--learner ppo always holds the policy and the "
                                          "router it defers to to best static's valid tokens")
    if args.ppo_config is not None and not Path(args.ppo_config).is_file():
        raise ConfigError("--ppo-config", f"{args.ppo_config} does not exist")
    ppo = PPOPolicySettings.load(args.ppo_config)
    uri = None
    if not args.no_mlflow:
        from rl.common.tracking import tracking_uri

        uri = tracking_uri(Path(args.mlflow_dir))
    with flags(FLAGS):
        return train_ppo_policy(args.dataset, settings, ppo, args.out, seed=args.seed,
                                seeds=args.ppo_seeds, iters=args.ppo_iters,
                                max_train=args.max_train, extra=extra, resume=args.resume,
                                tracking_uri=uri, log=_stderr, overwrite=args.overwrite)


def add_parsers(sub) -> None:
    """`router train`, and `policy train` (its deprecated name) with the same arguments."""
    _add_group(sub, "router", "per-query router (which config answers each question): train "
                              "the supervised router, or --learner ppo")
    _add_group(sub, DEPRECATED_GROUP, "deprecated name of `router`")


def _add_group(sub, name: str, help: str) -> None:
    p = sub.add_parser(name, help=help)
    ps = p.add_subparsers(dest="router_command", required=True)
    s = ps.add_parser("train", help="fit the router over the config portfolio, check it on "
                                    "the holdout split, save a servable policy directory")
    s.add_argument("--dataset", default="synthetic",
                   help="a dataset name or a path the loaders read (BEIR folder, HotpotQA file)")
    s.add_argument("--out", default="runs/policy",
                   help="policy directory: policy.json, model.pkl, report.json/.md and "
                        "serve.yaml (ragpilot serve --config it)")
    add_settings_argument(s)
    s.add_argument("--add-config", action="append", metavar="NAME=PATH",
                   help="one more arm: a rag: YAML (e.g. ragpilot tune's best_config.yaml)")
    s.add_argument("--max-train", type=int,
                   help="train on a seeded subset of this many train-split queries "
                        "(data with a train split, e.g. hotpotqa, scifact)")
    s.add_argument("--equal-cost", action="store_true",
                   help="hold the router's mean tokens on valid to the best static config's")
    s.add_argument("--overwrite", action="store_true",
                   help="replace a policy already trained into --out (its policy.json, "
                        "model.pkl, reports, serve.yaml, split.json and ppo/; nothing else)")
    s.add_argument("--seed", type=int, default=0)
    s.add_argument("--learner", choices=("router", "ppo", "cascade"), default="router",
                   help="router: the supervised router (default, the shipped policy); ppo: a "
                        "residual RLlib PPO policy over that router (rl.routing.train_ppo); "
                        "cascade: the threshold cascade at equal cost (rl.routing.cascade)")
    s.add_argument("--ppo-config", help="PPO policy YAML (configs/routing/ppo.yaml)")
    s.add_argument("--ppo-seeds", type=int,
                   help="train this many of the config's seeds (default all), keep the best "
                        "on valid")
    s.add_argument("--ppo-iters", type=int, help="PPO iterations per seed (default the "
                                                 "config's train.iters)")
    s.add_argument("--resume", action="store_true",
                   help="--learner ppo: reuse the seeds finished in --out and continue an "
                        "unfinished one from its checkpoint (the same run only)")
    s.add_argument("--mlflow-dir", default="runs/mlflow",
                   help="--learner ppo: local MLflow store for each seed's iterations "
                        "($MLFLOW_TRACKING_URI wins)")
    s.add_argument("--no-mlflow", action="store_true")
    s.set_defaults(func=cmd_train)
