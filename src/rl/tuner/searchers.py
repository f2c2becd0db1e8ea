"""The searchers and schedulers of the one search protocol (`rl.tuner.ask_tell`): Ray Tune
`Searcher` / `TrialScheduler` objects, which the in-process executor (`ask_tell.run_search`) and
the `tune.Tuner` executor (`rl.tuner.tune_search`) drive alike.

    make_searcher(method, seed, space, start, budget, max_concurrent) -> a BudgetLimiter
    make_scheduler(method, rungs, seed) -> a Tune TrialScheduler or None

Methods (`SEARCHERS`):
    local-asha  `LocalSearch` from the start point + ASHA over the fidelity rungs (the default)
    tpe         `ConstrainedOptunaSearch` (Optuna TPE, seeded), every trial on the full split
    tpe-asha    the same + ASHA (the search benchmark compares it; not a CLI method)
    hyperopt    Ray's `HyperOptSearch` (seeded), full split
    random      `ConfigSampler` over `space.sample` (seeded), full split
    grid        `ConfigSampler` over every config of `space.grid()` (a small, pinned space)

`ConstrainedOptunaSearch` is Ray's `OptunaSearch` with two changes Optuna's TPE needs to read a
multi-fidelity, gated search correctly:
  * feasibility: before a trial is told, its last result's gate violations
    (`violation_<gate>`, > 0 = violated) are set as the Optuna trial's constraints
    (`Trial.set_constraint`, Optuna >= 5), so TPE ranks infeasible configs below every feasible
    one by total violation (Optuna's constrained TPE) instead of reading only the penalised
    reward;
  * fidelity: a trial a scheduler (or the budget) stopped before the full split is told as
    PRUNED, with its last rung score as its last intermediate value, so TPE ranks it behind
    the trials that completed instead of taking a 25-query reward for a full-split one.
`LocalSearch` (method local-asha) is a Tune `Searcher` of its own: a local search from the start
point over one-head moves (its docstring).
`SeededAsyncHyperBand` is Ray's ASHA with its bracket draw on a seeded generator (Ray draws from
the global numpy state), so a search is reproducible.
`BudgetLimiter` is Ray's `ConcurrencyLimiter` that also ends the search (`Searcher.FINISHED`)
once the trials' query-evaluations reach the budget: no trial starts after that, a running one
finishes its rungs.
"""

from __future__ import annotations

from typing import Any

import numpy as np
from optuna.trial import TrialState
from ray.tune.schedulers import AsyncHyperBandScheduler
from ray.tune.search import ConcurrencyLimiter, Searcher
from ray.tune.search.optuna import OptunaSearch
from ray.tune.search.sample import Categorical, Integer

from rag.config import RAGConfig
from rag.errors import ConfigError
from rl.kernel.reward import HARD_GATES, UNSTABLE_PENALTY

SEARCHERS = ("local-asha", "tpe", "tpe-asha", "hyperopt", "random", "grid")
MULTI_FIDELITY = ("local-asha", "tpe-asha")
"""The searchers whose trials climb the fidelity rungs under ASHA; the others score every trial
on the full split."""
CONFIG_KEY = "config"
"""The only parameter of a `ConfigSampler` trial: the RAGConfig mapping of its config."""
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
        step = int(result.get("training_iteration", 1))
        value = result.get(self._metric)
        if value is not None and step not in ot_trial.storage.get_trial(
                ot_trial._trial_id).intermediate_values:
            ot_trial.report(float(value), step)  # a stopped trial's last rung score
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
    """`config` as a point of `space.tune_param_space()` (`space.to_params(config,
    complete=True)`), or None when the space cannot express it (or `config` is None)."""
    if config is None:
        return None
    try:
        return space.to_params(config, complete=True)
    except ConfigError:
        return None


