"""The one tuning run, and the one tuner evaluation: what `ragpilot tune` / `tuner-eval`, the
demo and the Serve app's `POST /tuner/evaluate` jobs call.

    search(ev, settings, SearchPlan("local-asha", budget=2400, seed=0)) -> Search
        the search alone on an open TunerEvaluator;
    run_tuning(dataset, settings, SearchPlan("local-asha", budget=2400),
               RunOutputs(out="runs/tune"), ...) -> TuningRun
        search + the artefacts of a run directory (`dataset`: a name or any path the loaders
        read; data without a committed split manifest gets a seeded split, written to
        split.json in the run directory: `rl.common.data.split_manifest`): best_config.yaml (a
        `rag:` file `ragpilot eval --config` accepts), curve.jsonl (one line per evaluation),
        plots/reward-curve.png, summary.json, holdout/ (predictions.jsonl, contexts.jsonl,
        summary.csv of the chosen config on the holdout split), optionally checkpoint/ (PPO)
        and an MLflow run in experiment `rl_autotuner`;
    evaluate_request(request) -> dict
        `rl.kernel.evaluator.evaluate(config, dataset, split, batch_size, seed)` as JSON.

Methods (`METHODS`): the searches of `rl.tuner.searchers` (local-asha, tpe, random, grid,
hyperopt), run by the one search protocol (`rl.tuner.ask_tell`), and ppo (`rl.tuner.ppo`).
What to search is one `rl.tuner.plan.SearchPlan` (method, budget, seed, first trial) for every
driver. A search runs in this process (`ask_tell.run_search`) unless it is given
`tune_search.TuneOptions` (Ray Tune's trial scheduling: concurrent trials, per-trial resources,
actor reuse, a cluster): then on `tune.Tuner` (`rl.tuner.tune_search`), with the same searcher
objects.

Budget: query-evaluations (one config scored on one query), for every method. A search stops
starting trials once its trials' query-evaluations reach it. PPO evaluates one config on a batch
of min(`episode.batch_size`, tune split) queries per step, so it gets budget // that batch
steps, and trains `ppo_iterations(steps, settings)` iterations before reading out one greedy
episode. Errors are ConfigError naming `method`, `budget` or `resume`. Nothing here prints:
progress reaches the caller through `Callbacks`: `on_iteration` (PPO: one call per training
iteration) and `on_trial` (a search run in this process: one call per trial), and `run_tuning`'s
stages (open
the data, the search counted in query-evaluations, the Pareto front, the holdout, MLflow) are
`rag.progress` stages, shown where the entry point turned progress on; the search's stage
counts each query-evaluation as the evaluator computes it, so a long first trial shows how far
it got (and an estimate of the rest) before it ends. On Ray Tune the trials run in other
processes: the stage counts each trial's query-evaluations when its rung result arrives
(`tune_search._Recorder`), nothing from inside a rung.
"""

from __future__ import annotations

import json
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rag.errors import ConfigError
from rl.tuner.plan import DEFAULT_SEARCHER, SearchPlan

if TYPE_CHECKING:
    from rl.kernel.evaluator import TunerEvaluator
    from rl.tuner.tune_search import TuneOptions

SEARCH_METHODS = ("local-asha", "tpe", "random", "grid", "hyperopt")
"""The searches `ragpilot tune` offers (`rl.tuner.searchers`; tpe-asha is the search
benchmark's)."""
METHODS = (*SEARCH_METHODS, "ppo")
DEFAULT_METHOD = DEFAULT_SEARCHER
"""What `run_tuning`, `ragpilot tune` and `ragpilot demo` search with unless told otherwise:
`rl.tuner.plan.DEFAULT_SEARCHER` (local search + ASHA over fidelity rungs)."""
WARM_STARTS = ("local-asha", "tpe", "random", "hyperopt")
"""Methods whose first trial can be a given config (`SearchPlan.start`; grid and ppo ignore
it)."""
MLFLOW_TRIALS_EXPERIMENT = "rl_autotuner_trials"
"""Where a search logs one MLflow run per trial."""

OnIteration = Callable[[int, dict[str, Any], "int | None", list], None]
"""`(iteration index from 0, its metrics, iterations planned, the PPO environment's history so
far)`."""


@dataclass(frozen=True)
class Callbacks:
    """Where a tuning run reports while it runs; each None = not reported.
    `on_iteration`: after each PPO training iteration (`OnIteration`); `on_trial(trial,
    query-evaluations spent so far)`: after each trial of a search run in this process (an
    `ask_tell.TrialRecord`; a search on Tune calls none); `on_warning(message)`: each problem
    `run_tuning` counts in the data's gold (`search` sends none; None there means
    `warnings.warn`)."""

    on_iteration: OnIteration | None = None
    on_trial: Callable[[Any, int], None] | None = None
    on_warning: Callable[[str], None] | None = None


