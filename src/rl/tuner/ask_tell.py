"""The one search protocol: a searcher is asked for configs and told their results, rung by rung,
under a budget of query-evaluations; this module runs it in this process.

    res = run_search(ev, space, SearchPlan("local-asha", budget=2400, seed=0, start=default))
    res.best_config, res.best_reward   # the incumbent at full fidelity
    res.trials                         # TrialRecord per trial, in creation order
    res.curve                          # best full-fidelity reward vs cumulative query-evals

Two executors drive the same objects (`searchers.make_searcher`, `searchers.make_scheduler`) and
score a rung with the same function (`evaluate_rung`):
  * `run_search` (here): one trial at a time, in this process, on the open evaluator `ev`. The
    default for a local run: no Ray runtime, no trial actors, cached rows read in place.
  * `rl.tuner.tune_search.tune_search`: `tune.Tuner` runs each trial as a Ray actor, for
    Ray Tune's trial scheduling (concurrent trials, a cluster, per-trial resources).
With one trial at a time and a fixed seed both give the same trials (configs and rungs, in
order) and the same best config: `run_search` calls the searcher and scheduler exactly as Tune's
controller does (after each rung result: the scheduler's decision, then the searcher's
`on_trial_result` unless the decision is STOP; when the trial ends, `on_trial_complete` of
both).

A trial evaluates its config on growing rungs of the tuning split (`rl.tuner.fidelity`: the first
25, then 75 queries of one fixed permutation, then the whole split; the MULTI_FIDELITY searchers
only, the others score every trial on the whole split). After each rung the scheduler may stop
it; rows are lazy, so a promoted trial pays only for the new queries. The budget is counted in
query-evaluations (rows a search asked for, cached or not): no trial starts once the trials'
query-evaluations reach it, and a started trial finishes its rungs (so a search overshoots by
less than one full split per concurrent trial). Each rung is also priced in seconds by the
evaluator's cost model (the pipeline time its new queries take on this machine).
Searchers and schedulers rank by `searchers.search_score` (the reward without its instability
term, which measures batch size); the incumbent is the best reward of a trial evaluated on the
full split (ties: the earliest-created trial): a low-fidelity score never wins.

A rung result (`trial_metrics`): reward, score, quality (αF + βR, `RewardSpec.quality`),
faithfulness, relevancy, cost (tokens per query), p95_latency_ms, quality_se, gate verdicts
(`gate_<name>`, `gates_passed`), gate violations (`violation_<name>`: relative to the threshold,
> 0 = violated, NaN -> 1), query_evals (the rung size: queries this trial was scored on so
far), rung, full_fidelity, config_hash, rung_seconds (cost-model seconds of the rung's new
queries) and training_iteration (the rung level, as Tune counts it).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np

from rag.config import RAGConfig
from rag.errors import ConfigError
from rl.kernel.reward import HARD_GATES
from rl.tuner.fidelity import rung_indices, rungs_for
from rl.tuner.plan import SearchPlan
from rl.tuner.results import TuneResult
from rl.tuner.searchers import (
    CONFIG_KEY,
    MULTI_FIDELITY,
    SEARCH_METRIC,
    SEARCHERS,
    make_scheduler,
    make_searcher,
    search_score,
)

if TYPE_CHECKING:
    from rl.kernel.evaluator import TunerEvaluator

DEFAULT_RUNGS: tuple[int | None, ...] = (25, 75, None)


# ---- one rung ---------------------------------------------------------------------------------
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


def evaluate_rung(ev: TunerEvaluator, cfg: RAGConfig, split: str, sizes: Sequence[int],
                  level: int) -> dict[str, Any]:
    """Score `cfg` on rung `level` (1-based) of `split`: the first `sizes[level-1]` queries of
    the fixed permutation (`fidelity.rung_indices`; `sizes` ends with the split's size). The
    rung result of the module docstring; `rung_seconds` prices only the queries the previous
    rung did not have."""
    n_total, n = sizes[-1], sizes[level - 1]
    done = sizes[level - 2] if level > 1 else 0
    idx = rung_indices(n_total, n)
    rep = ev.evaluate(cfg, split, idx)
    lat = np.asarray(ev.table(cfg, split, idx)["latency_ms"])[idx[done:]]
    return {**trial_metrics(rep, ev.reward_spec(), level, n == n_total),
            "rung_seconds": float(np.sum(lat)) / 1000.0, "training_iteration": level}


def config_of(space: Any, params: dict[str, Any]) -> RAGConfig:
    """The RAGConfig of a trial's params: a `ConfigSampler` trial carries it whole
    (`CONFIG_KEY`), the others a point of `space.tune_param_space()`."""
    if CONFIG_KEY in params:
        return RAGConfig.from_dict(params[CONFIG_KEY], where="trial")
    return space.from_params(params)


# ---- what a search returns ---------------------------------------------------------------------
RUNG_KEYS = ("reward", SEARCH_METRIC, "quality", "cost", "p95_latency_ms", "gates_passed")


@dataclass
class TrialRecord:
    trial_id: str
    config: RAGConfig
    params: dict[str, Any]
    rungs: list[dict[str, Any]] = field(default_factory=list)
    """One rung result per rung evaluated (module docstring), plus n (queries) and full."""
    node_id: str | None = None
    """The Ray node that ran it (None in this process)."""

    @property
    def full(self) -> dict[str, Any] | None:
        return self.rungs[-1] if self.rungs and self.rungs[-1].get("full") else None

    @property
    def query_evals(self) -> int:
        return int(self.rungs[-1]["n"]) if self.rungs else 0


@dataclass
class SearchResult:
    """A finished search, whichever executor ran it.

    `trials`: TrialRecords in creation order; `history`: every rung result in arrival order
    (with trial_id and cum_query_evals); `curve`: after each rung result, {"query_evals":
    cumulative, "seconds": cumulative cost-model seconds, "best_full": the best full-fidelity
    reward so far (None before the first)}; `best_config` / `best_reward`: the incumbent
    (None when no trial reached the full split); `query_evals` / `seconds`: what the search
    spent; `wall_s`: the executor's wall time; `searcher`: the searcher it ran (its Optuna
    study, for TPE); `grid`: Tune's ResultGrid (the Tune executor only)."""

    method: str
    seed: int
    budget: int
    rungs: tuple[int, ...]
    trials: list[TrialRecord]
    history: list[dict[str, Any]]
    curve: list[dict[str, Any]]
    best_config: RAGConfig | None
    best_reward: float | None
    query_evals: int
    seconds: float
    wall_s: float = 0.0
    searcher: Any = None
    grid: Any = None

    def evals_to_reach(self, target: float) -> int | None:
        """Query-evaluations spent when the best full-fidelity reward first reached `target`
        (None: never within the budget)."""
        for point in self.curve:
            if point["best_full"] is not None and point["best_full"] >= target:
                return int(point["query_evals"])
        return None

    def to_tune_result(self) -> TuneResult:
        """As PPO's `TuneResult` (one curve entry per rung result; `extra["query_evals"]` the
        budget spent). ValueError without an incumbent."""
        if self.best_config is None:
            raise ValueError("no trial reached full fidelity: no incumbent")
        curve = [{"eval": i, "reward": h["reward"], "config_hash": h["config_hash"],
                  "query_evals": h["cum_query_evals"], "best_so_far": c["best_full"]}
                 for i, (h, c) in enumerate(zip(self.history, self.curve, strict=True), 1)]
        return TuneResult(self.method, self.best_config, len(self.history), curve,
                          self.wall_s, {"query_evals": self.query_evals, "rungs": self.rungs,
                                        "trials": len(self.trials), "budget": self.budget})


