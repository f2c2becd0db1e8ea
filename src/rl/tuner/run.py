"""The one tuning run, and the one tuner evaluation: what `ragpilot tune` / `tuner-eval`, the
tuning benchmarks (bench/tuning.py, bench/tuning_budget.py) and the Serve app's
`POST /tuner/evaluate` jobs call.

    search(ev, settings, "ppo", budget=100, unit="steps", seed=0) -> Search
        the search alone on an open TunerEvaluator (the benchmarks share one evaluator between
        methods and seeds, so each table is computed once);
    run_tuning(dataset, settings, "local-asha", budget=3000, out="runs/tune", ...) -> TuningRun
        search + the artefacts of a run directory (`dataset`: a name or any path the loaders
        read; data without a committed split manifest gets a seeded split, written to
        split.json in the run directory: `rl.common.data.split_manifest`): best_config.yaml (a `rag:` file
        `ragpilot eval --config` accepts), curve.jsonl (one line per evaluation),
        plots/reward-curve.png, summary.json, holdout/ (predictions.jsonl, contexts.jsonl,
        summary.csv of the chosen config on the holdout split), optionally checkpoint/ (PPO)
        and an MLflow run in experiment `rl_autotuner`;
    evaluate_request(request) -> dict
        `rl.kernel.evaluator.evaluate(config, dataset, split, batch_size, seed)` as JSON.

Budget: `unit="steps"` counts every evaluation (one config on one batch); `"configs"` counts
distinct configs (a revisit reads the cached table); `"queries"` (TUNE_METHODS, the searches on
Ray Tune: `rl.tuner.tune_search`) counts query-evaluations summed over all trials. PPO under a step budget trains
`ppo_iterations(budget, settings)` iterations and reads out one greedy episode. Errors are
ConfigError naming `method`, `budget`, `budget_unit` or `resume`. Nothing here prints:
progress reaches the caller through `on_iteration`.
"""

from __future__ import annotations

import json
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rag.errors import ConfigError

TUNE_METHODS = ("tpe", "tpe-asha", "local-asha", "tpe-hyperband", "hyperopt", "tune-random",
                "tune-grid")
"""Searches on Ray Tune (`rl.tuner.tune_search`; `tune-random` / `tune-grid` are its random and
grid methods, apart from the in-process `random` / `grid` baselines). Their budget is counted in
query-evaluations (unit "queries")."""
METHODS = ("ppo", "random", "optuna", "bandit-ucb", "bandit-thompson", "grid", *TUNE_METHODS)
"""`optuna` is the in-process TPE loop of `baselines.optuna_search` (today's behaviour, kept
for the committed benchmarks); `tpe` is the same sampler on `tune.Tuner` with gate constraints."""
DEFAULT_METHOD = "local-asha"
"""What `run_tuning`, `ragpilot tune` and `ragpilot demo` search with unless told otherwise:
`rl.tuner.tune_search.DEFAULT_SEARCHER` (local search + ASHA over fidelity rungs), the searcher
that reached 99% of the best-known reward soonest on every dataset of `bench/results/search.md`."""
BUDGET_UNITS = ("steps", "configs", "queries")
WARM_STARTS = ("optuna", *(m for m in TUNE_METHODS if m != "tune-grid"))
"""Methods whose first trial can be a given config (`search(start=...)`)."""

OnIteration = Callable[[int, dict[str, Any], "int | None", list], None]
"""`(iteration index from 0, its metrics, iterations planned (None under a configs budget),
the PPO environment's history so far)`."""


@dataclass
class Search:
    """A finished search: the tuner's `result` and, for PPO, the environment's per-step
    `history` (faithfulness, relevancy, p95, cost, reward, config_hash per evaluation; empty
    for the baselines) and the saved `checkpoint` path when one was asked for."""

    result: Any
    history: list[dict[str, Any]] = field(default_factory=list)
    checkpoint: str | None = None


