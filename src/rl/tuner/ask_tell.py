"""Ray Tune's own searchers and ASHA scheduler, driven synchronously in this process.

`tune.Tuner` (`rl.tuner.tune_search`) runs trials as actors: right for a cluster, but each
actor must open the indexes and the row cache, and a trial costs Tune's bookkeeping on top of
its evaluation. When the evaluator lives in this process and evaluations are cached rows (the
search benchmark runs hundreds of searches), this module asks the same searcher objects
(`OptunaSearch` with a TPE sampler, `HyperOptSearch`) for configs and feeds the same
`ASHAScheduler` the same results, one trial at a time — what `tune.Tuner` does with
`max_concurrent_trials=1` — without actors.

A trial evaluates its config on growing rungs of the tuning split (`rl.tuner.fidelity`: the first
25, then 75 queries of one fixed permutation, then the whole split). After each rung the
scheduler may stop it; rows are lazy, so a promoted trial pays only for the new queries. The
budget is counted in query-evaluations (rows a search asked for, cached or not) and also priced
in seconds by the evaluator's cost model (the pipeline time those queries take on this machine).
The incumbent is the best trial evaluated on the full split: a low-fidelity score never wins.

Constraints: TPE gets the hard gates' relative violations (`EvalReport.violations`) through an
Optuna `constraints_func`, so it models feasibility apart from the reward; HyperOpt and random
search see only the reward (whose gate penalty already ranks infeasible configs low).
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from rag.config import RAGConfig
from rag.errors import ConfigError
from rl.tuner.fidelity import rung_indices, rungs_for
from rl.tuner.reward import HARD_GATES

CONSTRAINTS = "constraints"
"""Result key: the hard gates' relative violations, in `HARD_GATES` order."""
METHODS = ("random", "random-asha", "tpe", "tpe-asha", "hyperopt", "hyperopt-asha")
REDUCTION_FACTOR = 3


@dataclass
class TrialRecord:
    trial_id: str
    config: RAGConfig
    rungs: list[dict[str, Any]] = field(default_factory=list)
    """One entry per rung evaluated: n, reward, quality, cost, p95_latency_ms, violations."""

    @property
    def full(self) -> dict[str, Any] | None:
        return self.rungs[-1] if self.rungs and self.rungs[-1].get("full") else None


@dataclass
class AskTellResult:
    method: str
    seed: int
    budget: int
    trials: list[TrialRecord]
    curve: list[dict[str, Any]]
    """After every rung evaluation: query_evals, seconds (cost model), best_full (best reward
    among trials evaluated on the full split so far; None before the first)."""
    best_config: RAGConfig | None
    best_reward: float | None
    query_evals: int
    seconds: float
    wall_s: float

    def evals_to_reach(self, target: float) -> int | None:
        """Query-evaluations spent when the best full-fidelity reward first reached `target`
        (None: never within the budget)."""
        for point in self.curve:
            if point["best_full"] is not None and point["best_full"] >= target:
                return int(point["query_evals"])
        return None


class _ConstrainedOptuna:
    """Ray's OptunaSearch whose finished trials carry their gate violations as Optuna
    constraints (`Trial.set_constraint`, one per hard gate; <= 0 is feasible): the TPE sampler
    splits good from bad trials among the feasible ones first, so an infeasible config never
    counts as a good one however high its reward."""

    @classmethod
    def make(cls, param_space: dict, seed: int, points: list[dict] | None):
        import optuna
        from ray.tune.search.optuna import OptunaSearch

        optuna.logging.set_verbosity(optuna.logging.WARNING)

        class Constrained(OptunaSearch):
            def on_trial_complete(self, trial_id, result=None, error=False):
                if result and CONSTRAINTS in result and trial_id in self._ot_trials:
                    for gate, v in zip(HARD_GATES, result[CONSTRAINTS], strict=True):
                        self._ot_trials[trial_id].set_constraint(gate, float(v))
                super().on_trial_complete(trial_id, result, error)

        sampler = optuna.samplers.TPESampler(seed=seed)
        return Constrained(OptunaSearch.convert_search_space(param_space), metric="reward",
                           mode="max", sampler=sampler, points_to_evaluate=points)


def make_searcher(method: str, param_space: dict, seed: int,
                  points: list[dict] | None = None):
    """The Tune `Searcher` behind `method` (None for random search)."""
    base = method.removesuffix("-asha")
    if base == "tpe":
        return _ConstrainedOptuna.make(param_space, seed, points)
    if base == "hyperopt":
        from ray.tune.search.hyperopt import HyperOptSearch

        return HyperOptSearch(HyperOptSearch.convert_search_space(param_space), metric="reward",
                              mode="max", random_state_seed=seed, points_to_evaluate=points)
    if base == "random":
        return None
    raise ConfigError("method", f"must be one of {', '.join(METHODS)}, got {method!r}")


