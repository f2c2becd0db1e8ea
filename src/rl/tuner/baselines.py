"""Baselines that search the same config space under the same evaluation budget as PPO.

One *evaluation* = one config on one batch of `episode.batch_size` tuning queries (exactly one
TunerEnv step), except for the exhaustive grid, which scores every config of the discretised
space once on the whole tuning split: the ceiling any static config can reach. Every method
searches the full space (`ConfigSpace`, every head); the grid only a small one (the default
space has > 10^6 configs: `grid()` refuses it, pin heads, e.g.
`TunerSettings.with_legacy_space()`).

    grid_search     every config (ConfigSpace.grid), the static ceiling of a small space
    random_search   uniform over the heads (ConfigSpace.sample)
    optuna_search   Ray Tune's OptunaSearch (TPE, define-by-run: ConfigSpace.suggest, so
                    conditional heads are asked only where they act) driven in this process
    bandit_search   UCB1 or Thompson over seeded samples of the space (budget / 3 arms)
A method's answer is its *incumbent*: the config with the best mean observed reward so far
(`rl.tuner.results.Incumbent`, the rule PPO's recommendation is checked against too).

Budgets count `unit="steps"` (every evaluation, the default) or `unit="configs"` (distinct
configs evaluated: what a tuning run costs when tables are cached, since a config's first
evaluation computes its per-query table for the whole split and a revisit reads it in ~1 ms).
With "configs" a method stops at its `budget`-th distinct config; revisits before that are
steps that cost nothing (at most 10 × budget steps). A bandit then plays `budget` arms, so it
stops once each arm was pulled once.
"""

from __future__ import annotations

import time
from typing import Any

import numpy as np

from rag.config import RAGConfig
from rag.errors import ConfigError
from rl.kernel.evaluator import TunerEvaluator
from rl.kernel.space import ConfigSpace, is_conversational
from rl.tuner.bandit import UCB1, Thompson
from rl.tuner.results import Incumbent, TuneResult


class _Budget:
    """Evaluates configs on fresh random batches and tracks the incumbent."""

    def __init__(self, ev: TunerEvaluator, seed: int):
        self.ev = ev
        self.space = space_of(ev)
        self.split = ev.slice.tune_split
        self.n = len(ev.data.examples(self.split))
        self.batch = min(ev.policy.episode.batch_size, self.n)
        self.rng = np.random.default_rng(seed)
        self.observed = Incumbent()
        self.configs: dict[str, RAGConfig] = {}
        self.curve: list[dict[str, Any]] = []

    def __call__(self, cfg: RAGConfig) -> float:
        idx = self.rng.choice(self.n, size=self.batch, replace=False)
        r = self.ev.evaluate(cfg, self.split, idx).reward
        h = cfg.config_hash
        self.observed.add(h, r)
        self.configs[h] = cfg
        inc = self.incumbent()
        self.curve.append({"eval": len(self.curve) + 1, "reward": r, "config_hash": h,
                           "incumbent": inc.config_hash})
        return r

    def more(self, budget: int, unit: str = "steps", max_steps: int | None = None) -> bool:
        """Whether another evaluation fits: fewer than `budget` steps (unit "steps") or distinct
        configs (unit "configs", and fewer than `max_steps` steps, default 10 × budget)."""
        if unit == "steps":
            return len(self.curve) < budget
        if unit != "configs":
            raise ValueError(f"unit: must be steps or configs, got {unit!r}")
        return len(self.observed) < budget and len(self.curve) < (max_steps or 10 * budget)

    def incumbent(self) -> RAGConfig:
        return self.configs[self.observed.best()[0]]

    def result(self, method: str, t0: float, **extra: Any) -> TuneResult:
        return TuneResult(method, self.incumbent(), len(self.curve), self.curve,
                          time.perf_counter() - t0, extra)


def space_of(ev: TunerEvaluator) -> ConfigSpace:
    """The evaluator's config space (the query formulation head acts on conversational
    data)."""
    return ConfigSpace(ev.policy, conversational=is_conversational(ev.data.dataset.examples))