@dataclass
class TuningRun:
    """A finished `run_tuning`: `summary` (as written to summary.json), the chosen config,
    its valid and holdout EvaluationReports, the run directory, the search itself and the
    TunerEvaluator it ran on (its cached tables and `seen` configs: what reports and the demo
    compare and plot without evaluating again)."""

    summary: dict[str, Any]
    best: Any
    valid: Any
    holdout: Any
    out: Path
    search: Search
    evaluator: Any = None


def default_unit(method: str) -> str:
    """The budget unit of `method`: "queries" for TUNE_METHODS, else "steps"."""
    return "queries" if method in TUNE_METHODS else "steps"


def check(method: str, budget: int | None, unit: str | None, *, resume: Any = None,
          checkpoint: bool = False) -> None:
    """ConfigError unless `method` is one of METHODS, `unit` one of BUDGET_UNITS that fits it
    (None: `default_unit`; TUNE_METHODS count "queries" only, the others "steps" or
    "configs"), `budget` None or >= 1, and `resume` / `checkpoint` (PPO's) asked of ppo
    only: another method would ignore them."""
    if method not in METHODS:
        raise ConfigError("method", f"must be one of {', '.join(METHODS)}")
    for name, given in (("resume", resume), ("checkpoint", checkpoint)):
        if given and method != "ppo":
            raise ConfigError(name, f"is PPO's (a policy checkpoint); --method {method} has "
                                    "none: add --method ppo")
    if budget is not None and budget < 1:
        raise ConfigError("budget", "must be >= 1")
    unit = unit or default_unit(method)
    if unit not in BUDGET_UNITS:
        raise ConfigError("budget_unit", f"must be one of {', '.join(BUDGET_UNITS)}, "
                                         f"got {unit!r}")
    if (unit == "queries") != (method in TUNE_METHODS):
        raise ConfigError("budget_unit", f"{method} counts its budget in "
                                         f"{default_unit(method)}" + (
                                             "" if method in TUNE_METHODS
                                             else " or configs") + f", not {unit}")


