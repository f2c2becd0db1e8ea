"""The search protocol (`rl.tuner.ask_tell`) executed on Ray Tune: `tune.Tuner` runs each trial
as a Ray actor, with the same searcher and scheduler objects and the same rung scoring as the
in-process executor.

    res = tune_search(ev, space, SearchPlan("local-asha", budget=2000, seed=0),
                      options=TuneOptions(max_concurrent=2))
    res.best_config, res.best_reward   # the incumbent at full fidelity (an ask_tell.SearchResult)

When to use it rather than `ask_tell.run_search`: for Ray Tune's trial scheduling, i.e. several
trials at once (`max_concurrent` > 1), a cluster (`ray_address`), or per-trial resources.
`rl.tuner.run.search` picks it when it is given `TuneOptions`. With `max_concurrent=1` and a
fixed seed it gives the same trials and best config as `run_search` (a test says so). With
`max_concurrent` > 1 results arrive in timing order, so only what does not depend on it is
fixed by the seed: for grid (with a budget that covers every config) the set of configs
evaluated, their rewards and the best config (ties go to the earliest-created trial, not the
first to report).

Budget: as in-process, no trial starts once the trials' query-evaluations reach `budget`
(`searchers.BudgetLimiter` ends the search); the trials running then finish their rungs.

Placement: each trial asks for `resources_per_trial` (default 1 CPU, Tune's own default; a
custom resource only one node offers pins trials there), so on a cluster with 1 CPU per node
`max_concurrent=2` runs one trial on each node (with `reuse_actors=False` whatever the trials'
length: `tune_search` says why); every trial records the `node_id` it ran on.

Trials share the indexes and the row cache: each trial process opens the evaluator once, from a
JSON-safe `EvaluatorSpec` (dataset, settings, cache root, run directory), keyed per process
(`open_evaluator`; Tune reuses actors), and the evaluator's tables live in its on-disk SQLite
cache, which every process and later run reads. The same code runs on a cluster
(`rl.common.runtime.init_ray` joins RAY_ADDRESS) provided the cache root is shared storage.
"""

from __future__ import annotations

import json
import os
import tempfile
import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ray.tune import Callback

from rag import progress
from rag.errors import ConfigError
from rl.tuner.ask_tell import (
    DEFAULT_RUNGS,
    SearchResult,
    TrialRecord,
    check_search,
    config_of,
    evaluate_rung,
    rung_sizes,
    summarise,
)
from rl.tuner.plan import SearchPlan
from rl.tuner.searchers import SEARCH_METRIC, make_scheduler, make_searcher

if TYPE_CHECKING:
    from rl.kernel.evaluator import TunerEvaluator


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
    def of(cls, ev: TunerEvaluator, dataset: str | None = None) -> EvaluatorSpec:
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
    """(TunerEvaluator, ConfigSpace) of `spec`, opened once per process (the space has the
    query formulation head when the data is conversational)."""
    with _OPEN_LOCK:
        if spec not in _OPEN:
            from rl.common.data import TuningData
            from rl.kernel.evaluator import TunerEvaluator
            from rl.kernel.settings import TunerSettings
            from rl.kernel.space import ConfigSpace, is_conversational

            policy = TunerSettings.from_dict(json.loads(spec.policy))
            ev = TunerEvaluator(TuningData.open(spec.dataset, run_dir=spec.run_dir), policy,
                                cache_root=spec.cache_root)
            space = ConfigSpace(policy, conversational=is_conversational(
                ev.data.dataset.examples))  # as `rl.tuner.run.search` builds it
            _OPEN[spec] = (ev, space)
        return _OPEN[spec]


# ---- one trial --------------------------------------------------------------------------------
def run_trial(params: dict[str, Any], spec: EvaluatorSpec, split: str,
              sizes: tuple[int, ...]) -> None:
    """The function trainable: score the config of `params` on each rung of `split`
    (`ask_tell.evaluate_rung`) and `tune.report` each rung result with the node it ran on
    (`training_iteration` is Tune's own count, the same rung level)."""
    from ray import tune

    ev, space = open_evaluator(spec)
    cfg, node = config_of(space, params), _node_id()
    for level in range(1, len(sizes) + 1):
        m = evaluate_rung(ev, cfg, split, sizes, level)
        m.pop("training_iteration")
        tune.report({**m, "node_id": node})


def _node_id() -> str | None:
    """The Ray node this process runs on (hex id), None outside Ray: Tune's own `node_ip`
    cannot tell apart two nodes on one host."""
    import ray

    return ray.get_runtime_context().get_node_id() if ray.is_initialized() else None


# ---- the search -------------------------------------------------------------------------------
@dataclass(frozen=True)
class TuneOptions:
    """How `tune.Tuner` schedules a search's trials (`tune_search`; `rl.tuner.run.search` runs a
    search on Tune exactly when it is given these).

    `max_concurrent`: trials at once (>= 1; 1 = deterministic); `resources_per_trial`: what each
    trial holds while it runs (`tune.with_resources`: "cpu", "gpu", "memory" in bytes, or any
    custom resource, each a number >= 0; None = {"cpu": 1}); `reuse_actors`: run the next trial
    in a finished trial's process (it keeps the evaluator open). Tune gives a pending trial the
    first such process, even one whose own new process is starting on another node: trials
    shorter than a process start (stored tables) then all run on the first node up. False
    starts one process per trial, so `max_concurrent` trials hold their resources at once and
    spread over the nodes. `ray_address`: the cluster to join (`rl.common.runtime.init_ray`;
    None = $RAY_ADDRESS, else a local runtime); `storage_path`: Tune's experiment folder (None =
    a fresh temporary folder, never ~/ray_results). Checked by `tune_search`: ConfigError naming
    `max_concurrent` or `resources_per_trial`."""

    max_concurrent: int = 1
    resources_per_trial: Mapping[str, float] | None = None
    reuse_actors: bool = True
    ray_address: str | None = None
    storage_path: str | Path | None = None