def make_searcher(method: str, seed: int, space: Any, start: RAGConfig | None = None,
                  budget: int | None = None, max_concurrent: int = 1) -> BudgetLimiter:
    """The searcher of `method` (`SEARCHERS`), seeded, trying `start` first (not grid), at most
    `max_concurrent` trials at once, ending once `budget` query-evaluations are spent (None: no
    budget; grid ends when every config was suggested). Its metric is `SEARCH_METRIC`, to
    maximise. ConfigError naming `method` for an unknown method; `space.grid()`'s for a space
    too large to enumerate."""
    if method not in SEARCHERS:
        raise ConfigError("method", f"must be one of {', '.join(SEARCHERS)}, got {method!r}")
    if method == "grid":
        searcher: Searcher = ConfigSampler(configs=list(space.grid()))
    elif method == "random":
        searcher = ConfigSampler(space=space, seed=seed, start=start)
    else:
        first = start_point(space, start)
        points = [first] if first is not None else None
        if method.startswith("tpe"):
            import optuna

            optuna.logging.set_verbosity(optuna.logging.WARNING)
            searcher = ConstrainedOptunaSearch(metric=SEARCH_METRIC, mode="max", seed=seed,
                                               points_to_evaluate=points)
        elif method == "hyperopt":
            from ray.tune.search.hyperopt import HyperOptSearch

            searcher = HyperOptSearch(metric=SEARCH_METRIC, mode="max",
                                      random_state_seed=seed, points_to_evaluate=points)
        else:  # local-asha; a point's key: its config (inactive heads are no change)
            searcher = LocalSearch(metric=SEARCH_METRIC, mode="max", seed=seed,
                                   points_to_evaluate=points,
                                   key=lambda p: space.from_params(p).config_hash)
        searcher.set_search_properties(SEARCH_METRIC, "max", space.tune_param_space())
    return BudgetLimiter(searcher, budget, max_concurrent)


def make_scheduler(method: str, rungs: tuple[int, ...], seed: int = 0) -> Any:
    """ASHA (one bracket) over `rungs` for the MULTI_FIDELITY methods (concrete sizes; the time
    axis is `query_evals`, the grace period the first rung, the reduction factor rung 2 /
    rung 1, default 3); None for the others (every trial runs to the full split). Its metric
    and mode are set by the executor (Tune refuses a scheduler that has them already)."""
    if method not in MULTI_FIDELITY:
        return None
    rf = rungs[1] / rungs[0] if len(rungs) > 1 else 3.0
    return SeededAsyncHyperBand(time_attr="query_evals", max_t=rungs[-1],
                                grace_period=rungs[0], reduction_factor=rf, brackets=1,
                                seed=seed)


class BudgetLimiter(ConcurrencyLimiter):
    """`ConcurrencyLimiter` over `searcher` (at most `max_concurrent` live trials) that returns
    `Searcher.FINISHED` once the trials' query-evaluations (each trial's latest reported
    `query_evals`, summed) reach `budget` (None: never). `spent` is that sum."""

    def __init__(self, searcher: Searcher, budget: int | None, max_concurrent: int = 1):
        super().__init__(searcher, max_concurrent=max_concurrent)
        self.budget = budget
        self.by_trial: dict[str, int] = {}

    @property
    def spent(self) -> int:
        return sum(self.by_trial.values())

    def suggest(self, trial_id: str) -> dict | None:
        if self.budget is not None and self.spent >= self.budget:
            return Searcher.FINISHED
        return super().suggest(trial_id)

    def on_trial_result(self, trial_id: str, result: dict) -> None:
        self._count(trial_id, result)
        super().on_trial_result(trial_id, result)

    def on_trial_complete(self, trial_id: str, result: dict | None = None,
                          error: bool = False) -> None:
        self._count(trial_id, result)
        super().on_trial_complete(trial_id, result, error)

    def _count(self, trial_id: str, result: dict | None) -> None:
        if result and "query_evals" in result:
            self.by_trial[trial_id] = int(result["query_evals"])


class ConfigSampler(Searcher):
    """Whole configs as trials (`{CONFIG_KEY: config mapping}`): `start` first, then either every
    config of `configs` in order (then `Searcher.FINISHED`), or seeded draws of
    `space.sample` (random search: `numpy.random.default_rng(seed)`)."""

    def __init__(self, configs: list[RAGConfig] | None = None, space: Any = None,
                 seed: int = 0, start: RAGConfig | None = None):
        super().__init__(metric=SEARCH_METRIC, mode="max")
        if (configs is None) == (space is None):
            raise ValueError("ConfigSampler: give configs or a space, not both")
        self._configs = None if configs is None else list(configs)
        self._space = space
        self._rng = np.random.default_rng(seed)
        self._queue = [start] if start is not None else []

    def set_search_properties(self, metric: str | None, mode: str | None, config: dict,
                              **spec: Any) -> bool:
        return True  # it proposes whole configs: a param space adds nothing

    def suggest(self, trial_id: str) -> dict | None:
        if self._queue:
            cfg = self._queue.pop(0)
        elif self._configs is not None:
            if not self._configs:
                return Searcher.FINISHED
            cfg = self._configs.pop(0)
        else:
            cfg = self._space.sample(self._rng)
        return {CONFIG_KEY: cfg.model_dump(mode="json")}

    def on_trial_complete(self, trial_id: str, result: dict | None = None,
                          error: bool = False) -> None:
        return None


