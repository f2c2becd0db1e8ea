"""The searchers and schedulers behind `rl.tuner.tune_search` (Ray Tune objects).

    make_searcher(method, seed, space, start, max_concurrent) -> a Tune Searcher
    make_scheduler(method, rungs, seed) -> a Tune TrialScheduler or None

`ConstrainedOptunaSearch` is Ray's `OptunaSearch` with two changes Optuna's TPE needs to read a
multi-fidelity, gated search correctly:
  * feasibility: before a trial is told, its last result's gate violations
    (`violation_<gate>`, > 0 = violated) are set as the Optuna trial's constraints
    (`Trial.set_constraint`, Optuna >= 5), so TPE ranks infeasible configs below every feasible
    one by total violation (Optuna's constrained TPE) instead of reading only the penalised
    reward;
  * fidelity: a trial a scheduler (or the budget) stopped before the full split is told as
    PRUNED, so TPE ranks it by its last intermediate value behind the trials that completed,
    instead of taking a 25-query reward for a full-split one.
`SeededAsyncHyperBand` is Ray's ASHA / async HyperBand with its bracket draw on a seeded
generator (Ray draws from the global numpy state), so a search is reproducible.
"""

from __future__ import annotations

from typing import Any

import numpy as np
from optuna.trial import TrialState
from ray.tune.schedulers import AsyncHyperBandScheduler
from ray.tune.search import BasicVariantGenerator, ConcurrencyLimiter
from ray.tune.search.optuna import OptunaSearch

from rag.config import RAGConfig
from rag.errors import ConfigError
from rl.tuner.reward import HARD_GATES, UNSTABLE_PENALTY

SEARCH_METRIC = "score"
"""What searchers and schedulers rank trials by (`search_score`); incumbents are still chosen by
the reward at full fidelity."""


def search_score(reward: float, stable: bool, lambda_: float) -> float:
    """The reward without its instability term (+λ·0.5 back when the batch was unstable).
    Stability says how many queries a batch had, not how good the config is: at a 25-query rung
    nearly every config's standard error is above the 0.05 band, and the 0.5λ step flipping
    near it would swamp the differences a rung is there to rank. At the full split the two are
    equal for any stable config."""
    return float(reward) + (0.0 if stable else lambda_ * UNSTABLE_PENALTY)


class ConstrainedOptunaSearch(OptunaSearch):
    """OptunaSearch (TPE) with gate constraints and pruned low-fidelity trials (module
    docstring). Results must carry `violation_<gate>` for each hard gate and
    `full_fidelity`."""

    def on_trial_complete(self, trial_id: str, result: dict | None = None,
                          error: bool = False) -> None:
        ot_trial = self._ot_trials.get(trial_id)
        if ot_trial is None or trial_id in self._completed_trials or error or not result:
            return super().on_trial_complete(trial_id, result, error)
        for gate in HARD_GATES:
            v = result.get(f"violation_{gate}")
            if v is not None:
                ot_trial.set_constraint(gate, float(v))
        if result.get("full_fidelity", True):
            return super().on_trial_complete(trial_id, result, error)
        self._ot_study.tell(ot_trial, state=TrialState.PRUNED)
        self._completed_trials.add(trial_id)
        return None


class SeededAsyncHyperBand(AsyncHyperBandScheduler):
    """AsyncHyperBandScheduler (ASHA with `brackets=1`) drawing each trial's bracket from a
    generator seeded with `seed`, with Ray's probabilities (softmax of the bracket sizes)."""

    def __init__(self, *args: Any, seed: int = 0, **kwargs: Any):
        super().__init__(*args, **kwargs)
        self._rng = np.random.default_rng(seed)

    def on_trial_add(self, tune_controller: Any, trial: Any) -> None:
        if not self._metric or not self._metric_op:
            return super().on_trial_add(tune_controller, trial)  # raises Ray's error
        sizes = np.array([len(b._rungs) for b in self._brackets])
        p = np.e ** (sizes - sizes.max())
        idx = int(self._rng.choice(len(self._brackets), p=p / p.sum()))
        self._trial_info[trial.trial_id] = self._brackets[idx]
        return None


def start_point(space: Any, config: RAGConfig | None) -> dict[str, Any] | None:
    """`config` as a point of `space.tune_param_space()`, or None when it has none (or
    `config` is None): `space.to_params(config, complete=True)` where the space has it, else
    (the five-head space) `baselines._point_of`."""
    if config is None:
        return None
    to_params = getattr(space, "to_params", None)
    if to_params is not None:  # the full space (every head, inactive ones at their default)
        try:
            return to_params(config, complete=True)
        except ConfigError:
            return None
    from rl.tuner.baselines import _point_of

    return _point_of(space, config)


def make_searcher(method: str, seed: int, space: Any, start: RAGConfig | None = None,
                  max_concurrent: int = 1) -> Any:
    """The Tune searcher of `method` (`tune_search.METHODS`), seeded, trying `start` first
    (not for grid), at most `max_concurrent` trials at once."""
    first = None if method == "grid" else start_point(space, start)
    points = [first] if first is not None else None
    if method.startswith("tpe"):
        import optuna

        optuna.logging.set_verbosity(optuna.logging.WARNING)
        searcher = ConstrainedOptunaSearch(metric=SEARCH_METRIC, mode="max", seed=seed,
                                           points_to_evaluate=points)
    elif method == "hyperopt":
        from ray.tune.search.hyperopt import HyperOptSearch

        searcher = HyperOptSearch(metric=SEARCH_METRIC, mode="max", random_state_seed=seed,
                                  points_to_evaluate=points)
    elif method in ("random", "grid"):
        return BasicVariantGenerator(points_to_evaluate=points, max_concurrent=max_concurrent,
                                     random_state=seed)
    else:
        raise ValueError(f"no searcher for method {method!r}")
    return ConcurrencyLimiter(searcher, max_concurrent=max_concurrent)


def make_scheduler(method: str, rungs: tuple[int, ...], seed: int = 0) -> Any:
    """ASHA (tpe-asha: one bracket) or async HyperBand (tpe-hyperband: one bracket per rung)
    over `rungs` (concrete sizes; the time axis is `query_evals`, the grace period the first
    rung, the reduction factor rung 2 / rung 1, default 3); None for the other methods (every
    trial runs to the full split)."""
    if method not in ("tpe-asha", "tpe-hyperband"):
        return None
    rf = rungs[1] / rungs[0] if len(rungs) > 1 else 3.0
    return SeededAsyncHyperBand(time_attr="query_evals", max_t=rungs[-1],
                                grace_period=rungs[0], reduction_factor=rf,
                                brackets=1 if method == "tpe-asha" else len(rungs), seed=seed)
