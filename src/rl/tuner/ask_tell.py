"""Ray Tune's own searchers and schedulers, driven synchronously in this process.

`tune.Tuner` (`rl.tuner.tune_search`) runs trials as actors: right for a cluster, but each
actor must open the indexes and the row cache, and a trial costs Tune's bookkeeping on top of
its evaluation. When the evaluator lives in this process and evaluations are mostly cached rows
(the search benchmark runs hundreds of searches), this module asks the same searcher objects
(`rl.tuner.searchers.make_searcher`: constrained Optuna TPE, HyperOpt) for configs and feeds the
same schedulers (`make_scheduler`: seeded ASHA / async HyperBand) the same results
(`rl.tuner.tune_search.trial_metrics`), one trial at a time — what `tune.Tuner` does with
`max_concurrent_trials=1` — without actors.

A trial evaluates its config on growing rungs of the tuning split (`rl.tuner.fidelity`: the first
25, then 75 queries of one fixed permutation, then the whole split). After each rung the
scheduler may stop it; rows are lazy, so a promoted trial pays only for the new queries. The
budget is counted in query-evaluations (rows a search asked for, cached or not) and also priced
in seconds by the evaluator's cost model (the pipeline time those queries take on this machine).
Searchers and schedulers rank by `searchers.search_score` (the reward without its instability
term, which measures batch size); the incumbent is the best reward of a trial evaluated on the
full split: a low-fidelity score never wins.

Constraints: TPE gets the hard gates' relative violations as Optuna constraints and trials
stopped early as PRUNED (`searchers.ConstrainedOptunaSearch`); HyperOpt and random search see
only the score (whose gate penalty already ranks infeasible configs low).
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
from rl.tuner.searchers import SEARCH_METRIC, make_scheduler, make_searcher
from rl.tuner.tune_search import trial_metrics

METHODS = ("random", "tpe", "tpe-asha", "local-asha", "tpe-hyperband", "hyperopt")
MULTI_FIDELITY = ("tpe-asha", "local-asha", "tpe-hyperband")


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


class _TrialRef:
    """What Tune's scheduler reads of a trial: its id."""

    def __init__(self, trial_id: str):
        self.trial_id = trial_id


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
    sizes = rungs_for(n_total, rungs) if method in MULTI_FIDELITY else [n_total]
    searcher = None
    if method != "random":
        searcher = make_searcher(method, seed, space, start)
        searcher.set_search_properties(SEARCH_METRIC, "max", space.tune_param_space())
    scheduler = make_scheduler(method, tuple(sizes), seed)
    if scheduler is not None:
        scheduler.set_search_properties(SEARCH_METRIC, "max")
    spec = ev.reward_spec()
    rng = np.random.default_rng(seed)
    trials: list[TrialRecord] = []
    curve: list[dict[str, Any]] = []
    spent, seconds = 0, 0.0
    best: tuple[float, RAGConfig] | None = None
    pending_start = start if searcher is None else None
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
            result = {**trial_metrics(rep, spec, level, n == n_total),
                      "training_iteration": level}
            rec.rungs.append({k: result[k] for k in (
                "reward", SEARCH_METRIC, "quality", "cost", "p95_latency_ms", "gates_passed")}
                | {"n": n, "full": n == n_total})
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
