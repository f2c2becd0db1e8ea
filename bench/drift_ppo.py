"""Issue 19's per-query PPO policy in the drift benchmark: the `ppo-policy` system, frozen.

The policy (`rl.policy.ppo_policy.PerQueryPPO`) picks any config of the space, not one of the
portfolio's arms, so it brings its own per-query rewards to the streams (`Pool.extra`,
`bench/drift_streams.py`): for every pool query, the reward of the config it picks there,
read from the tuner's lazy per-(config, query) rows (`bench.drift_data.served_rewards`).

Training is `bench/policy.py`'s, on the drift bundle's roles (`bench.policy_ppo.run_ppo`):
one policy per seed of configs/policy/ppo.yaml, trained on train under the PPO-Lagrangian
bound on best-static's mean valid tokens, behaviour-cloning warm starts (the best static arm,
the supervised router's train picks plain and held to the budget; the best on valid is where
PPO starts), the checkpoint chosen on valid. Stream seed i is served by policy i mod S.
Pools: `main` (the test split), `price<x>` (the same choices re-priced: the policy does not see
the price, so a frozen policy keeps its picks), `updated` (the regenerated synthetic world:
the policy acts on its queries' features and its picks are evaluated on the new corpus).

`ppo-policy-online` (`online_served`): the same trained policy, updated online on the stream
(`rl.policy.ppo_online.adapt_online`): it serves configs sampled from itself, observes only
the served config's reward (re-priced or on the new corpus in the phases that say so), and
runs a PPO update every `ONLINE_BATCH` requests, its cost bound the training budget.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from bench.drift_data import Bundle, PricedWorld, _roles, drift_arms, served_rewards
from bench.policy import DEFAULT_WARM, warm_starts
from bench.policy_ppo import run_ppo, with_train
from rl.policy.worlds import EvaluatorWorld

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


def settings(quick: bool):
    """configs/policy/ppo.yaml (--quick: one seed, 3 iterations of 128 queries)."""
    from rl.policy.settings import PPOPolicySettings

    s = PPOPolicySettings.load()
    return with_train(s, iters=3, batch=128, seeds=(0,), eval_every=3) if quick else s


def train(bundle: Bundle, router, ppo_settings, seed: int,
          warm: tuple[str, ...] = DEFAULT_WARM["none"]) -> TrainedPPO:
    """One policy per seed on `bundle`'s train role, selected on valid (module docstring).
    `router`: the fitted supervised router of the `router-policy` system (its train picks are
    warm starts)."""
    ev = bundle.ev
    configs, _ = drift_arms(ev, ev.policy)
    if [n for n, _ in configs] != bundle.names:
        raise ValueError("the bundle's arms are not the drift arms (`drift_arms`)")
    parts = _roles(ev.data, seed)
    Rv, Tv = bundle.R["valid"], bundle.T["valid"]
    base = int(np.argmax(Rv.mean(axis=0)))
    budget = float(Tv[:, base].mean())
    price = router.fit_token_price(bundle.X["valid"], Tv, budget)
    starts = warm_starts(warm, configs, base, Rv, Tv, budget, {
        "supervised-router": router.choose(bundle.X["train"], 0.0),
        "supervised-router-equal-cost": router.choose(bundle.X["train"], price)})
    kept: list[Any] = []
    _, details = run_ppo(ev, parts, bundle.X, budget, ppo_settings,
                         list(ppo_settings.train.seeds), warm=starts, keep=kept)
    s = ppo_settings.train
    desc = (f"rl.policy.ppo_policy.PerQueryPPO, {len(kept)} seeds x {s.iters} iterations x "
            f"{s.batch} queries on train ({bundle.R['train'].shape[0]}), checkpoint chosen on "
            f"valid; token budget {budget:.0f} (best static `{bundle.names[base]}` on valid); "
            f"warm starts {', '.join(w.name for w in starts) or 'none'}; kept starts: "
            + ", ".join(f"seed {p['seed']}: {p['warm_start']}" for p in details["per_seed"]))
    return TrainedPPO(kept, details, desc)


def pool_rewards(trained: TrainedPPO, bundle: Bundle, factor: float = 1.0) -> np.ndarray:
    """(n_test, S): each policy's greedy pick on every test query of `bundle`, its reward
    with the token price times `factor`."""
    cols = [served_rewards(bundle.ev, "test", pol.act(bundle.X["test"]), factor)
            for pol in trained.policies]
    return np.column_stack(cols)


def distinct_configs(trained: TrainedPPO, bundle: Bundle) -> list[int]:
    """How many distinct configs each policy picks over `bundle`'s test queries."""
    return [len({c.config_hash for c in pol.act(bundle.X["test"])})
            for pol in trained.policies]


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
    from rl.policy.ppo_online import adapt_online

    def world(pool: str, idx) -> EvaluatorWorld:
        if pool == "updated" and updated is not None:
            return EvaluatorWorld(updated.ev, "test", idx)
        if pool == "main" or pool_price(pool) is not None:
            return PricedWorld(bundle.ev, "test", idx, pool_price(pool) or 1.0)
        raise KeyError(pool)

    budget = trained.details["budget_tokens"] / float(bundle.ev.policy.cost_ref_tokens)

    def served(real, i: int) -> np.ndarray:
        pol = trained.policies[i % len(trained.policies)]
        return adapt_online(pol, StreamWorld(real.draws, world), real.X, budget, ONLINE_BATCH, seed=i).reward

    return served
