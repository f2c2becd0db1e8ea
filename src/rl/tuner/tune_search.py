"""Config search on Ray Tune: `tune.Tuner` over the tuner's config space, multi-fidelity.

    res = tune_search(ev, space, method="local-asha", budget=2000, seed=0)
    res.best_config, res.best_reward   # the incumbent at full fidelity
    res.curve                          # best full-fidelity reward vs cumulative query-evals

Methods (`METHODS`; `DEFAULT_SEARCHER` is the project's default):
    tpe            Optuna TPE (seeded), with the gates as constraints (`ConstrainedOptunaSearch`)
    tpe-asha       tpe + ASHA over the fidelity rungs (one bracket)
    local-asha     local search from the start point (`searchers.LocalSearch`: one-head moves of
                   the best config, a pattern move after an improvement) + the same ASHA; the
                   default: in `bench/results/search.md` it reached 99% of the best-known reward
                   on more seeds, with fewer query-evaluations, than tpe-asha and TPE
    tpe-hyperband  tpe + asynchronous HyperBand: one ASHA bracket per rung, each trial drawn
                   into one (bracket s starts stopping at rung s+1). Ray's synchronous
                   HyperBandScheduler cuts a bracket only among trials running together (and
                   pauses them, which needs checkpoints): at max_concurrent=1 it stopped
                   nothing (measured: 10 of 10 trials ran the full split). BOHB needs
                   ConfigSpace and hpbandster, which the project does not install.
    hyperopt       HyperOpt TPE (`HyperOptSearch`, seeded)
    random         `BasicVariantGenerator`, seeded sampling of `space.tune_param_space()`
    grid           `BasicVariantGenerator` over every config of `space.grid()` (a pinned small
                   space only: more than `GRID_LIMIT` configs is a ConfigError)

A trial evaluates one config (`space.from_params(params)`) on growing rungs of the split
(`rl.tuner.fidelity`: nested prefixes of one seeded permutation; the last rung is the whole
split) and reports after each rung: reward, quality (αF + βR, `RewardSpec.quality`), faithfulness,
relevancy, cost (tokens per query), p95_latency_ms, gate verdicts (`gate_<name>`,
`gates_passed`), gate violations (`violation_<name>`: relative to the threshold, (T − F)/T and
(T − R)/T, (p95 − T)/T for latency; > 0 = violated; NaN -> 1: `relative_violations`), `query_evals` (distinct queries this trial was scored on
so far = the rung size, since rungs are nested and rows are cached per (config, query)),
`rung`, `full_fidelity` and `config_hash`; a trial run by `tune_search` adds `node_id` (the Ray
node that ran it).

Budget: query-evaluations summed over all trials. `QueryBudget` stops the experiment once the
spent sum reaches `budget` (so it can overshoot by less than one rung step of one trial); the
wall seconds are reported beside it. With `max_concurrent=1` and a fixed seed the sequence of
configs is deterministic given deterministic evaluations. With `max_concurrent` > 1 results
arrive in timing order, so only what does not depend on it is fixed by the seed: for `grid`
(with a budget that covers every config) the set of configs evaluated, their rewards and the
best config (ties go to the earliest-created trial, not the first to report).

Placement: each trial asks for `resources_per_trial` (default 1 CPU, Tune's own default; a
custom resource only one node offers pins trials there), so on a cluster with 1 CPU per node
`max_concurrent=2` runs one trial on each node (with `reuse_actors=False` whatever the trials'
length: `tune_search` says why); every result carries the `node_id` it ran on.

Trials share the indexes and the row cache: each trial process opens the evaluator once, from a
JSON-safe `EvaluatorSpec` (dataset, policy, cache root, run directory), keyed per process
(`open_evaluator`; Tune reuses actors), and the evaluator's tables live in its on-disk SQLite
cache, which every process and later run reads. The same code runs on a cluster
(`rl.common.runtime.init_ray` joins RAY_ADDRESS) provided the cache root is shared storage.
"""

from __future__ import annotations

import itertools
import json
import os
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
from ray.tune import Callback, Stopper

from rag.config import RAGConfig
from rag.errors import ConfigError
from rl.kernel.reward import HARD_GATES
from rl.tuner.fidelity import rung_indices, rungs_for
from rl.tuner.results import Incumbent, TuneResult
from rl.tuner.searchers import SEARCH_METRIC, search_score

