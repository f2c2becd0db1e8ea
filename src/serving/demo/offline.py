"""The demo's offline stages, each a call into the library: index (`rl.common.data.TuningData`),
tune (`rl.tuner.run.run_tuning` with the project's default searcher, `local-asha`: local
search with ASHA over fidelity rungs, in this process, on a budget of query-evaluations), the per-query router
(`rl.routing.train`: the shipped per-query policy over a config portfolio plus the tuned config), and the holdout report (`rl.tuner.report.compare` + paired bootstraps of
quality and cost apart, Pareto and reward-curve PNGs).

Nothing here prints; the orchestrator (`serving.demo`) shows progress and results.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from rl.tuner.run import DEFAULT_METHOD

DATASET = "synthetic"
SEARCHER = DEFAULT_METHOD


@dataclass
class HoldoutReport:
    """Tuned vs default on the holdout split. `reward`: Δ of the continuous reward with its
    paired-bootstrap CI (`rl.tuner.report.Comparison`); `rows`: per metric (quality = αF+βR in
    [0, 1], F, R, p95 latency in ms, cost in tokens per query) the default's and the tuned
    config's value and the paired Δ with its 95% CI; `plots`: name -> PNG path."""

    split: str
    n: int
    reward: dict[str, float]
    rows: list[dict[str, Any]]
    gates: dict[str, str]
    plots: dict[str, Path]


def index_stage() -> Any:
    """Open (or build: tantivy BM25, FAISS, entity graph) the synthetic world's indexes; the
    TuningData bundle the tuner and the Serve replicas share (same cache directory)."""
    from rl.common.data import TuningData

    return TuningData.open(DATASET)


def tune_stage(data: Any, settings: Any, splits: int, out: Path, seed: int = 0,
               mlflow_dir: Path | None = None, warm_start: bool = True) -> Any:
    """`run_tuning` with the default searcher under a budget of `splits` full valid splits of
    query-evaluations (one config on one query: a trial ASHA stops at a low rung spends only
    its rung's queries, so the search tries more configs than `splits`); writes `out`
    (best_config.yaml, curve.jsonl, plots/reward-curve.png, ...). The TuningRun."""
    from rl.tuner.plan import SearchPlan
    from rl.tuner.run import RunOutputs, run_tuning

    budget = splits * len(data.examples("valid"))  # the synthetic world tunes on "valid"
    plan = SearchPlan(SEARCHER, budget, seed,
                      start=settings.base_config() if warm_start else None)
    # the demo's own directory: each run replaces it
    return run_tuning(DATASET, settings, plan, RunOutputs(out, overwrite=True,
                                                          mlflow_dir=mlflow_dir))


def router_stage(tuned: Any, settings: Any, out: Path, seed: int = 0) -> Any:
    """The shipped per-query policy (`rl.routing.train.train_router_policy`): the supervised
    router over the 30-config portfolio plus the tuned config (arm "tuned" unless the
    portfolio has it), chosen by grouped cross-validation over the valid split (its two
    halves are the router's train and valid roles; `select_router_cv`), compared on
    the holdout with the tuned config, the best static arm and the default; a servable policy
    directory and report.md under `out`. The RouterRun."""
    from rl.routing.portfolio import portfolio
    from rl.routing.train import train_router_policy

    known = {c.config_hash: n for n, c in portfolio(settings)}
    name = known.get(tuned.config_hash, "tuned")
    extra = [] if tuned.config_hash in known else [("tuned", tuned)]
    return train_router_policy(DATASET, settings, out, seed=seed, extra=extra,
                               compare_to=(name,), overwrite=True)  # the demo re-runs


def policy_stage(run: Any, settings: Any, checkpoint: str | Path, seed: int = 0) -> Any:
    """The learned PPO policy saved by `ragpilot tune --method ppo --checkpoint`: restored into
    a tuner on `run.evaluator`, trained one more iteration, its greedy config read out. Returns
    that config's valid EvalReport (its config in `.config`); Ray is shut down afterwards so
    Serve starts its own runtime."""
    import ray

    from rl.tuner.plan import SearchPlan
    from rl.tuner.run import ppo_batch, search

    ev = run.evaluator
    steps = settings.episode.length + settings.ppo.train_batch_size  # one iteration
    budget = steps * ppo_batch(settings, len(ev.data.examples(ev.slice.tune_split)))
    try:
        found = search(ev, settings, SearchPlan("ppo", budget, seed), resume=checkpoint)
    finally:
        if ray.is_initialized():
            ray.shutdown()
    return run.evaluator.evaluate(found.result.best_config)


