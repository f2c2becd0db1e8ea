"""`ragpilot tune`, `ragpilot report` and `ragpilot tuner-eval`: the tuner from the shell.
`tune` is `rl.tuner.run.run_tuning` (the one tuning run); `tuner-eval` is
`rl.kernel.evaluator.evaluate`; `report` reads a tune run's directory (rl.tuner.report).

    ragpilot tune --dataset hotpotqa --out runs/tune-hotpot   # local-asha, 20 valid splits
                                                              # of query-evaluations
    ragpilot tune --dataset hotpotqa --method ppo --budget 20000 --out runs/tune-ppo
    ragpilot tune --dataset path/to/beir-folder --method random --budget 3000 --out runs/mine
    ragpilot tune --dataset hotpotqa --budget 3000        # local-asha, 3000 query-evals
    ragpilot tune ... --method tpe --ray-address 10.0.0.10:6379 --max-concurrent 4 \
        --cpus-per-trial 1 --reuse-actors no          # on Ray Tune, over a cluster's nodes
    ragpilot report --run runs/tune-hotpot [--grid]
    ragpilot tuner-eval --dataset synthetic --set variant=bm25 --set k=3 [--batch-size 50]

`tune` writes best_config.yaml (a `rag:` file `ragpilot eval --config` accepts), curve.jsonl
(one line per evaluation), plots/reward-curve.png, summary.json, the holdout run of the chosen
config (holdout/predictions.jsonl, contexts.jsonl, summary.csv) and logs it all to the MLflow
experiment `rl_autotuner` (local SQLite under runs/ unless MLFLOW_TRACKING_URI is set; the
curve plot under the run's `plots/`).
`--dataset` takes a dataset name or anything the loaders read (a BEIR folder, a HotpotQA file):
data without a committed split manifest is split once (seeded, stratified, valid/test halves)
and the split is written to the run directory's split.json and reused by later runs on the same
bytes (`rl.common.data.split_manifest`); F and R default to what gold the data has
(`DatasetSlice.for_gold`: answers -> support/f1, qrels -> sig_combined/ndcg@10, none ->
sig_faithfulness/sig_relevancy, rag.metrics.signals) unless the `--settings` file names the
dataset under `datasets:`.
`report` compares the chosen config with the static default (and the exhaustive-grid best with
`--grid`, for a `--settings` file that pins the space small enough to enumerate) on the holdout split
— Δ of the continuous reward with a paired bootstrap CI, gate verdicts apart with their own
evidence (rl.tuner.report) — prints the queries needed to detect a faithfulness change of 0.03
at 80% power from the measured per-query faithfulness, draws the Pareto frontier and reward
curve, and adds those PNGs to the tune run's MLflow run.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from rag import progress
from rag.errors import ConfigError
from rl.tuner.run import DEFAULT_METHOD, METHODS
from serving.cli.cluster import add_tune_cluster_arguments, tune_cluster_options
from serving.cli.common import (
    add_set_argument,
    add_settings_argument,
    flags,
    output_file,
    port_number,
    rag_config,
    tuner_settings,
)

FLAGS = {"method": "--method", "budget": "--budget", "resume": "--resume",
         "checkpoint": "--checkpoint", "out": "--out"}


def cmd_tune(args: argparse.Namespace) -> int:
    from rl.tuner.plan import SearchPlan
    from rl.tuner.run import Callbacks, RunOutputs, check, run_tuning

    with flags(FLAGS):
        check(args.method, args.budget, resume=args.resume,
              checkpoint=args.checkpoint)  # before the settings and data
    if args.metrics_textfile:
        output_file(args.metrics_textfile, "--metrics-textfile", ".prom")
    # a search runs on tune.Tuner when any cluster flag is given, else in this process
    cluster = tune_cluster_options(args, args.method != "ppo")
    settings = tuner_settings(args)
    if "ray_address" in cluster and args.method == "ppo":
        from rl.common.runtime import init_ray

        init_ray(address=cluster.pop("ray_address"))  # PPOTuner then keeps this runtime

    def log(it: int, m: dict, of: int | None, history: list) -> None:
        print(f"iteration {it + 1}{f'/{of}' if of else ''}: " + " ".join(
            f"{k}={v:.4g}" for k, v in m.items() if "/" not in k), flush=True)

    def log_trial(trial, spent: int) -> None:
        full = trial.full
        print(f"trial {trial.trial_id}: {trial.query_evals} queries, "
              + (f"full-split reward {full['reward']:.4f}" if full else "stopped early")
              + f"; {spent} query-evaluations spent", flush=True)

    plan = SearchPlan(args.method, args.budget, args.seed,
                      start=None if args.cold_start else settings.base_config())
    outputs = RunOutputs(out=args.out, overwrite=args.overwrite, checkpoint=args.checkpoint,
                         mlflow_dir=None if args.no_mlflow else args.mlflow_dir,
                         metrics_port=args.metrics_port,
                         metrics_textfile=args.metrics_textfile)
    tune = None
    if cluster:
        from rl.tuner.tune_search import TuneOptions

        tune = TuneOptions(**cluster)
    with flags(FLAGS):
        run = run_tuning(args.dataset, settings, plan, outputs,
                         callbacks=Callbacks(on_iteration=log, on_trial=log_trial,
                                             on_warning=lambda m: print(f"warning: {m}",
                                                                        file=sys.stderr)),
                         resume=args.resume, tune=tune,
                         allow_missing_gold=args.allow_missing_gold)
    if run.search.checkpoint:
        print("checkpoint:", run.search.checkpoint)
    ml = run.summary.get("mlflow")
    if ml:
        print(f"mlflow run {ml['run_id']} ({ml['uri']})")
    best = run.best
    print(f"best config {best.config_hash}: {best.variant} k={best.k} rerank={best.rerank} "
          f"w={best.fusion_weight} prompt={best.prompt_id}")
    obj = run.summary["objective"]
    print(f"{obj['kind']} on holdout `{obj['holdout_split']}` vs the static default: "
          f"{obj['statement']} ({obj['pareto_points']} Pareto points of "
          f"{obj['full_fidelity_configs']} full-fidelity configs; "
          f"{run.summary['evaluations']} evaluations; wrote {run.out})")
    _serve_next(run, settings)
    return 0


def gate_failures(report, thresholds) -> list[str]:
    """The hard gates (`rl.kernel.reward.hard_gates` of `thresholds`) an EvalReport fails, each
    as "name value < threshold" (a floor) or "name value > threshold" (a ceiling)."""
    from rl.kernel.reward import hard_gates

    out = []
    for g in hard_gates(thresholds):
        if report.gates.get(g.name, True):
            continue
        fmt = ".1f" if g.name == "p95_latency_ms" else ".3f"
        op = "<" if g.higher_is_better else ">"
        out.append(f"{g.name} {getattr(report, g.statistic):{fmt}} {op} {g.threshold:{fmt}}")
    return out


def _serve_next(run, settings) -> None:
    """`<out>/serve.yaml` (stable = default, canary = the tuned config at 0%) and the two
    commands that serve and promote it, when the operating point is better than the default on
    the objective (`summary.json`'s `objective.better`: shown on the tune split by its
    confidence bounds, whatever the absolute quality); nothing when it is the default. Under
    the `reward` objective, nothing either when it fails a hard gate of the reward on the
    holdout split; under every objective, nothing when it breaks the p95 SLO there."""
    from rl.kernel.space import ConfigSpace
    from serving.serve_yaml import SERVE_FILE, tuned_args, write_serve_yaml

    default = ConfigSpace(settings).base
    if run.best.config_hash == default.config_hash or not run.summary["objective"]["better"]:
        print("the tuned config is the static default: nothing to roll out")
        return
    failed = gate_failures(run.holdout, run.evaluator.thresholds)
    if settings.objective.kind != "reward":  # quality gates: the objective's, on the tune split
        failed = [f for f in failed if f.startswith("p95_latency_ms")]
    if failed:
        print(f"not rolled out: the tuned config fails a hard gate on the holdout split "
              f"({'; '.join(failed)}), so no serve.yaml was written. It met the gates on the "
              f"tune split only; see `ragpilot report --run {run.out}`, or tune again with a "
              f"larger budget or other thresholds (--settings).")
        return
    out = Path(run.out)
    path = write_serve_yaml(out / SERVE_FILE,
                            tuned_args(run.summary["dataset"], default, run.best, out),
                            note=f"ragpilot tune, run {out}")
    split = run.summary["split"]
    manifest = split["path"] or run.summary["dataset_name"]
    print(f"serve it: ragpilot serve --config {path}\n"
          f"promote it: ragpilot rollout start --candidate {out / 'best_config.yaml'} "
          f"--stable {default.config_hash} --manifest {manifest} --state-dir {out / 'rollout'}"
          "   (runbooks/canary_promotion.md)")


def _run_summary(run: Path) -> tuple[dict, list[float]]:
    """The run's summary.json (with the keys `report` reads) and its curve's rewards, else
    ConfigError naming `--run` and what is wrong (a hand-edited or truncated file was a
    traceback, after the report's evaluations)."""
    if not (run / "summary.json").exists():
        raise ConfigError("--run", f"{run} has no summary.json (run `ragpilot tune` first)")
    try:
        summary = json.loads((run / "summary.json").read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise ConfigError("--run", f"{run}/summary.json is not JSON ({exc})") from None
    if not isinstance(summary, dict) or not isinstance(summary.get("dataset"), str):
        raise ConfigError("--run", f"{run}/summary.json is not a tune run's summary (no "
                                   "`dataset`)")
    for name in ("best_config.yaml", "curve.jsonl"):
        if not (run / name).is_file():
            raise ConfigError("--run", f"{run} has no {name}: not a finished `ragpilot tune` "
                                       "run")
    try:
        lines = (run / "curve.jsonl").read_text(encoding="utf-8").splitlines()
        rewards = [float(json.loads(x)["reward"]) for x in lines if x.strip()]
    except (json.JSONDecodeError, UnicodeDecodeError, KeyError, TypeError, ValueError) as exc:
        raise ConfigError("--run", f"{run}/curve.jsonl is not the run's curve ({exc!r})"
                          ) from None
    return summary, rewards


def cmd_report(args: argparse.Namespace) -> int:
    from rag.config import RAGConfig
    from rl.common.data import TuningData
    from rl.kernel.evaluator import TunerEvaluator
    from rl.kernel.space import ConfigSpace
    from rl.tuner.ask_tell import exhaustive
    from rl.tuner.report import compare, plot_pareto, plot_run_curve, power_plan

    run = Path(args.run)
    summary, rewards = _run_summary(run)
    policy, settings_from = _run_settings(args, run)
    # the run's own split.json (data without a committed manifest) is the split it reports on
    ev = TunerEvaluator(TuningData.open(summary["dataset"], run_dir=run), policy)
    best = RAGConfig.from_yaml(run / "best_config.yaml")
    default = ConfigSpace(policy).base
    hold = ev.slice.holdout_split
    rows = [("chosen − static default", compare(ev, best, default, hold))]
    configs = {"chosen": (best, rows[0][1].candidate_reward, rows[0][1].candidate_gates),
               "static default": (default, rows[0][1].baseline_reward,
                                  rows[0][1].baseline_gates)}
    q = policy.reward_weights
    plots, figures = [], []
    if args.grid:
        grid = exhaustive(ev, ConfigSpace(policy))
        c = compare(ev, best, grid.best_config, hold)
        rows.append(("chosen − grid best", c))
        configs["grid best"] = (grid.best_config, c.baseline_reward, c.baseline_gates)
        reps = [ev.evaluate(t.config) for t in grid.trials]
        pts = [{"quality": q.alpha * r.faithfulness + q.beta * r.relevancy,
                "p95_latency_ms": r.p95_latency_ms, "cost": r.cost} for r in reps]
        marked = {}
        for name, cfg in (("static default", default), ("grid best", grid.best_config),
                          ("chosen", best)):
            r = ev.evaluate(cfg)
            marked[name] = {"quality": q.alpha * r.faithfulness + q.beta * r.relevancy,
                            "p95_latency_ms": r.p95_latency_ms, "cost": r.cost}
        for key in ("p95_latency_ms", "cost"):
            plots.append(plot_pareto(pts, marked, run / f"pareto-{key}.png", key,
                                     summary["dataset"]))
            figures.append(f"\n![quality vs {key}](pareto-{key}.png)")
    n = rows[0][1].n
    # counted by `tune` too (summary.json's `gold`); the report repeats them beside the split
    gold = [f"- `{s}`: {w}" for s in dict.fromkeys((ev.slice.tune_split, hold))
            for w in ev.data.gold_report(s)["warnings"]]
    if gold:
        gold = ["", "Gold the corpus cannot reach (labels naming absent documents score 0 by "
                "construction):", *gold]
    lines = [f"# Tuning report: {summary['dataset']} / {summary['method']} "
             f"(seed {summary['seed']})", "",
             f"Chosen config `{best.config_hash}` after {summary['evaluations']} evaluations; "
             f"settings: {settings_from}.", "", _split_line(ev), *gold, "",
             *_objective_lines(ev, policy, summary, best, default, hold, run),
             "", "## The seed's weighted reward (for reference)", "",
             f"Holdout `{hold}`, n = {n} queries. Δ is the continuous part of the reward, "
             "C = αF + βR − γ·min(p95/T,2) − δ·min(cost/C_ref,2), with a paired bootstrap CI "
             "(10k resamples of queries). The gate penalty λ·P is a step function, so it is "
             "not bootstrapped: each config's gates are listed below with their own evidence, "
             "and the full reward C − λ·P is given as a point value.", "",
             "| comparison on holdout | Δ C (relative) | 95% CI (paired bootstrap, 10k) "
             "| Δ full reward (point) |", "|---|---|---|---|"]
    lines += [f"| {name} | {c.diff:+.4f} ({c.relative:+.1%}) | "
              f"[{c.ci_low:+.4f}, {c.ci_high:+.4f}] | {c.reward_diff:+.4f} |"
              for name, c in rows]
    lines += ["", "| config | full reward | gates: verdict, value [95% CI] vs threshold |",
              "|---|---|---|"]
    lines += [f"| {name} `{cfg.config_hash}` | {r:.4f} | "
              + "; ".join(g.describe() for g in gates) + " |"
              for name, (cfg, r, gates) in configs.items()]
    plan = power_plan(ev, ev.table(best, hold), ev.table(default, hold))
    lines += ["", f"Power (chosen vs static default on `{hold}`): {plan.describe()}"]
    lines += figures
    if rewards:
        plots.append(plot_run_curve(rewards, run / "reward-curve.png",
                                    f"{summary['dataset']} / {summary['method']}: reward "
                                    "per evaluation"))
        lines.append("\n![reward curve](reward-curve.png)")
    (run / "report.md").write_text("\n".join(lines) + "\n")
    ml = summary.get("mlflow")
    if ml and plots and not args.no_mlflow:
        from rl.common.tracking import log_plots

        logged = log_plots(ml["uri"], ml["run_id"], plots)
        print(f"logged {', '.join(logged)} to mlflow run {ml['run_id']}")
    print((run / "report.md").read_text())
    return 0


def _run_settings(args: argparse.Namespace, run: Path):
    """The settings `report` reads the run with: `--settings` when given, else the run's own
    settings.yaml (what it was tuned with), else the defaults; and where they came from."""
    from rl.kernel.settings import TunerSettings

    if args.settings or getattr(args, "legacy_settings", None):
        return tuner_settings(args), f"`{args.settings or args.legacy_settings}` (--settings)"
    own = run / "settings.yaml"
    if own.is_file():
        return TunerSettings.from_yaml(own), f"the run's own `{own.name}`"
    return TunerSettings.defaults(), "the defaults (the run stored no settings.yaml)"


def _objective_lines(ev, policy, summary: dict, best, default, hold: str, run: Path
                     ) -> list[str]:
    """The report's head in the objective's terms: the statement, and every quality metric and
    the cost (tokens, p95) as paired deltas chosen − static default on `hold` with 95% CIs
    (10k paired resamples); recall@10 and nDCG@10 at that fixed depth for both configs."""
    from rl.kernel.objective import COST, P95, columns, paired_deltas, statement

    obj = policy.objective
    better = best.config_hash != default.config_hash
    d = paired_deltas(columns(ev, ev.table(best, hold)), columns(ev, ev.table(default, hold)),
                      10_000, 0, obj.level)
    said = statement(obj.kind, d, obj.margin, obj.level, better,
                     (summary.get("objective") or {}).get("reason", "the run chose it"))
    out = [f"## Objective `{obj.kind}` (margin {obj.margin:g}, one-sided {obj.level:.0%} "
           "bounds)", "", f"**Holdout `{hold}`, chosen vs static default: {said}.**", "",
           "| metric | chosen | static default | Δ (chosen − default) | 95% CI (paired "
           "bootstrap, 10k) | n |", "|---|---|---|---|---|---|"]
    for m, x in d.items():
        fmt = ".1f" if m in (COST, P95) else ".4f"
        rel = f" ({x.relative:+.1%})" if m in (COST, P95) and x.baseline else ""
        out.append(f"| {m} | {x.candidate:{fmt}} | {x.baseline:{fmt}} | {x.diff:+{fmt}}{rel} "
                   f"| [{x.ci_low:+{fmt}}, {x.ci_high:+{fmt}}] | {x.n} |")
    out += ["", "quality = (αF + βR)/(α + β) per query; recall@10 and ndcg@10 read both "
            "configs' ranked lists at depth 10 (comparable across configs, unlike recall@k at "
            "each config's own k); p95 compares 95th percentiles of the cost model's latency."]
    pj = run / "pareto.json"
    if pj.is_file():
        pareto = json.loads(pj.read_text(encoding="utf-8"))
        out += ["", f"Operating point from the Pareto front of {len(pareto['front'])} points "
                f"(of {pareto['n_points']} full-fidelity configs on `{pareto['split']}`): "
                f"{pareto['reason']}.", "", "![Pareto front](pareto.png)"]
    return out


def _split_line(ev) -> str:
    """Where the report's splits come from and which metrics play F and R."""
    d = ev.data
    sizes = ", ".join(f"{s} n = {len(x)}" for s, x in sorted(d.splits.items()))
    where = f" (`{d.split_path}`)" if d.split_path else ""
    return (f"Data `{d.name}`: {d.split_source} split{where}: {sizes}. "
            f"F = `{ev.slice.faithfulness}`, R = `{ev.slice.relevancy}`.")


def cmd_tuner_eval(args: argparse.Namespace) -> int:
    from rl.kernel.evaluator import evaluate

    cfg = rag_config(args.config, args.set)
    settings = tuner_settings(args)
    with progress.stage(f"tuner-eval: score {cfg.config_hash} on {args.dataset} (opens or "
                        "builds its indexes; retrieval rows are cached for later runs)"):
        rep = evaluate(cfg, args.dataset, args.split, settings, args.batch_size, args.seed,
                       allow_missing_gold=args.allow_missing_gold)
    for w in rep.warnings:
        print(f"warning: {w}", file=sys.stderr)
    print(json.dumps(rep.to_dict(), indent=2, default=str))
    return 0


def add_parsers(sub) -> None:
    s = sub.add_parser("tune", help=f"tune a RAG config on a dataset (default: {DEFAULT_METHOD})")
    s.add_argument("--dataset", default="synthetic",
                   help="a dataset name or a path the loaders read (BEIR folder, HotpotQA file)")
    s.add_argument("--method", default=DEFAULT_METHOD, choices=METHODS,
                   help=f"{DEFAULT_METHOD} (the default: local search + ASHA over fidelity "
                        "rungs), tpe (Optuna TPE), random, grid (every config of a pinned "
                        "small space), hyperopt, or ppo (an RLlib PPO tuner). A search runs in "
                        "this process, or on Ray Tune when a cluster flag below is given")
    s.add_argument("--cold-start", action="store_true",
                   help="the searches but grid: do not evaluate the static default as the "
                        "first trial")
    add_settings_argument(s)
    s.add_argument("--budget", type=int,
                   help="query-evaluations (one config scored on one query), every method: a "
                        "search starts no trial once spent (default 20 x the tune split; grid: "
                        "every config on it); ppo "
                        "gets budget / min(episode.batch_size, tune split) steps, each one "
                        "config on one batch (default 5 PPO iterations and the read-out)")
    s.add_argument("--seed", type=int, default=0)
    s.add_argument("--out", default="runs/tune",
                   help="run directory: best_config.yaml, summary.json, the holdout, and "
                        "serve.yaml (default as stable, tuned as a 0%% canary) when the tuned "
                        "config differs from the default")
    s.add_argument("--checkpoint", action="store_true", help="save the PPO checkpoint")
    s.add_argument("--resume", help="PPO checkpoint directory to continue from")
    s.add_argument("--mlflow-dir", default="runs/mlflow")
    s.add_argument("--no-mlflow", action="store_true")
    s.add_argument("--metrics-port", type=port_number,
                   help="export tuner metrics on 127.0.0.1:PORT")
    s.add_argument("--metrics-textfile", help="write tuner metrics to this .prom file")
    s.add_argument("--allow-missing-gold", action="store_true",
                   help="tune even when more than half of the valid or test questions have no "
                        "gold in the corpus (their retrieval scores are 0)")
    s.add_argument("--overwrite", action="store_true",
                   help="--out holds a finished run: replace its results (refused without "
                        "this, so two runs never mix in one directory)")
    add_tune_cluster_arguments(s)
    s.set_defaults(func=cmd_tune)

    s = sub.add_parser("report", help="holdout comparison, CIs and Pareto plots of a tune run")
    s.add_argument("--run", required=True)
    add_settings_argument(s)
    s.add_argument("--grid", action="store_true",
                   help="also evaluate the exhaustive grid (a space of at most 20,000 configs: "
                        "pin heads in the --settings file; the default space has millions)")
    s.add_argument("--no-mlflow", action="store_true",
                   help="do not add the plots to the tune run's MLflow run")
    s.set_defaults(func=cmd_report)

    s = sub.add_parser("tuner-eval", help="evaluate(config, slice): F, R, latency, reward")
    s.add_argument("--dataset", default="synthetic")
    s.add_argument("--split")
    s.add_argument("--config", help="YAML with a `rag:` mapping (configs/rag/default.yaml)")
    add_set_argument(s)
    add_settings_argument(s)
    s.add_argument("--batch-size", type=int)
    s.add_argument("--seed", type=int, default=0)
    s.add_argument("--allow-missing-gold", action="store_true",
                   help="evaluate even when more than half of the split's questions have no "
                        "gold in the corpus")
    s.set_defaults(func=cmd_tuner_eval)