METHODS = ("tpe", "tpe-asha", "local-asha", "tpe-hyperband", "hyperopt", "random", "grid")
DEFAULT_SEARCHER = "local-asha"
"""The project's searcher: local search proposes one-head moves of the best config
(`searchers.LocalSearch`), ASHA spends full-split evaluations only on configs that rank in the
top third of their rung."""
GRID_LIMIT = 5000
GRID_KEY = "grid_config"
"""A grid trial's only parameter: the RAGConfig mapping of one `space.grid()` config."""
MLFLOW_EXPERIMENT = "rl_autotuner_trials"
DEFAULT_RUNGS: tuple[int | None, ...] = (25, 75, None)


# ---- the evaluator a trial process opens ------------------------------------------------------
@dataclass(frozen=True)
class EvaluatorSpec:
    """What a trial process needs to open the same evaluator as the driver (JSON-safe):
    `dataset` (a name or absolute path `TuningData.open` reads), `policy` (TunerSettings as
    JSON), `cache_root` (the evaluator's table and memo cache) and `run_dir` (where the split
    of data without a committed manifest lives, or None)."""

    dataset: str
    policy: str
    cache_root: str
    run_dir: str | None = None

    @classmethod
    def of(cls, ev: Any, dataset: str | None = None) -> EvaluatorSpec:
        """The spec of the open TunerEvaluator `ev`. `dataset`: what `ev.data` was opened from
        (required for data loaded from a path; a built-in dataset defaults to its name)."""
        from rl.common.data import OWN_SPLIT_FILE

        data = ev.data
        if dataset is None:
            if not data.dataset.builtin:
                raise ConfigError("dataset", f"{data.name} was loaded from a path: pass the "
                                             "path it was opened from")
            dataset = data.name
        if Path(dataset).exists():  # trial processes run in other working directories
            dataset = str(Path(dataset).resolve())
        sp = data.split_path
        run_dir = str(sp.parent.resolve()) if sp is not None and sp.name == OWN_SPLIT_FILE \
            else None
        policy = json.dumps(ev.policy.model_dump(mode="json", by_alias=True), sort_keys=True)
        return cls(dataset, policy, str(Path(ev.root).resolve()), run_dir)


_OPEN: dict[EvaluatorSpec, tuple[Any, Any]] = {}
_OPEN_LOCK = threading.Lock()


def open_evaluator(spec: EvaluatorSpec) -> tuple[Any, Any]:
    """(TunerEvaluator, ConfigSpace) of `spec`, opened once per process."""
    with _OPEN_LOCK:
        if spec not in _OPEN:
            from rl.common.data import TuningData
            from rl.kernel.evaluator import TunerEvaluator
            from rl.kernel.settings import TunerSettings
            from rl.kernel.space import ConfigSpace

            policy = TunerSettings.from_dict(json.loads(spec.policy))
            ev = TunerEvaluator(TuningData.open(spec.dataset, run_dir=spec.run_dir), policy,
                                cache_root=spec.cache_root)
            _OPEN[spec] = (ev, ConfigSpace(policy))
        return _OPEN[spec]


# ---- one trial --------------------------------------------------------------------------------
def trial_metrics(rep: Any, spec: Any, rung: int, full: bool) -> dict[str, Any]:
    """What a trial reports for the EvalReport `rep` of one rung (module docstring), with the
    RewardSpec `spec` it was scored with."""
    violation = getattr(rep, "violations", None) or relative_violations(rep, spec.thresholds)
    out = {"reward": float(rep.reward),
           SEARCH_METRIC: search_score(rep.reward, rep.gates.get("stable", True),
                                       spec.weights.lambda_),
           "quality": float(spec.quality(rep.faithfulness, rep.relevancy)),
           "faithfulness": float(rep.faithfulness), "relevancy": float(rep.relevancy),
           "cost": float(rep.cost), "p95_latency_ms": float(rep.p95_latency_ms),
           "quality_se": float(rep.quality_se), "gates_passed": bool(rep.gates["passed"]),
           "query_evals": int(rep.n), "rung": rung, "full_fidelity": full,
           "config_hash": rep.config_hash}
    for name in HARD_GATES:
        v = float(violation[name])
        out[f"gate_{name}"] = bool(rep.gates[name])
        out[f"violation_{name}"] = v if np.isfinite(v) else 1.0  # unmeasured fails the gate
    return out


def relative_violations(rep: Any, t: Any) -> dict[str, float]:
    """Each hard gate's violation relative to its threshold (<= 0 passes; 0.1 = 10% short of a
    floor or over a ceiling; NaN -> 1): what `EvalReport.violations` holds where the evaluator
    computes it (`rl.kernel.reward.Gate.violation`)."""
    out = {}
    for name, floor in (("faithfulness", True), ("relevancy", True), ("p95_latency_ms", False)):
        th, v = float(getattr(t, name)), float(getattr(rep, name))
        gap = th - v if floor else v - th
        out[name] = 1.0 if np.isnan(v) else gap / max(abs(th), 1e-9)
    return out