@dataclass(frozen=True)
class RunOutputs:
    """What `run_tuning` writes besides its return value. `out`: the run directory (module
    docstring); `overwrite`: replace a finished run in `out` (else ConfigError naming `out`
    unless resuming); `checkpoint`: save PPO's checkpoint to `out`/checkpoint (ConfigError
    naming `checkpoint` for another method); `mlflow_dir`: the local MLflow store unless
    MLFLOW_TRACKING_URI is set (None: no MLflow run); `metrics_port` (a TCP port on 127.0.0.1)
    / `metrics_textfile` (a .prom file): Prometheus export of the run (None: none)."""

    out: str | Path = "runs/tune"
    overwrite: bool = False
    checkpoint: bool = False
    mlflow_dir: str | Path | None = "runs/mlflow"
    metrics_port: int | None = None
    metrics_textfile: str | Path | None = None


@dataclass
class Search:
    """A finished search: the tuner's `result` (a TuneResult), its per-evaluation `history`
    (faithfulness, relevancy, p95, cost, reward, config_hash per evaluation: PPO's steps, a
    search's rung results), the saved `checkpoint` path when one was asked for (PPO), and a
    search's `ask_tell.SearchResult` (`found`; None for PPO)."""

    result: Any
    history: list[dict[str, Any]] = field(default_factory=list)
    checkpoint: str | None = None
    found: Any = None


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


def check(method: str, budget: int | None, *, resume: Any = None,
          checkpoint: bool = False) -> None:
    """ConfigError unless `method` is one of METHODS, `budget` None or >= 1, and `resume` /
    `checkpoint` (PPO's) asked of ppo only: another method would ignore them."""
    if method not in METHODS:
        raise ConfigError("method", f"must be one of {', '.join(METHODS)}, got {method!r}")
    for name, given in (("resume", resume), ("checkpoint", checkpoint)):
        if given and method != "ppo":
            raise ConfigError(name, f"is PPO's (a policy checkpoint); --method {method} has "
                                    "none: add --method ppo")
    if budget is not None and budget < 1:
        raise ConfigError("budget", f"must be >= 1 query-evaluation, got {budget}")


def ppo_batch(settings: Any, n_tune: int) -> int:
    """Queries one PPO step evaluates: min(`episode.batch_size`, the tune split's size)."""
    return min(settings.episode.batch_size, n_tune)