def summarise(method: str, seed: int, budget: int, sizes: Sequence[int],
              trials: Sequence[TrialRecord], arrivals: Sequence[tuple[str, dict[str, Any]]],
              wall_s: float, searcher: Any = None, grid: Any = None) -> SearchResult:
    """The SearchResult of `trials` (creation order) whose rung results arrived as `arrivals`
    ((trial_id, rung result) each, in arrival order; the trials' `rungs` are filled here).
    The incumbent breaks reward ties by creation, not arrival, so concurrent trials reporting
    in another order name the same best config; the curve follows arrival."""
    by_id = {t.trial_id: t for t in trials}
    history, curve, spent, seconds, best = [], [], 0, 0.0, None
    for tid, m in arrivals:
        t = by_id[tid]
        spent += m["query_evals"] - t.query_evals
        seconds += float(m.get("rung_seconds", 0.0))
        t.rungs.append({**m, "n": int(m["query_evals"]), "full": bool(m["full_fidelity"])})
        if m["full_fidelity"] and np.isfinite(m["reward"]) and (best is None or
                                                                m["reward"] > best):
            best = float(m["reward"])
        history.append({**m, "trial_id": tid, "cum_query_evals": spent})
        curve.append({"query_evals": spent, "seconds": seconds, "best_full": best})
    inc: tuple[float, RAGConfig] | None = None
    for t in trials:
        if t.full is not None and np.isfinite(t.full["reward"]) and (
                inc is None or t.full["reward"] > inc[0]):
            inc = (float(t.full["reward"]), t.config)
    return SearchResult(method, seed, budget, tuple(sizes), list(trials), history, curve,
                        None if inc is None else inc[1], None if inc is None else inc[0],
                        spent, seconds, wall_s, searcher, grid)