def run_trial(params: dict[str, Any], spec: EvaluatorSpec, split: str,
              rungs: tuple[int, ...]) -> None:
    """The function trainable: score the config of `params` on each rung of `split` (the last
    rung is the whole split, `rungs[-1]` queries) and `tune.report` after each."""
    from ray import tune

    ev, space = open_evaluator(spec)
    cfg = RAGConfig.from_dict(params[GRID_KEY], where="grid") if GRID_KEY in params \
        else space.from_params(params)
    rs, n_total = ev.reward_spec(), rungs[-1]
    node = _node_id()
    for i, n in enumerate(rungs, 1):
        idx = None if n == n_total else rung_indices(n_total, n)
        m = trial_metrics(ev.evaluate(cfg, split, idx), rs, i, n == n_total)
        tune.report({**m, "node_id": node})


def _node_id() -> str | None:
    """The Ray node this process runs on (hex id), None outside Ray: Tune's own `node_ip`
    cannot tell apart two nodes on one host."""
    import ray

    return ray.get_runtime_context().get_node_id() if ray.is_initialized() else None


# ---- what finished ----------------------------------------------------------------------------
@dataclass
class TuneSearchResult:
    """A finished `tune_search`.

    `grid`: Tune's ResultGrid; `trials`: one dict per trial in start order (trial_id,
    config_hash, config (RAGConfig), params, rung_rewards, query_evals, full_fidelity,
    seconds, node_id: the Ray node it ran on); `history`: every reported rung result in
    arrival order (the reported metrics + trial_id, cum_query_evals, seconds since the
    start); `best_config`/`best_reward`/`incumbent`: the best full-fidelity config
    (`rl.tuner.results.Incumbent`; ties to the earliest-created trial), None when no trial
    reached the full split; `query_evals`/`seconds`: the total spent (seconds from the first
    trial's start to the last result); `curve`: one point per reported result, {"query_evals": cumulative, "seconds", "best_reward": best
    full-fidelity reward so far (None before the first), "incumbent": its hash};
    `searcher`: the Tune searcher it ran (its Optuna study, for TPE methods); `wall_s`: the
    whole `Tuner.fit` (`seconds` plus Tune's set-up and tear-down, ~3 s here)."""

    method: str
    seed: int
    budget: int
    rungs: tuple[int, ...]
    grid: Any
    trials: list[dict[str, Any]]
    history: list[dict[str, Any]]
    best_config: RAGConfig | None
    best_reward: float | None
    incumbent: str | None
    query_evals: int
    seconds: float
    curve: list[dict[str, Any]] = field(default_factory=list)
    searcher: Any = None
    wall_s: float = 0.0

    def to_tune_result(self) -> TuneResult:
        """As the other tuners' `TuneResult` (one curve entry per rung evaluation;
        `extra["query_evals"]` the budget spent). ValueError without an incumbent."""
        if self.best_config is None:
            raise ValueError("no trial reached full fidelity: no incumbent")
        curve = [{"eval": i, "reward": h["reward"], "config_hash": h["config_hash"],
                  "query_evals": h["cum_query_evals"], "best_so_far": c["best_reward"]}
                 for i, (h, c) in enumerate(zip(self.history, self.curve, strict=True), 1)]
        return TuneResult(self.method, self.best_config, len(self.history), curve,
                          self.seconds, {"query_evals": self.query_evals, "rungs": self.rungs,
                                         "trials": len(self.trials), "budget": self.budget})