def grid_search(ev: TunerEvaluator, split: str | None = None, progress=None) -> TuneResult:
    """Every config on the whole split. `extra["rewards"]` maps config hash -> reward.
    ConfigError when the space is too large to enumerate (`ConfigSpace.grid`)."""
    t0 = time.perf_counter()
    space = space_of(ev)
    split = split or ev.slice.tune_split
    rewards: dict[str, float] = {}
    configs: dict[str, RAGConfig] = {}
    observed = Incumbent()
    curve = []
    for i, cfg in enumerate(space.grid(), 1):
        rewards[cfg.config_hash] = ev.evaluate(cfg, split).reward
        configs[cfg.config_hash] = cfg
        observed.add(cfg.config_hash, rewards[cfg.config_hash])
        curve.append({"eval": i, "reward": rewards[cfg.config_hash],
                      "config_hash": cfg.config_hash, "incumbent": observed.best()[0]})
        if progress:
            progress(i)
    best = observed.best()[0]
    return TuneResult("grid", configs[best], len(rewards), curve, time.perf_counter() - t0,
                      {"rewards": rewards, "configs": configs})


def random_action(space: ConfigSpace, rng: np.random.Generator) -> RAGConfig:
    return space.sample(rng)


def random_search(ev: TunerEvaluator, budget: int, seed: int = 0,
                  unit: str = "steps") -> TuneResult:
    t0 = time.perf_counter()
    b = _Budget(ev, seed)
    rng = np.random.default_rng(seed + 1)
    while b.more(budget, unit):
        b(random_action(b.space, rng))
    return b.result("random", t0)


def optuna_search(ev: TunerEvaluator, budget: int, seed: int = 0,
                  unit: str = "steps", start: RAGConfig | None = None) -> TuneResult:
    """TPE through Ray Tune's `OptunaSearch` searcher, asked and told in this process (the
    cached evaluator lives here; Tune's trial actors would each reload the indexes).

    `start`: a config to evaluate first (TPE's `points_to_evaluate`), e.g. the one in
    production, so the search never recommends a config that scored below it on the tuning
    split; it counts against `budget` like any other. Ignored when the space cannot express
    it (its variant or prompt is not among the space's choices)."""
    import optuna
    from ray.tune.search.optuna import OptunaSearch

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    t0 = time.perf_counter()
    b = _Budget(ev, seed)
    sp = b.space
    first = _point_of(sp, start) if start is not None else None

    def define(trial: Any) -> None:  # define-by-run: the searcher reads the trial's params
        sp.suggest(trial)

    searcher = OptunaSearch(define, metric="reward", mode="max", seed=seed,
                            points_to_evaluate=[first] if first is not None else None)
    i = 0
    while b.more(budget, unit):
        tid, i = f"t{i}", i + 1
        r = b(sp.from_params(searcher.suggest(tid)))
        searcher.on_trial_complete(tid, {"reward": r})
    return b.result("optuna", t0)


def _point_of(sp: ConfigSpace, config: RAGConfig) -> dict[str, Any] | None:
    """`config` as a point of the TPE search (the heads `suggest` asks for it; nearest k),
    or None when the space has no choice for one of its values."""
    if config.variant not in sp.variants or config.prompt_id not in sp.prompts:
        return None
    try:
        return sp.to_params(config)
    except (ConfigError, ValueError):
        return None


def bandit_search(ev: TunerEvaluator, budget: int, seed: int = 0, kind: str = "ucb",
                  arms_per_pull: float = 1 / 3, unit: str = "steps") -> TuneResult:
    """A bandit needs several pulls per arm, so it plays seeded distinct samples of the space
    (`ConfigSpace.sample`; budget × `arms_per_pull` arms, at least 2, at most the space's
    size; with unit "configs", `budget` arms: pulls after the first of each arm are
    revisits)."""
    t0 = time.perf_counter()
    b = _Budget(ev, seed)
    rng = np.random.default_rng(seed + 2)
    n_arms = max(2, min(b.space.size(),
                        budget if unit == "configs" else int(budget * arms_per_pull)))
    arms: dict[str, RAGConfig] = {}
    for _ in range(100 * n_arms):  # a small space may need many draws to find every config
        if len(arms) >= n_arms:
            break
        c = b.space.sample(rng)
        arms.setdefault(c.config_hash, c)
    pick = list(arms.values())
    # always include the static default: a bandit deployed in practice starts from it
    if b.space.base.config_hash not in {c.config_hash for c in pick}:
        pick[0] = b.space.base
    by_hash = {c.config_hash: c for c in pick}
    bandit = UCB1(list(by_hash), c=0.5) if kind == "ucb" else Thompson(
        list(by_hash), prior_mean=0.5, prior_sd=0.3, noise_sd=0.05)
    while b.more(budget, unit):
        arm = bandit.select(rng)
        bandit.update(arm, b(by_hash[arm]))
    return b.result(f"bandit-{kind}", t0, arms=n_arms)