def ppo_iterations(budget: int, settings: Any) -> int:
    """PPO iterations a step budget buys: training steps plus one greedy read-out episode."""
    return max(1, (budget - settings.episode.length) // settings.ppo.train_batch_size)


def default_budget(settings: Any, method: str = "ppo", n_tune: int | None = None) -> int:
    """Five PPO iterations' worth of evaluations; for TUNE_METHODS, 20 full-split
    evaluations' worth of query-evaluations (`n_tune`: queries in the tune split)."""
    if method in TUNE_METHODS:
        if n_tune is None:
            raise ValueError("n_tune: needed for the query budget of a Ray Tune search")
        return 20 * n_tune
    return 5 * settings.ppo.train_batch_size


def search(ev: Any, settings: Any, method: str, budget: int, unit: str | None = None,
           seed: int = 0, *, resume: str | Path | None = None,
           checkpoint_dir: str | Path | None = None,
           on_iteration: OnIteration | None = None, start: Any = None,
           dataset: str | None = None, storage_path: str | Path | None = None,
           mlflow_uri: str | None = None,
           tune_options: dict[str, Any] | None = None) -> Search:
    """Run `method` on the TunerEvaluator `ev` under `budget` (in `unit`, default
    `default_unit(method)`) with `seed`.
    PPO only: `resume` continues from a checkpoint directory, `checkpoint_dir` saves one at
    the end, `on_iteration` is called after each training iteration. Optuna and TUNE_METHODS
    (not tune-grid): `start` (a RAGConfig, e.g. the one in production) is the first trial.
    TUNE_METHODS only (`rl.tuner.tune_search`): `dataset` (what `ev` was opened from, for data
    read from a path), `storage_path` (Tune's experiment folder), `mlflow_uri` (one MLflow run
    per trial), `tune_options` (more `tune_search` keywords: `max_concurrent`,
    `resources_per_trial`, `reuse_actors`, `ray_address`); the Search's `history` is one
    record per rung evaluation."""
    from rl.tuner import baselines

    check(method, budget, unit, resume=resume, checkpoint=checkpoint_dir is not None)
    unit = unit or default_unit(method)
    if method in TUNE_METHODS:
        from rl.kernel.space import ConfigSpace
        from rl.tuner.tune_search import tune_search

        found = tune_search(ev, ConfigSpace(ev.policy), method=method.removeprefix("tune-"),
                            budget=budget, seed=seed, start=start, dataset=dataset,
                            storage_path=storage_path, mlflow_uri=mlflow_uri,
                            **(tune_options or {}))
        for t in found.trials:  # reports resolve configs evaluated in trial processes
            ev.seen.setdefault(t["config_hash"], t["config"])
        return Search(found.to_tune_result(), found.history)
    if method == "ppo":
        from rl.tuner.ppo import PPOTuner

        tuner = PPOTuner(ev, settings, seed=seed)
        try:
            if resume:
                if not Path(resume).exists():
                    raise ConfigError("resume", f"checkpoint {resume} does not exist")
                tuner.restore(resume)
            iters = ppo_iterations(budget, settings) if unit == "steps" else None

            def log(it: int, metrics: dict[str, Any]) -> None:
                if on_iteration is not None:
                    on_iteration(it, metrics, iters, tuner.history)

            res = tuner.train(iters, log=log) if iters is not None else tuner.train_configs(
                budget, log=log)
            saved = tuner.save(Path(checkpoint_dir)) if checkpoint_dir else None
            return Search(res, list(tuner.history), saved)
        finally:
            tuner.stop()
    if method == "grid":
        return Search(baselines.grid_search(ev))
    if method == "random":
        return Search(baselines.random_search(ev, budget, seed, unit=unit))
    if method == "optuna":
        return Search(baselines.optuna_search(ev, budget, seed, unit=unit, start=start))
    return Search(baselines.bandit_search(ev, budget, seed, method.split("-")[1], unit=unit))


def steps_of(ev: Any, found: Search) -> list[dict[str, Any]]:
    """One record per evaluation: PPO's environment history, or for a baseline each evaluated
    config's full-split numbers with the reward the search observed."""
    if found.history:
        return found.history
    steps = []
    for c in found.result.curve:
        rep = ev.evaluate(ev.seen[c["config_hash"]])
        steps.append({"faithfulness": rep.faithfulness, "relevancy": rep.relevancy,
                      "p95_latency_ms": rep.p95_latency_ms, "cost": rep.cost,
                      "reward": c["reward"], "config_hash": c["config_hash"]})
    return steps


RUN_FILES = ("summary.json", "best_config.yaml", "curve.jsonl", "report.md",
             "reward-curve.png", "serve.yaml", "split.json", "holdout", "plots",
             "settings.yaml", "pareto.json", "pareto.png")
"""What `run_tuning` and `ragpilot report` write into a run directory (`--overwrite` removes
these, and nothing else)."""


def _claim_run_directory(out: Path, overwrite: bool, resumed: bool) -> None:
    """Refuse to write a new run over a finished one (its results would be mixed with the new
    run's: report.md and plots of the old run beside the new best config), unless asked."""
    from rl.common.data import claim_directory

    if not resumed:
        claim_directory(out, "summary.json", "a finished tune run", RUN_FILES, overwrite)


def run_tuning(dataset: str, settings: Any, method: str = DEFAULT_METHOD,
               budget: int | None = None,
               *, unit: str | None = None, seed: int = 0, out: str | Path = "runs/tune",
               resume: str | Path | None = None, checkpoint: bool = False,
               mlflow_dir: str | Path | None = "runs/mlflow", metrics_port: int | None = None,
               metrics_textfile: str | Path | None = None,
               on_iteration: OnIteration | None = None,
               warm_start: bool = False,
               tune_options: dict[str, Any] | None = None,
               allow_missing_gold: bool = False,
               on_warning: Callable[[str], None] | None = None,
               overwrite: bool = False) -> TuningRun:
    """Tune a RAG config on `dataset` with `settings` (TunerSettings) and write the run
    directory `out` (see the module docstring). `budget` (in `unit`, default
    `default_unit(method)`) defaults to `default_budget`. TUNE_METHODS keep Tune's experiment
    under `out`/ray_tune and log each trial to MLflow experiment `rl_autotuner_trials`.
    `mlflow_dir`: where the local MLflow store goes unless MLFLOW_TRACKING_URI is set (None:
    no MLflow run). `metrics_port` / `metrics_textfile`: Prometheus export of the run.
    `warm_start`: Optuna's (and TUNE_METHODS' but tune-grid's) first trial is the settings' base config (the static default), so
    the run cannot recommend a config that scored below the default on the tuning split.
    `tune_options`: TUNE_METHODS' cluster keywords for `tune_search` (see `search`).
    Before any search, the gold of the tune and holdout splits is checked against the corpus
    (`TuningData.check_gold`): a split with more than half of its questions unreachable is a
    DataError unless `allow_missing_gold`; each counted problem goes to `on_warning` (default:
    `warnings.warn`) and into summary.json's `gold`. An `out` holding a finished run
    (summary.json) is a ConfigError unless `overwrite` (its run files are removed first, so
    nothing of the old run stays beside the new one) or `resume`."""
    import yaml

    from rag.evaluate import evaluate as rag_evaluate
    from rag.pipeline import Pipeline
    from rl.common.data import TuningData, run_directory
    from rl.kernel.evaluator import TunerEvaluator
    from rl.tuner.prometheus import for_tune_run
    from rl.tuner.report import plot_run_curve

    check(method, budget, unit, resume=resume, checkpoint=checkpoint)
    _claim_run_directory(Path(out), overwrite, resumed=resume is not None)
    unit = unit or default_unit(method)
    if Path(dataset).exists():  # a path: `ragpilot report` reopens it from any directory
        dataset = str(Path(dataset).resolve())
    with run_directory(out) as out:
        ev = TunerEvaluator(TuningData.open(dataset, run_dir=out), settings)
        gold = ev.data.check_gold((ev.slice.tune_split, ev.slice.holdout_split),
                                  allow_missing_gold)
    warn = on_warning or (lambda m: warnings.warn(m, UserWarning, stacklevel=3))
    for split in gold:
        for w in ev.data.gold_warnings(split):
            warn(w)
    budget = budget or default_budget(settings, method,
                                      len(ev.data.examples(ev.slice.tune_split)))
    mlflow_uri = None
    if mlflow_dir is not None:
        from rl.common.tracking import tracking_uri

        mlflow_uri = tracking_uri(Path(mlflow_dir))
    prom = for_tune_run(settings, ev.thresholds, metrics_port, metrics_textfile)

    def on_iter(it: int, metrics: dict[str, Any], of: int | None, history: list) -> None:
        if on_iteration is not None:
            on_iteration(it, metrics, of, history)
        if prom is not None:
            prom.consume(history)
            prom.flush()

    found = search(ev, settings, method, budget, unit, seed, resume=resume,
                   checkpoint_dir=out / "checkpoint" if checkpoint else None,
                   on_iteration=on_iter,
                   start=settings.base_config() if warm_start else None, dataset=dataset,
                   storage_path=(out / "ray_tune").resolve(),
                   mlflow_uri=mlflow_uri if method in TUNE_METHODS else None,
                   tune_options=tune_options if method in TUNE_METHODS else None)
    res = found.result
    steps = steps_of(ev, found)
    if prom is not None:
        prom.consume(steps, resolve=ev.seen.get)
        prom.flush()
    # the operating point: the objective's pick from the front of full-fidelity evaluations
    from rl.tuner.pareto import build as build_pareto
    from rl.tuner.pareto import objective_summary

    pareto = build_pareto(ev, settings, search_best=res.best_config, seed=seed)
    pareto.write(out, f"{dataset} / {method}: {settings.objective.kind}")
    best = pareto.chosen
    valid = ev.evaluate(best)
    test = ev.evaluate(best, ev.slice.holdout_split)
    (out / "best_config.yaml").write_text(best.to_yaml())
    (out / "settings.yaml").write_text(  # what `ragpilot report` reads the run back with
        yaml.safe_dump({"policy": settings.model_dump(mode="json", by_alias=True)},
                       sort_keys=False))
    with (out / "curve.jsonl").open("w") as f:
        for s in steps:
            f.write(json.dumps({k: v for k, v in s.items() if k != "config"}) + "\n")
    holdout = rag_evaluate(Pipeline(ev.data.indexes, best),
                           ev.data.examples(ev.slice.holdout_split))
    holdout.write(out / "holdout")
    data = ev.data
    summary = {"dataset": dataset, "dataset_name": data.name, "method": method, "seed": seed,
               "warm_start": bool(warm_start and method in WARM_STARTS),
               "split": {"source": data.split_source,
                         "path": None if data.split_path is None else str(data.split_path),
                         "tune": ev.slice.tune_split, "holdout": ev.slice.holdout_split,
                         "sizes": {s: len(x) for s, x in data.splits.items()}},
               "metrics": {"faithfulness": ev.slice.faithfulness,
                           "relevancy": ev.slice.relevancy},
               # gold the corpus cannot reach, per split (rl.common.data.TuningData.gold_report)
               "gold": gold,
               "evaluations": res.evaluations, "budget_unit": unit, "budget": budget,
               "query_evals": res.extra.get("query_evals"),
               "distinct_configs": len({c["config_hash"] for c in res.curve}),
               "wall_s": res.wall_s,
               "best_config_hash": best.config_hash,
               "objective": objective_summary(ev, pareto, settings, seed=seed),
               "valid": valid.to_dict(),
               "holdout": test.to_dict(),
               # the latency prices every reward of this run used (rl.kernel.cost_model)
               "cost_model": ev.cost_model.to_dict()}
    (out / "summary.json").write_text(json.dumps(summary, indent=2, default=str))
    curve_png = plot_run_curve([float(s["reward"]) for s in steps],
                               out / "plots" / "reward-curve.png",
                               f"{dataset} / {method}: reward per evaluation") \
        if steps else None
    if mlflow_dir is not None:
        from rl.common.tracking import log_tuning_run, tracking_uri

        uri = tracking_uri(Path(mlflow_dir))
        run_id = log_tuning_run(uri, dataset, method, seed, best,
                                settings.model_dump(mode="json", by_alias=True), steps,
                                {"valid_reward": valid.reward, "test_reward": test.reward,
                                 "evaluations": res.evaluations,
                                 "pareto_points": len(pareto.front),
                                 **{f"holdout_delta_{m}": d["diff"] for m, d in
                                    summary["objective"]["holdout"].items()}},
                                ev.data.dataset.manifest_dict(), out,
                                plots=[x for x in (curve_png, out / "pareto.png") if x])
        # `ragpilot report` adds its plots to this run
        summary["mlflow"] = {"uri": uri, "run_id": run_id}
        (out / "summary.json").write_text(json.dumps(summary, indent=2, default=str))
    return TuningRun(summary, best, valid, test, out, found, ev)


def evaluate_request(request: dict[str, Any]) -> dict[str, Any]:
    """A tuner evaluation job (`POST /tuner/evaluate`): `request` holds config (a RAGConfig
    mapping), dataset (default synthetic), split, batch_size, seed (default 0),
    allow_missing_gold (default false) -> the EvaluationReport of
    `rl.kernel.evaluator.evaluate` as JSON."""
    from rl.kernel.evaluator import evaluate

    allow = bool(request.get("allow_missing_gold", False))
    report = evaluate(request["config"], dataset=request.get("dataset", "synthetic"),
                      split=request.get("split"), batch_size=request.get("batch_size"),
                      seed=int(request.get("seed", 0)), allow_missing_gold=allow)
    return report.to_dict()
