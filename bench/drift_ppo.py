"""Issue 19's per-query PPO policy in the drift benchmark: the `ppo-policy` system, frozen.

The policy (`rl.routing.ppo_policy.PerQueryPPO`) picks any config of the space, not one of the
portfolio's arms, so it brings its own per-query rewards to the streams (`Pool.extra`,
`bench/drift_streams.py`): for every pool query, the reward of the config it picks there,
read from the tuner's lazy per-(config, query) rows (`bench.drift_data.served_rewards`).

Training is `bench/policy.py`'s, on the drift bundle's roles (`bench.policy_ppo.run_ppo`):
one policy per seed of configs/routing/ppo.yaml, trained on train under the PPO-Lagrangian
bound on best-static's mean valid tokens, the checkpoint chosen on valid. By default it is
bench/policy.py's design, a residual policy over the supervised router (`base="router"`): a
`defer` head hands a query to the `router-policy` system's router held to the budget, and the
router's view of the query joins the observation (out of fold on train, where the router was
fitted); warm starts: defer everywhere (its own heads cloned to the router's picks) and the
best static arm, the better on valid kept. `base="none"` (`bench/drift.py --ppo-base none`)
is PPO alone on the query features, warm-started from the best static arm and the router's
train picks (plain and held to the budget). Stream seed i is served by policy i mod S.
Pools: `main` (the test split), `price<x>` (the same choices re-priced: the policy does not see
the price, so a frozen policy keeps its picks), `updated` (the regenerated synthetic world:
the policy acts on its queries' features and its picks are evaluated on the new corpus).

`ppo-policy-online` (`online_served`): the same trained policy, updated online on the stream
(`rl.routing.ppo_online.adapt_online`): it serves configs sampled from itself, observes only
the served config's reward (re-priced or on the new corpus in the phases that say so), and
runs a PPO update every `ONLINE_BATCH` requests, its cost bound the training budget.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from bench.drift_data import Bundle, PricedWorld, _roles, drift_arms, served_rewards
from bench.drift_policy import train_groups
from bench.policy import DEFAULT_WARM, warm_starts
from bench.policy_ppo import run_ppo, with_heads, with_train
from rl.routing.ppo_serving import ResidualBase
from rl.routing.router import STACK_FOLDS, stacked
from rl.routing.worlds import EvaluatorWorld

SYSTEM = "ppo-policy"
ONLINE = "ppo-policy-online"
ONLINE_BATCH = 64
"""Requests between two online PPO updates (a 2 x 300 stream: 9 updates)."""


@dataclass
class TrainedPPO:
    """The per-seed policies of one dataset and how they were made."""

    policies: list[Any]
    details: dict[str, Any]
    describe: str
    rewards: dict[str, np.ndarray] = field(default_factory=dict)
    """Pool name -> (n, S) per-query rewards (filled by `pool_rewards`)."""
    view: Callable[[np.ndarray], tuple[np.ndarray, list]] | None = None
    """Raw query features -> (observation rows, base config per row) of a residual policy;
    None: the policy acts on the raw features alone."""


def settings(quick: bool):
    """configs/routing/ppo.yaml (--quick: one seed, 3 iterations of 128 queries)."""
    from rl.routing.settings import PPOPolicySettings

    s = PPOPolicySettings.load()
    return with_train(s, iters=3, batch=128, seeds=(0,), eval_every=3) if quick else s


def train(bundle: Bundle, router, ppo_settings, seed: int, base: str = "router",
          warm: tuple[str, ...] | None = None) -> TrainedPPO:
    """One policy per seed on `bundle`'s train role, selected on valid (module docstring).
    `router`: the fitted supervised router of the `router-policy` system (fitted on train
    only). `base`: "router" (bench/policy.py's default design, a residual policy over that
    router held to the budget) or "none" (PPO alone on the query features); `warm`: the warm
    starts (None: bench/policy.py's defaults for `base`)."""
    ev = bundle.ev
    configs, _ = drift_arms(ev, ev.policy)
    if [n for n, _ in configs] != bundle.names:
        raise ValueError("the bundle's arms are not the drift arms (`drift_arms`)")
    if base not in DEFAULT_WARM:
        raise ValueError(f"base {base!r}: one of {', '.join(DEFAULT_WARM)}")
    parts = _roles(ev.data, seed)
    Rv, Tv = bundle.R["valid"], bundle.T["valid"]
    static = int(np.argmax(Rv.mean(axis=0)))
    budget = float(Tv[:, static].mean())
    price = router.fit_token_price(bundle.X["valid"], Tv, budget)
    picks = {"supervised-router": router.choose(bundle.X["train"], 0.0),
             "supervised-router-equal-cost": router.choose(bundle.X["train"], price)}
    X, bases, settings, view = bundle.X, None, ppo_settings, None
    if base == "router":
        # the router was fitted on train alone: its view is out of fold there, its own on
        # valid and on every pool the streams draw
        M = {"train": {"R": bundle.R["train"], "T": bundle.T["train"]}}
        X, base_arms = stacked(router, price, static, bundle.X, M,
                               {"train": train_groups(bundle)}, [c for _, c in configs], seed)
        bases = {role: [configs[j][1] for j in a] for role, a in base_arms.items()}
        picks["defer-to-router"] = base_arms["train"]
        settings = with_heads(ppo_settings, defer=True)
        view = ResidualBase(router, [c for _, c in configs], price, static).observe

    starts = warm_starts(DEFAULT_WARM[base] if warm is None else warm, configs, static, Rv,
                         Tv, budget, picks)
    kept: list[Any] = []
    _, details = run_ppo(ev, parts, X, budget, settings, list(settings.train.seeds),
                         warm=starts, keep=kept, base=bases)
    s = ppo_settings.train
    desc = (f"rl.routing.ppo_policy.PerQueryPPO, {len(kept)} seeds x {s.iters} iterations x "
            f"{s.batch} queries on train ({bundle.R['train'].shape[0]}), checkpoint chosen on "
            f"valid; token budget {budget:.0f} (best static `{bundle.names[static]}` on valid); "
            f"warm starts {', '.join(w.name for w in starts) or 'none'}; kept starts: "
            + ", ".join(f"seed {p['seed']}: {p['warm_start']}" for p in details["per_seed"]))
    if base == "router":
        deferred = [f"{100 * p['test_deferred']:.0f}%" for p in details["per_seed"]]
        desc += (f"; residual over `router-policy` held to the budget (token price "
                 f"{price:.2e}; a `defer` head hands it the query; its out-of-fold view of each "
                 f"train query joins the observation): test queries deferred per seed "
                 f"{', '.join(deferred)}")
        details["base"] = {"policy": "router-policy held to the budget", "token_price": price,
                           "oof_folds": STACK_FOLDS}
    return TrainedPPO(kept, details, desc, view=view)


def observe(trained: TrainedPPO, X: np.ndarray) -> tuple[np.ndarray, list | None]:
    """What the policies act on for raw query features `X`: the observation rows and the
    base policy's config per row (None without a base)."""
    return (X, None) if trained.view is None else trained.view(X)


def pool_rewards(trained: TrainedPPO, bundle: Bundle, factor: float = 1.0) -> np.ndarray:
    """(n_test, S): each policy's greedy pick on every test query of `bundle`, its reward
    with the token price times `factor`."""
    X, base = observe(trained, bundle.X["test"])
    cols = [served_rewards(bundle.ev, "test", pol.act(X, base), factor)
            for pol in trained.policies]
    return np.column_stack(cols)


def distinct_configs(trained: TrainedPPO, bundle: Bundle) -> list[int]:
    """How many distinct configs each policy picks over `bundle`'s test queries."""
    X, base = observe(trained, bundle.X["test"])
    return [len({c.config_hash for c in pol.act(X, base)}) for pol in trained.policies]


class StreamWorld:
    """A realised stream as one `QueryWorld`: step t is query draws[p][j] of phase p's pool
    (`world(pool, idx)` builds that pool's world over the given query indices)."""

    def __init__(self, draws, world):
        self.parts, self.offsets = [], []
        n = 0
        for pool, idx in draws:
            self.parts.append(world(pool, idx))
            self.offsets.append(n)
            n += len(idx)
        self.n = n
        self.cost_ref = self.parts[0].cost_ref

    def _part(self, i: int):
        p = int(np.searchsorted(self.offsets, i, side="right")) - 1
        return self.parts[p], i - self.offsets[p]

    def outcome(self, i, config):
        w, j = self._part(int(i))
        return w.outcome(j, config)

    def outcomes(self, configs):
        return [self.outcome(i, c) for i, c in enumerate(configs)]


def online_served(trained: TrainedPPO, bundle: Bundle, updated: Bundle | None,
                  pool_price):
    """real, i -> (N,) served rewards of `ppo-policy-online` on realised stream `real` (stream
    seed index i: policy i mod S, RLlib seed i). `pool_price(name)`: a pool's token price
    factor (None: not a re-priced pool)."""
    from rl.routing.ppo_online import adapt_online

    def world(pool: str, idx) -> EvaluatorWorld:
        if pool == "updated" and updated is not None:
            return EvaluatorWorld(updated.ev, "test", idx)
        if pool == "main" or pool_price(pool) is not None:
            return PricedWorld(bundle.ev, "test", idx, pool_price(pool) or 1.0)
        raise KeyError(pool)

    budget = trained.details["budget_tokens"] / float(bundle.ev.policy.cost_ref_tokens)

    def served(real, i: int) -> np.ndarray:
        pol = trained.policies[i % len(trained.policies)]
        X, base = observe(trained, real.X)
        return adapt_online(pol, StreamWorld(real.draws, world), X, budget, ONLINE_BATCH,
                            seed=i, base=base).reward

    return served