def _summarise(method: str, seed: int, budget: int, rungs: tuple[int, ...], grid: Any,
               results: list[tuple[str, dict[str, Any], dict[str, Any], float]],
               config_of: Any, created: dict[str, int] | None = None) -> TuneSearchResult:
    """Trials, history, curve and incumbent from the results in arrival order
    ((trial_id, params, metrics, seconds since the start) each). `created`: each trial's
    creation index: the final incumbent breaks reward ties by it, not by arrival, so
    concurrent trials reporting in another order name the same best config."""
    trials: dict[str, dict[str, Any]] = {}
    inc, configs = Incumbent(), {}
    history, curve, spent = [], [], 0
    # a config's full-fidelity reward is one number (the same rows of the same split): a trial
    # that repeats the config adds no evidence, and averaging the repeats would move the
    # incumbent's reward by float rounding (np.mean of three equal floats can differ in the
    # last bit), making the best-so-far curve non-monotone
    full_seen: set[str] = set()
    for tid, params, m, t in results:
        tr = trials.get(tid)
        if tr is None:
            tr = trials[tid] = {"trial_id": tid, "config_hash": m["config_hash"],
                                "config": config_of(params), "params": params,
                                "rung_rewards": [], "query_evals": 0,
                                "full_fidelity": False, "seconds": 0.0,
                                "node_id": m.get("node_id")}
        spent += m["query_evals"] - tr["query_evals"]
        tr.update(query_evals=m["query_evals"], full_fidelity=bool(m["full_fidelity"]),
                  seconds=float(m.get("time_total_s", 0.0)))
        tr["rung_rewards"].append(m["reward"])
        if m["full_fidelity"] and np.isfinite(m["reward"]) and m["config_hash"] not in full_seen:
            full_seen.add(m["config_hash"])
            inc.add(m["config_hash"], m["reward"])
            configs[m["config_hash"]] = tr["config"]
        best = inc.best() if len(inc) else (None, None)
        history.append({**{k: v for k, v in m.items() if not isinstance(v, dict)},
                        "trial_id": tid, "cum_query_evals": spent, "seconds": t})
        curve.append({"query_evals": spent, "seconds": t, "best_reward": best[1],
                      "incumbent": best[0]})
    final, full_seen = Incumbent(), set()
    rank = created or {}
    for _tid, _, m, _ in sorted(results, key=lambda x: rank.get(x[0], len(rank))):  # stable
        if m["full_fidelity"] and np.isfinite(m["reward"]) and m["config_hash"] not in full_seen:
            full_seen.add(m["config_hash"])
            final.add(m["config_hash"], m["reward"])
    h, r = final.best() if len(final) else (None, None)
    return TuneSearchResult(method, seed, budget, rungs, grid, list(trials.values()), history,
                            configs.get(h), r, h, spent, results[-1][3] if results else 0.0,
                            curve)