def tune_search(evaluator: Any, space: Any, plan: SearchPlan, *, split: str | None = None,
                rungs: Sequence[int | None] = DEFAULT_RUNGS, dataset: str | None = None,
                options: TuneOptions = TuneOptions()) -> SearchResult:
    """Search `space` (a ConfigSpace) as `plan` says (method of `searchers.SEARCHERS`, budget in
    query-evaluations, seed, first trial) on the TunerEvaluator `evaluator`, on `tune.Tuner`
    scheduled by `options` (module docstring). `split`, `rungs`: as `ask_tell.run_search`;
    `dataset`: what the evaluator's data was opened from (`EvaluatorSpec.of`). ConfigError
    names `method`, `budget`, `max_concurrent` or `resources_per_trial`; RuntimeError when a
    trial fails."""
    from ray import tune

    from rl.common.runtime import init_ray

    method, budget, seed = plan.method, plan.budget, plan.seed
    check_search(method, budget, options.max_concurrent)
    resources = dict(options.resources_per_trial or {"cpu": 1})
    if any(not isinstance(v, (int, float)) or v < 0 for v in resources.values()):
        raise ConfigError("resources_per_trial", f"amounts must be numbers >= 0: {resources}")
    split = split or evaluator.slice.tune_split
    sizes = rung_sizes(evaluator, method, split, rungs)
    spec = EvaluatorSpec.of(evaluator, dataset)
    with _OPEN_LOCK:  # a trial in this process (none under Ray today) reuses the driver's
        _OPEN.setdefault(spec, (evaluator, space))
    searcher = make_searcher(method, seed, space, plan.start, budget, options.max_concurrent)
    init_ray(address=options.ray_address)
    # Tune's console tables: a library call prints nothing (verbose=0 alone keeps a header)
    os.environ.setdefault("RAY_AIR_NEW_OUTPUT", "0")
    storage = Path(options.storage_path) if options.storage_path else Path(
        tempfile.mkdtemp(prefix="ragpilot-tune-"))
    storage.mkdir(parents=True, exist_ok=True)
    recorder = _Recorder()
    trainable = tune.with_resources(
        tune.with_parameters(run_trial, spec=spec, split=split, sizes=sizes), resources)
    tuner = tune.Tuner(  # the searcher holds the param space; every trial spends >= sizes[0]
        trainable, tune_config=tune.TuneConfig(
            metric=SEARCH_METRIC, mode="max", num_samples=budget // sizes[0] + 1,
            search_alg=searcher, scheduler=make_scheduler(method, sizes, seed),
            reuse_actors=options.reuse_actors),
        run_config=tune.RunConfig(name=f"{method}-seed{seed}", storage_path=str(storage),
                                  callbacks=[recorder], verbose=0,
                                  failure_config=tune.FailureConfig(max_failures=0)))
    t0 = time.perf_counter()
    grid = tuner.fit()
    wall = time.perf_counter() - t0
    if grid.errors:
        raise RuntimeError(f"{method}: a trial failed: {grid.errors[0]!r}")
    order = sorted(recorder.params, key=lambda t: recorder.created[t])
    trials = [TrialRecord(t, config_of(space, recorder.params[t]), recorder.params[t],
                          node_id=recorder.nodes.get(t)) for t in order]
    return summarise(method, seed, budget, sizes, trials, recorder.results, wall, searcher,
                     grid)


class _Recorder(Callback):
    """Tune callback (driver side): every trial's params, creation index and node, and every
    rung result in arrival order (Tune's own keys left out). Each rung result also adds the
    trial's new query-evaluations to the open `rag.progress` stage counted in them (`tune:
    search`): a Tune search shows its progress rung by rung; inside a trial (another process)
    nothing is counted until its rung ends."""

    def __init__(self) -> None:
        self.results: list[tuple[str, dict[str, Any]]] = []
        self.params: dict[str, dict[str, Any]] = {}
        self.created: dict[str, int] = {}
        self.nodes: dict[str, str | None] = {}
        self.spent: dict[str, int] = {}

    def on_trial_start(self, iteration: int, trials: list, trial: Any, **info: Any) -> None:
        self.created.setdefault(trial.trial_id, _creation_index(trial, len(self.created)))
        self.params.setdefault(trial.trial_id, dict(trial.config))

    def on_trial_result(self, iteration: int, trials: list, trial: Any, result: dict,
                        **info: Any) -> None:
        from rl.kernel.evaluator import QUERY_EVALUATIONS

        self.nodes.setdefault(trial.trial_id, result.get("node_id"))
        spent = int(result.get("query_evals", 0))  # the trial's rung size so far
        progress.advance(spent - self.spent.get(trial.trial_id, 0), QUERY_EVALUATIONS)
        self.spent[trial.trial_id] = spent
        self.results.append((trial.trial_id, {k: v for k, v in result.items()
                                              if k in _RUNG_RESULT or k.startswith(
                                                  ("gate_", "violation_"))}))


_RUNG_RESULT = ("reward", SEARCH_METRIC, "quality", "faithfulness", "relevancy", "cost",
                "p95_latency_ms", "quality_se", "gates_passed", "query_evals", "rung",
                "full_fidelity", "config_hash", "rung_seconds", "training_iteration")


def _creation_index(trial: Any, default: int) -> int:
    """The order Tune created `trial` in: its experiment tag starts with the searcher's
    counter ("3_k=5,..."); `default` when it does not."""
    head = str(getattr(trial, "experiment_tag", "")).split("_", 1)[0]
    return int(head) if head.isdigit() else default