def check_search(method: str, budget: int | None, max_concurrent: int = 1) -> None:
    """ConfigError naming `method`, `budget` (None or < 1) or `max_concurrent` when a search
    cannot run."""
    if method not in SEARCHERS:
        raise ConfigError("method", f"must be one of {', '.join(SEARCHERS)}, got {method!r}")
    if budget is None or budget < 1:
        raise ConfigError("budget", f"must be >= 1 query-evaluation, got {budget}")
    if max_concurrent < 1:
        raise ConfigError("max_concurrent", f"must be >= 1, got {max_concurrent}")


def rung_sizes(ev: TunerEvaluator, method: str, split: str,
               rungs: Sequence[int | None] = DEFAULT_RUNGS) -> tuple[int, ...]:
    """The rung sizes `method` climbs on `split` of `ev`: `fidelity.rungs_for` for the
    MULTI_FIDELITY searchers, else the whole split only."""
    n_total = len(ev.data.examples(split))
    return tuple(rungs_for(n_total, rungs) if method in MULTI_FIDELITY else [n_total])


# ---- the in-process executor ------------------------------------------------------------------
class _TrialRef:
    """What Tune's scheduler reads of a trial: its id."""

    def __init__(self, trial_id: str):
        self.trial_id = trial_id


def run_search(ev: TunerEvaluator, space: Any, plan: SearchPlan, split: str | None = None,
               rungs: Sequence[int | None] = DEFAULT_RUNGS,
               on_trial: Callable[[TrialRecord, int], None] | None = None) -> SearchResult:
    """Search `space` (a ConfigSpace) as `plan` says (method, budget, seed, first trial) on the
    open TunerEvaluator `ev`, one trial at a time in this process (module docstring). `split`:
    default the evaluator's tune split; `rungs`: the fidelity schedule; `on_trial(trial,
    spent)`: called after each trial (progress). Deterministic for a fixed seed (given the
    evaluator's cached rows and cost model). ConfigError naming `method` or `budget`."""
    from ray.tune.schedulers import TrialScheduler
    from ray.tune.search import Searcher

    method, budget, seed = plan.method, plan.budget, plan.seed
    check_search(method, budget)
    t0 = time.perf_counter()
    split = split or ev.slice.tune_split
    sizes = rung_sizes(ev, method, split, rungs)
    searcher = make_searcher(method, seed, space, plan.start, budget)
    scheduler = make_scheduler(method, sizes, seed)
    if scheduler is not None:
        scheduler.set_search_properties(SEARCH_METRIC, "max")
    trials: list[TrialRecord] = []
    arrivals: list[tuple[str, dict[str, Any]]] = []
    for i in range(budget + 1):  # every trial spends >= 1 query-evaluation
        tid = f"{method}-{seed}-{i:05d}"
        params = searcher.suggest(tid)
        if params is None or params == Searcher.FINISHED:
            break
        rec = TrialRecord(tid, config_of(space, params), dict(params))
        trials.append(rec)
        if scheduler is not None:
            scheduler.on_trial_add(None, _TrialRef(tid))
        result: dict[str, Any] = {}
        for level in range(1, len(sizes) + 1):
            result = evaluate_rung(ev, rec.config, split, sizes, level)
            arrivals.append((tid, result))
            rec.rungs.append({**result, "n": sizes[level - 1], "full": level == len(sizes)})
            action = TrialScheduler.CONTINUE
            if scheduler is not None:
                action = scheduler.on_trial_result(None, _TrialRef(tid), result)
            if action != TrialScheduler.STOP:
                searcher.on_trial_result(tid, result)
            if action == TrialScheduler.STOP or level == len(sizes):
                break
        if scheduler is not None:
            scheduler.on_trial_complete(None, _TrialRef(tid), result)
        searcher.on_trial_complete(tid, result)
        if on_trial is not None:
            on_trial(rec, searcher.spent)
    for rec in trials:  # summarise fills them again, in arrival order
        rec.rungs = []
    return summarise(method, seed, budget, sizes, trials, arrivals,
                     time.perf_counter() - t0, searcher)


def exhaustive(ev: TunerEvaluator, space: Any, split: str | None = None) -> SearchResult:
    """Every config of `space.grid()` scored on the whole `split` (default the tune split):
    `run_search` with method grid and a budget that covers them all. ConfigError when the
    space is too large to enumerate (`ConfigSpace.grid`)."""
    split = split or ev.slice.tune_split
    n = len(ev.data.examples(split))
    return run_search(ev, space, SearchPlan("grid", budget=n * space.size()), split=split)