def _paired(a: np.ndarray, b: np.ndarray, seed: int) -> tuple[float, float, float]:
    """(mean b − a, CI low, CI high): paired bootstrap over queries, NaN pairs left out."""
    from rl.stats.bootstrap import paired_bootstrap

    ok = ~(np.isnan(a) | np.isnan(b))
    if ok.sum() < 2:
        return math.nan, math.nan, math.nan
    r = paired_bootstrap(a[ok], b[ok], 4000, seed)
    return r.mean_diff, r.ci_low, r.ci_high


def holdout_stage(run: Any, tuned: Any, default: Any, out: Path, seed: int = 0
                  ) -> HoldoutReport:
    """Compare `tuned` with `default` on the holdout split of `run.evaluator`, and
    draw the Pareto fronts (valid split, every config the search evaluated on all of it) and
    the reward curve."""
    from rl.tuner.report import compare, plot_pareto

    ev = run.evaluator
    hold = ev.slice.holdout_split
    c = compare(ev, tuned, default, hold, n_resamples=4000, seed=seed)
    w = ev.policy.reward_weights
    tabs = {name: ev.table(cfg, hold) for name, cfg in (("default", default), ("tuned", tuned))}
    per_query: dict[str, dict[str, np.ndarray]] = {}
    for name, tab in tabs.items():
        F, R = ev.quality(tab)
        per_query[name] = {"quality": w.alpha * F + w.beta * R, "faithfulness": F,
                           "relevancy": R, "latency_ms": tab["latency_ms"],
                           "cost": tab["tokens"]}
    rows = []
    for key, label, kind in (("quality", "quality αF+βR", "quality"),
                             ("faithfulness", f"F ({ev.slice.faithfulness})", "quality"),
                             ("relevancy", f"R ({ev.slice.relevancy})", "quality"),
                             ("latency_ms", "latency ms (mean)", "cost"),
                             ("cost", "cost tokens/query", "cost")):
        a, b = per_query["default"][key], per_query["tuned"][key]
        d, lo, hi = _paired(a, b, seed)
        rows.append({"metric": label, "kind": kind, "default": float(np.nanmean(a)),
                     "tuned": float(np.nanmean(b)), "delta": d, "ci_low": lo, "ci_high": hi})
    p95 = {name: ev.evaluate(cfg, hold).p95_latency_ms
           for name, cfg in (("default", default), ("tuned", tuned))}
    rows.append({"metric": "p95 latency ms", "kind": "cost", **p95,  # a quantile: no paired CI
                 "delta": p95["tuned"] - p95["default"], "ci_low": math.nan,
                 "ci_high": math.nan})
    # configs the search scored on the whole valid split: one ASHA stopped at a lower rung is
    # not completed here (that would spend evaluations the search's budget did not)
    tune = ev.slice.tune_split
    reports = [ev.evaluate(cfg) for cfg in ev.seen.values() if ev.is_cached(cfg, tune)]
    pts = [{"quality": w.alpha * r.faithfulness + w.beta * r.relevancy,
            "p95_latency_ms": r.p95_latency_ms, "cost": r.cost} for r in reports]
    marked = {}
    for name, cfg in (("static default", default), ("tuned", tuned)):
        r = ev.evaluate(cfg)
        marked[name] = {"quality": w.alpha * r.faithfulness + w.beta * r.relevancy,
                        "p95_latency_ms": r.p95_latency_ms, "cost": r.cost}
    plots = {f"pareto-{k}": plot_pareto(pts, marked, out / f"pareto-{k}.png", k,
                                        f"{DATASET} (valid split): {len(pts)} configs evaluated on all of it")
             for k in ("cost", "p95_latency_ms")}
    curve = run.out / "plots" / "reward-curve.png"
    if curve.exists():
        plots["reward-curve"] = curve
    return HoldoutReport(
        hold, c.n, {"delta": c.diff, "ci_low": c.ci_low, "ci_high": c.ci_high,
                    "relative": c.relative, "tuned_reward": c.candidate_reward,
                    "default_reward": c.baseline_reward},
        rows, {"tuned": c.gates_text(c.candidate_gates),
               "default": c.gates_text(c.baseline_gates)}, plots)