# ---- the search -------------------------------------------------------------------------------
def tune_search(evaluator: Any, space: Any, *, method: str = DEFAULT_SEARCHER, budget: int,
                seed: int = 0, split: str | None = None,
                rungs: tuple[int | None, ...] = DEFAULT_RUNGS,
                storage_path: str | Path | None = None, max_concurrent: int = 1,
                start: RAGConfig | None = None, dataset: str | None = None,
                mlflow_uri: str | None = None,
                resources_per_trial: dict[str, float] | None = None,
                reuse_actors: bool = True,
                ray_address: str | None = None) -> TuneSearchResult:
    """Search `space` (a ConfigSpace) with `method` on the TunerEvaluator `evaluator` until
    `budget` query-evaluations are spent (module docstring). `split`: default the evaluator's
    tune split; `rungs`: the fidelity schedule (`fidelity.rungs_for`); `storage_path`: Tune's
    experiment folder (default a fresh temporary folder, never ~/ray_results);
    `max_concurrent`: trials at once (1 = deterministic); `start`: a config to try first (e.g.
    the one in production; not for grid); `dataset`: what the evaluator's data was opened from
    (`EvaluatorSpec.of`); `mlflow_uri`: log every trial to MLflow experiment
    `MLFLOW_EXPERIMENT` there, after the search (`rl.common.tracking.log_trials`);
    `resources_per_trial`: what each trial holds while it runs (`tune.with_resources`: "cpu",
    "gpu", "memory" in bytes, or any custom resource; default {"cpu": 1}); `reuse_actors`:
    run the next trial in a finished trial's process (it keeps the evaluator open). Tune gives
    a pending trial the first such process, even one whose own new process is starting on
    another node: trials shorter than a process start (stored tables) then all run on the
    first node up. False starts one process per trial, so `max_concurrent` trials hold their
    resources at once and spread over the nodes. `ray_address`: the cluster to join
    (`rl.common.runtime.init_ray`; default $RAY_ADDRESS, else a local runtime).
    ConfigError names `method`, `budget`, `max_concurrent` or `resources_per_trial`."""
    from ray import tune

    from rl.common.runtime import init_ray
    from rl.tuner.searchers import make_scheduler, make_searcher

    if method not in METHODS:
        raise ConfigError("method", f"must be one of {', '.join(METHODS)}")
    if max_concurrent < 1:
        raise ConfigError("max_concurrent", "must be >= 1")
    resources = dict(resources_per_trial or {"cpu": 1})
    if any(not isinstance(v, (int, float)) or v < 0 for v in resources.values()):
        raise ConfigError("resources_per_trial", f"amounts must be numbers >= 0: {resources}")
    split = split or evaluator.slice.tune_split
    sizes = tuple(rungs_for(len(evaluator.data.examples(split)), rungs))
    if budget < sizes[-1]:
        raise ConfigError("budget", f"must cover one full-fidelity evaluation ({sizes[-1]} "
                                    f"queries of {split}), got {budget}")
    spec = EvaluatorSpec.of(evaluator, dataset)
    with _OPEN_LOCK:  # a trial in this process (none under Ray today) reuses the driver's
        _OPEN.setdefault(spec, (evaluator, space))
    if method == "grid":
        points = [c.model_dump(mode="json") for c in itertools.islice(space.grid(),
                                                                      GRID_LIMIT + 1)]
        if len(points) > GRID_LIMIT:
            raise ConfigError("method", f"grid: the space has more than {GRID_LIMIT} configs")
        param_space, num_samples = {GRID_KEY: tune.grid_search(points)}, 1

        def config_of(p: dict[str, Any]) -> RAGConfig:
            return RAGConfig.from_dict(p[GRID_KEY], where="grid")
    else:
        param_space, num_samples = space.tune_param_space(), budget // sizes[0] + 1
        config_of = space.from_params
    init_ray(address=ray_address)
    # Tune's console tables: a library call prints nothing (verbose=0 alone keeps a header)
    os.environ.setdefault("RAY_AIR_NEW_OUTPUT", "0")
    storage = Path(storage_path) if storage_path else Path(
        tempfile.mkdtemp(prefix="ragpilot-tune-"))
    storage.mkdir(parents=True, exist_ok=True)
    stopper, recorder = QueryBudget(budget), _Recorder()
    searcher = make_searcher(method, seed, space, start, max_concurrent)
    trainable = tune.with_resources(
        tune.with_parameters(run_trial, spec=spec, split=split, rungs=sizes), resources)
    tuner = tune.Tuner(
        trainable, param_space=param_space,
        tune_config=tune.TuneConfig(
            metric=SEARCH_METRIC, mode="max", num_samples=num_samples,
            search_alg=searcher,
            scheduler=make_scheduler(method, sizes, seed), reuse_actors=reuse_actors),
        run_config=tune.RunConfig(name=f"{method}-seed{seed}", storage_path=str(storage),
                                  stop=stopper, callbacks=[recorder], verbose=0,
                                  failure_config=tune.FailureConfig(max_failures=0)))
    t0 = time.perf_counter()
    grid = tuner.fit()
    wall = time.perf_counter() - t0
    if grid.errors:
        raise RuntimeError(f"{method}: a trial failed: {grid.errors[0]!r}")
    found = _summarise(method, seed, budget, sizes, grid, recorder.results, config_of,
                       recorder.created)
    found.searcher, found.wall_s = searcher, wall
    if mlflow_uri:
        from rl.common.tracking import log_trials

        log_trials(mlflow_uri, MLFLOW_EXPERIMENT, found.trials, found.history,
                   {"method": method, "seed": str(seed), "dataset": spec.dataset})
    return found


class QueryBudget(Stopper):
    """Tune stopper: stops the experiment once the query-evals reported by all trials (each
    trial's latest cumulative `query_evals`) sum to at least `budget`."""

    def __init__(self, budget: int):
        self.budget = budget
        self.by_trial: dict[str, int] = {}

    @property
    def spent(self) -> int:
        return sum(self.by_trial.values())

    def __call__(self, trial_id: str, result: dict[str, Any]) -> bool:
        self.by_trial[trial_id] = int(result.get("query_evals", 0))
        return False

    def stop_all(self) -> bool:
        return self.spent >= self.budget


class _Recorder(Callback):
    """Tune callback (driver side): every trial result in arrival order, with its params and
    the seconds since the first trial started."""

    def __init__(self) -> None:
        self.results: list[tuple[str, dict[str, Any], dict[str, Any], float]] = []
        self.created: dict[str, int] = {}
        self.t0: float | None = None

    def on_trial_start(self, iteration: int, trials: list, trial: Any, **info: Any) -> None:
        if self.t0 is None:
            self.t0 = time.perf_counter()
        self.created.setdefault(trial.trial_id, _creation_index(trial, len(self.created)))

    def on_trial_result(self, iteration: int, trials: list, trial: Any, result: dict,
                        **info: Any) -> None:
        t = time.perf_counter() - (self.t0 or time.perf_counter())
        self.results.append((trial.trial_id, dict(trial.config), dict(result), t))


def _creation_index(trial: Any, default: int) -> int:
    """The order Tune created `trial` in: its experiment tag starts with the searcher's
    counter ("3_k=5,..."); `default` when it does not."""
    head = str(getattr(trial, "experiment_tag", "")).split("_", 1)[0]
    return int(head) if head.isdigit() else default