class LocalSearch(Searcher):
    """Local search over a Tune param space (`local-asha`), first-improvement with a pattern
    move, for a multi-fidelity scheduler to cut.

    First the `points_to_evaluate` (e.g. the config in production). Then the neighbours of the
    parent, in a seeded random order: every other value of each categorical head, and for
    each ordered head (k, the continuous heads) one step down and one up, of a random size
    (k times or divided by a factor drawn log-uniformly in [1.3, 3]; a continuous head by
    10-40% of its range, snapped to its grid). The parent is the best trial at the highest
    rung any trial reached (rungs are nested prefixes of one permutation, so scores at one rung
    compare like with like): under ASHA a neighbour that scores well at 25 queries is promoted,
    and becomes the parent only once it also leads on the full split. A new parent's
    neighbourhood starts with the move that made it (the same head, the same direction again:
    Hooke and Jeeves' pattern move). Once a parent's neighbourhood is spent, two heads change
    at once. A head that does not count in the parent (the fusion weight of bm25) keeps its
    value, so switching it on (variant -> hybrid) first tries that value; pairing the switch
    with moves of the heads it turns on was measured and reverted (e05d27c: MTRAG no better,
    HotpotQA 26% more query-evaluations to 99% of best-known). With probability `explore` a
    suggestion is a point drawn uniformly from the whole space. A point whose `key` (default: the params; the tuner passes the config hash, so a
    change to a head inactive in the parent is no change) was suggested before is skipped; when
    `max_tries` local draws all were, the suggestion is drawn uniformly (taken after as many
    more tries: a spent space).

    Why: the tuner's space is large (> 10^6 configs), but good configs differ from the default
    in a few heads, and the reward moves monotonically with the ordered ones over long
    stretches (k above all: tokens grow with it); TPE's first draws are uniform over every head.
    Gates: the parent is the best *feasible* trial at that rung (no `violation_<gate>` > 0 in
    its result); while none is feasible, the one with the least total violation (ties: the
    better score), as Optuna's constrained TPE ranks infeasible trials. So a search that
    starts from a config failing a gate (MTRAG's default fails relevancy), or whose gates
    carry a margin (`TunerSettings.gate_z`), moves towards feasibility instead of towards the
    cheapest infeasible config, which is what the penalised score alone rewards (a failed gate
    costs λ whatever its size). Deterministic for a fixed seed and result sequence."""

    def __init__(self, metric: str | None = None, mode: str | None = None, seed: int = 0,
                 points_to_evaluate: list[dict[str, Any]] | None = None,
                 key: Any = None, explore: float = 0.05, max_tries: int = 50):
        super().__init__(metric=metric, mode=mode)
        self._rng = np.random.default_rng(seed)
        self._queue = [dict(p) for p in points_to_evaluate or []]
        self._key = key or (lambda p: tuple(sorted(p.items())))
        self.explore, self.max_tries = explore, max_tries
        self._space: dict[str, Any] = {}
        self._params: dict[str, dict[str, Any]] = {}
        self._moves: dict[str, tuple[str, int] | None] = {}  # trial -> (head, direction)
        self._seen: set[Any] = set()
        # trial -> (rung level, score, total gate violation: 0 = feasible)
        self._scores: dict[str, tuple[int, float, float]] = {}
        self._hood: list[tuple[str, int | Any]] = []  # the parent's untried moves
        self._hood_of: str | None = None

    def set_search_properties(self, metric: str | None, mode: str | None, config: dict,
                              **spec: Any) -> bool:
        if self._space:
            return False
        self._space = dict(config)
        if metric:
            self._metric = metric
        if mode:
            self._mode = mode
        return True

    def suggest(self, trial_id: str) -> dict[str, Any] | None:
        if not self._space:
            raise ConfigError("searcher", "LocalSearch needs a param space "
                                          "(set_search_properties)")
        point, move = None, None
        while self._queue and point is None:
            p = self._queue.pop(0)
            point = None if self._key(p) in self._seen else p
        for i in range(2 * self.max_tries if point is None else 0):
            # a spent neighbourhood (every nearby point seen): uniform draws after max_tries
            point, move = self._draw(uniform=i >= self.max_tries)
            if self._key(point) not in self._seen:
                break
        self._seen.add(self._key(point))
        self._params[trial_id], self._moves[trial_id] = point, move
        return dict(point)

    def on_trial_result(self, trial_id: str, result: dict) -> None:
        self._record(trial_id, result)

    def on_trial_complete(self, trial_id: str, result: dict | None = None,
                          error: bool = False) -> None:
        if result and not error:
            self._record(trial_id, result)

    def parent(self) -> str | None:
        """At the highest rung reached: the best-scoring feasible trial, else the least
        violating one (class docstring); None before any result."""
        if not self._scores:
            return None
        sign = -1.0 if self._mode == "min" else 1.0
        return max(self._scores, key=lambda t: (self._scores[t][0], -self._scores[t][2],
                                                sign * self._scores[t][1]))

    def _record(self, trial_id: str, result: dict) -> None:
        score = result.get(self._metric)
        if trial_id in self._params and score is not None and np.isfinite(score):
            level = int(result.get("training_iteration", 1))
            violation = sum(max(0.0, float(result.get(f"violation_{g}", 0.0)))
                            for g in HARD_GATES)
            self._scores[trial_id] = (level, float(score), violation)

    def _draw(self, uniform: bool = False) -> tuple[dict[str, Any], tuple[str, int] | None]:
        parent = self.parent()
        if uniform or parent is None or self._rng.random() < self.explore:
            return {h: self._uniform(d) for h, d in self._space.items()}, None
        point = dict(self._params[parent])
        if parent != self._hood_of:  # a new parent: its neighbourhood, the pattern move first
            self._hood_of, self._hood = parent, self._neighbourhood()
            last = self._moves.get(parent)
            if last is not None:
                self._hood.insert(0, last)
        if self._hood:
            head, step = self._hood.pop(0)
            point[head] = self._apply(head, point[head], step)
            return point, ((head, step) if isinstance(step, int) else None)
        heads = [h for h, d in self._space.items() if self._movable(d)]
        for h in self._rng.choice(heads, size=min(2, len(heads)), replace=False):
            point[str(h)] = self._apply(str(h), point[str(h)], self._random_step(str(h)))
        return point, None

    # ---- moves of one head ------------------------------------------------------------------
    def _neighbourhood(self) -> list[tuple[str, Any]]:
        moves: list[tuple[str, Any]] = []
        for h, d in self._space.items():
            if not self._movable(d):
                continue
            if isinstance(d, Categorical):
                moves += [(h, ("=", c)) for c in d.categories]
            else:
                moves += [(h, -1), (h, +1)]
        order = self._rng.permutation(len(moves))
        return [moves[i] for i in order]

    def _random_step(self, head: str) -> Any:
        d = self._space[head]
        if isinstance(d, Categorical):
            return ("=", self._uniform(d))
        return int(self._rng.choice([-1, 1]))

    def _apply(self, head: str, x: Any, step: Any) -> Any:
        """`x` moved by `step`: ("=", value) sets a categorical head; -1 / +1 moves an ordered
        one down / up by a random amount (unchanged at its bound)."""
        d = self._space[head]
        if isinstance(step, tuple):
            return step[1]
        if isinstance(d, Integer):  # upper is exclusive
            f = float(np.exp(self._rng.uniform(np.log(1.3), np.log(3.0))))
            y = int(round(x * f)) if step > 0 else int(round(x / f))
            y = y + step if y == x else y
            return int(min(max(y, d.lower), d.upper - 1))
        dx = float(self._rng.uniform(0.1, 0.4)) * (d.upper - d.lower)
        return self._snap(d, float(x) + step * dx)

    @staticmethod
    def _movable(d: Any) -> bool:
        if isinstance(d, Categorical):
            return len(d.categories) > 1
        return d.upper - d.lower > 0

    def _uniform(self, d: Any) -> Any:
        if isinstance(d, Categorical):
            return d.categories[int(self._rng.integers(len(d.categories)))]
        if isinstance(d, Integer):
            return int(self._rng.integers(d.lower, d.upper))
        return self._snap(d, float(self._rng.uniform(d.lower, d.upper)))

    @staticmethod
    def _snap(d: Any, x: float) -> float:
        q = getattr(d.get_sampler(), "q", None)
        x = min(max(x, d.lower), d.upper)
        if q:
            x = d.lower + round((x - d.lower) / q) * q
            x = round(min(max(x, d.lower), d.upper), 10)
        return float(x)

    def save(self, checkpoint_path: str) -> None:
        import pickle

        with open(checkpoint_path, "wb") as f:
            pickle.dump({k: v for k, v in self.__dict__.items() if k != "_key"}, f)

    def restore(self, checkpoint_path: str) -> None:
        import pickle

        with open(checkpoint_path, "rb") as f:
            self.__dict__.update(pickle.load(f))