def make_scheduler(method: str, rungs: Sequence[int]):
    """ASHA over the rungs (`time_attr` = the trial's query-evaluations) for `*-asha`, else
    None (every trial runs to the full split)."""
    if not method.endswith("-asha"):
        return None
    from ray.tune.schedulers import ASHAScheduler

    return ASHAScheduler(time_attr="query_evals", metric="reward", mode="max",
                         max_t=int(rungs[-1]), grace_period=int(rungs[0]),
                         reduction_factor=REDUCTION_FACTOR)


class _TrialRef:
    """What Tune's scheduler reads of a trial: its id."""

    def __init__(self, trial_id: str):
        self.trial_id = trial_id


def _as_params(space, config: RAGConfig) -> dict | None:
    """`config` as a point of the searcher's space (every head, acting or not), or None when
    the space cannot express it."""
    to_params = getattr(space, "to_params", None)
    if to_params is None:
        return None
    try:
        try:
            return to_params(config, complete=True)
        except TypeError:  # a space whose points are always complete
            return to_params(config)
    except ConfigError:
        return None


def run_search(ev, space, method: str, budget: int, seed: int = 0, split: str | None = None,
               rungs: Sequence[int | None] = (25, 75, None), start: RAGConfig | None = None
               ) -> AskTellResult:
    """Search `space` with `method` until `budget` query-evaluations are spent (the trial in
    progress finishes its rung). `start`: a config evaluated first (e.g. the one in
    production). Deterministic for a fixed seed (given the evaluator's cached rows and cost
    model)."""
    from ray.tune.schedulers import TrialScheduler

    if method not in METHODS:
        raise ConfigError("method", f"must be one of {', '.join(METHODS)}, got {method!r}")
    if budget < 1:
        raise ConfigError("budget", "must be >= 1 query-evaluation")
    t0 = time.perf_counter()
    split = split or ev.slice.tune_split
    n_total = len(ev.data.examples(split))
    sizes = rungs_for(n_total, rungs) if method.endswith("-asha") else [n_total]
    points = [p for p in [_as_params(space, start)] if p] if start is not None else None
    searcher = make_searcher(method, space.tune_param_space(), seed, points)
    scheduler = make_scheduler(method, sizes)
    rng = np.random.default_rng(seed)
    trials: list[TrialRecord] = []
    curve: list[dict[str, Any]] = []
    spent, seconds = 0, 0.0
    best: tuple[float, RAGConfig] | None = None
    pending_start = start if searcher is None and start is not None else None
    i = 0
    while spent < budget:
        tid = f"{method}-{seed}-{i:05d}"
        i += 1
        if searcher is None:
            cfg = pending_start or space.sample(rng)
            pending_start = None
        else:
            params = searcher.suggest(tid)
            if params is None:  # a finished searcher (never for TPE/HyperOpt)
                break
            cfg = space.from_params(params)
        rec = TrialRecord(tid, cfg)
        trials.append(rec)
        if scheduler is not None:
            scheduler.on_trial_add(None, _TrialRef(tid))
        result: dict[str, Any] = {}
        done = 0
        for level, n in enumerate(sizes, 1):
            idx = rung_indices(n_total, n)
            rep = ev.evaluate(cfg, split, idx)
            new_idx, done = idx[done:], n  # rungs are prefixes: only these are new
            spent += len(new_idx)
            lat = np.asarray(ev.table(cfg, split, idx)["latency_ms"])[new_idx]
            seconds += float(np.sum(lat)) / 1000.0
            spec = ev.reward_spec()
            quality = float(spec.weights.alpha * rep.faithfulness
                            + spec.weights.beta * rep.relevancy)
            result = {"reward": float(rep.reward), "query_evals": n, "training_iteration": level,
                      "quality": quality,
                      "cost": float(rep.cost), "p95_latency_ms": float(rep.p95_latency_ms),
                      CONSTRAINTS: [float(rep.violations.get(g, 0.0)) for g in HARD_GATES]}
            rec.rungs.append({**result, "n": n, "full": n == n_total,
                              "gates": dict(rep.gates)})
            if n == n_total and (best is None or rep.reward > best[0]):
                best = (float(rep.reward), cfg)
            curve.append({"query_evals": spent, "seconds": seconds,
                          "best_full": None if best is None else best[0]})
            if n == n_total:
                break
            action = TrialScheduler.CONTINUE
            if scheduler is not None:
                action = scheduler.on_trial_result(None, _TrialRef(tid), result)
            if searcher is not None:
                searcher.on_trial_result(tid, result)
            if action == TrialScheduler.STOP:
                break
        if scheduler is not None:
            scheduler.on_trial_complete(None, _TrialRef(tid), result)
        if searcher is not None:
            searcher.on_trial_complete(tid, result)
    return AskTellResult(method, seed, budget, trials, curve,
                         None if best is None else best[1], None if best is None else best[0],
                         spent, seconds, time.perf_counter() - t0)