def ppo_iterations(steps: int, settings: Any) -> int:
    """PPO iterations `steps` buy: training steps plus one greedy read-out episode."""
    return max(1, (steps - settings.episode.length) // settings.ppo.train_batch_size)


def default_budget(settings: Any, method: str, n_tune: int, space_size: int) -> int:
    """Query-evaluations when none is given: for grid, every config of the space
    (`space_size`) on the whole tune split (`n_tune` queries); for the other searches, 20 full
    tune splits; for PPO, five training iterations and the read-out episode."""
    if method == "ppo":
        steps = 5 * settings.ppo.train_batch_size + settings.episode.length
        return steps * ppo_batch(settings, n_tune)
    return n_tune * (space_size if method == "grid" else 20)


def search(ev: TunerEvaluator, settings: Any, plan: SearchPlan, *,
           callbacks: Callbacks = Callbacks(), resume: str | Path | None = None,
           checkpoint_dir: str | Path | None = None, dataset: str | None = None,
           mlflow_uri: str | None = None, tune: TuneOptions | None = None) -> Search:
    """Run `plan` (method, budget in query-evaluations, seed, first trial) on the
    TunerEvaluator `ev` with `settings` (TunerSettings). PPO only: `resume` continues from a
    checkpoint directory, `checkpoint_dir` saves one at the end, `callbacks.on_iteration` is
    called after each training iteration. The searches: `plan.start` is the first trial (not
    grid); `callbacks.on_trial(trial, query-evaluations spent)` after each trial run in this
    process; `mlflow_uri`: one MLflow run per trial in experiment `MLFLOW_TRIALS_EXPERIMENT`;
    `tune` runs the search on `tune.Tuner` with those options, and `dataset` (what `ev` was
    opened from, for data read from a path); without `tune` it runs in this process. The
    Search's `history` is one record per rung evaluation. ConfigError (`check`) naming
    `method`, `budget`, `resume` or `checkpoint`."""
    method, budget, seed = plan.method, plan.budget, plan.seed
    check(method, budget, resume=resume, checkpoint=checkpoint_dir is not None)
    if budget is None:
        raise ConfigError("budget", "a search needs one (query-evaluations); run_tuning fills "
                                    "in default_budget")
    if method == "ppo":
        return _ppo(ev, settings, budget, seed, resume, checkpoint_dir, callbacks.on_iteration)
    from rl.kernel.space import ConfigSpace, is_conversational
    from rl.tuner.ask_tell import run_search

    space = ConfigSpace(ev.policy, conversational=is_conversational(ev.data.dataset.examples))
    if tune is not None:
        from rl.tuner.tune_search import tune_search

        found = tune_search(ev, space, plan, dataset=dataset, options=tune)
    else:
        found = run_search(ev, space, plan, on_trial=callbacks.on_trial)
    for t in found.trials:  # reports resolve configs evaluated in trial processes
        ev.seen.setdefault(t.config.config_hash, t.config)
    if mlflow_uri:
        from rl.common.tracking import log_trials

        log_trials(mlflow_uri, MLFLOW_TRIALS_EXPERIMENT,
                   [{"trial_id": t.trial_id, "config_hash": t.config.config_hash,
                     "params": t.config.model_dump(mode="json")} for t in found.trials],
                   found.history, {"method": method, "seed": str(seed),
                                   "dataset": str(dataset or ev.data.name)})
    return Search(found.to_tune_result(), found.history, found=found)


def _ppo(ev: TunerEvaluator, settings: Any, budget: int, seed: int, resume: str | Path | None,
         checkpoint_dir: str | Path | None, on_iteration: OnIteration | None) -> Search:
    """PPO under `budget` query-evaluations (module docstring)."""
    from rl.tuner.ppo import PPOTuner

    batch = ppo_batch(settings, len(ev.data.examples(ev.slice.tune_split)))
    steps = budget // batch
    if steps < settings.episode.length + settings.ppo.train_batch_size:
        raise ConfigError("budget", f"{budget} query-evaluations buy {steps} PPO steps: one "
                                    f"iteration and the read-out need "
                                    f"{settings.episode.length + settings.ppo.train_batch_size}")
    tuner = PPOTuner(ev, settings, seed=seed)
    try:
        if resume:
            if not Path(resume).exists():
                raise ConfigError("resume", f"checkpoint {resume} does not exist")
            tuner.restore(resume)
        iters = ppo_iterations(steps, settings)

        def log(it: int, metrics: dict[str, Any]) -> None:
            if on_iteration is not None:
                on_iteration(it, metrics, iters, tuner.history)

        res = tuner.train(iters, log=log)
        res.extra["query_evals"] = res.evaluations * batch
        saved = tuner.save(Path(checkpoint_dir)) if checkpoint_dir else None
        return Search(res, list(tuner.history), saved)
    finally:
        tuner.stop()


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


def run_tuning(dataset: str, settings: Any, plan: SearchPlan = SearchPlan(),
               outputs: RunOutputs = RunOutputs(), *, callbacks: Callbacks = Callbacks(),
               resume: str | Path | None = None, tune: TuneOptions | None = None,
               allow_missing_gold: bool = False) -> TuningRun:
    """Tune a RAG config on `dataset` with `settings` (TunerSettings) as `plan` says and write
    `outputs` (the run directory `outputs.out`, MLflow, Prometheus; see the module docstring).
    `plan.budget`: query-evaluations (None: `default_budget`); `plan.start`: the first trial of
    a WARM_STARTS search (`settings.base_config()`, the static default, means the run cannot
    recommend a config that scored below the default on the tuning split). `resume`: PPO's
    checkpoint to continue from. A search run on Ray Tune (`tune`: `search`) keeps Tune's
    experiment under `out`/ray_tune (whatever `tune.storage_path` says); every search logs
    each trial to MLflow experiment `MLFLOW_TRIALS_EXPERIMENT` unless `outputs.mlflow_dir` is
    None. `callbacks`: progress (`search`) and the gold warnings. Before any search, the gold
    of the tune and holdout splits is checked against the corpus (`TuningData.check_gold`): a
    split with more than half of its questions unreachable is a DataError unless
    `allow_missing_gold`; each counted problem goes to `callbacks.on_warning` (default:
    `warnings.warn`) and into summary.json's `gold`. An `out` holding a finished run
    (summary.json) is a ConfigError unless `outputs.overwrite` (its run files are removed
    first, so nothing of the old run stays beside the new one) or `resume`. ConfigError also
    names `method`, `budget` or `checkpoint` (`check`)."""
    import yaml

    from rag import progress
    from rag.evaluate import evaluate as rag_evaluate
    from rag.pipeline import Pipeline
    from rl.common.data import TuningData, run_directory
    from rl.kernel.evaluator import QUERY_EVALUATIONS, TunerEvaluator
    from rl.tuner.prometheus import for_tune_run
    from rl.tuner.report import plot_run_curve

    method, budget, seed = plan.method, plan.budget, plan.seed
    out, checkpoint, mlflow_dir = outputs.out, outputs.checkpoint, outputs.mlflow_dir
    check(method, budget, resume=resume, checkpoint=checkpoint)
    _claim_run_directory(Path(out), outputs.overwrite, resumed=resume is not None)
    if Path(dataset).exists():  # a path: `ragpilot report` reopens it from any directory
        dataset = str(Path(dataset).resolve())
    with run_directory(out) as out, progress.stage(f"tune: open {dataset} (load, split, "
                                                    "check gold)"):
        ev = TunerEvaluator(TuningData.open(dataset, run_dir=out), settings)
        gold = ev.data.check_gold((ev.slice.tune_split, ev.slice.holdout_split),
                                  allow_missing_gold)
    warn = callbacks.on_warning or (lambda m: warnings.warn(m, UserWarning, stacklevel=3))
    for split in gold:
        for w in ev.data.gold_warnings(split):
            warn(w)
    if budget is None:
        from rl.kernel.space import ConfigSpace, is_conversational

        size = ConfigSpace(settings, is_conversational(ev.data.dataset.examples)).size()
        budget = default_budget(settings, method, len(ev.data.examples(ev.slice.tune_split)),
                                size)
    mlflow_uri = None
    if mlflow_dir is not None:
        from rl.common.tracking import tracking_uri

        mlflow_uri = tracking_uri(Path(mlflow_dir))
    prom = for_tune_run(settings, ev.thresholds, outputs.metrics_port, outputs.metrics_textfile)
    # counted per query-evaluation as the evaluator computes them (mid-trial), and set to the
    # search's own count after each trial or PPO iteration
    counted = progress.stage(f"tune: search {method}", budget, QUERY_EVALUATIONS)
    n_tune = len(ev.data.examples(ev.slice.tune_split))

    def on_iter(it: int, metrics: dict[str, Any], of: int | None, history: list) -> None:
        counted.update(len(history) * ppo_batch(settings, n_tune))
        if callbacks.on_iteration is not None:
            callbacks.on_iteration(it, metrics, of, history)
        if prom is not None:
            prom.consume(history)
            prom.flush()

    def on_trial_done(trial: Any, spent: int) -> None:
        counted.update(spent)
        if callbacks.on_trial is not None:
            callbacks.on_trial(trial, spent)

    with counted:
        found = search(ev, settings, replace(plan, budget=budget),
                       callbacks=Callbacks(on_iteration=on_iter, on_trial=on_trial_done),
                       resume=resume,
                       checkpoint_dir=out / "checkpoint" if checkpoint else None,
                       dataset=dataset, mlflow_uri=mlflow_uri,
                       tune=None if tune is None else replace(
                           tune, storage_path=(out / "ray_tune").resolve()))
        counted.update(found.result.extra.get("query_evals", counted.done))
    res = found.result
    steps = found.history
    if prom is not None:
        prom.consume(steps, resolve=ev.seen.get)
        prom.flush()
    # the operating point: the objective's pick from the front of full-fidelity evaluations
    from rl.tuner.pareto import build as build_pareto
    from rl.tuner.pareto import objective_summary

    with progress.stage("tune: Pareto front of the full-fidelity configs, operating point"):
        pareto = build_pareto(ev, settings, search_best=res.best_config, seed=seed)
        pareto.write(out, f"{dataset} / {method}: {settings.objective.kind}")
        best = pareto.chosen
    with progress.stage(f"tune: score {best.config_hash} on {ev.slice.tune_split} and "
                        f"{ev.slice.holdout_split}"):
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
               "warm_start": plan.start is not None and method in WARM_STARTS,
               "split": {"source": data.split_source,
                         "path": None if data.split_path is None else str(data.split_path),
                         "tune": ev.slice.tune_split, "holdout": ev.slice.holdout_split,
                         "sizes": {s: len(x) for s, x in data.splits.items()}},
               "metrics": {"faithfulness": ev.slice.faithfulness,
                           "relevancy": ev.slice.relevancy},
               # gold the corpus cannot reach, per split (rl.common.data.TuningData.gold_report)
               "gold": gold,
               "evaluations": res.evaluations, "budget": budget,
               "query_evals": res.extra["query_evals"],
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
        with progress.stage(f"tune: log the run to MLflow ({uri})"):
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
