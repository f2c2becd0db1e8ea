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
Pools: `main` (the test split), `price2` (the same choices re-priced: the policy does not see
the price, so a frozen policy keeps its picks), `updated` (the regenerated synthetic world:
the policy acts on its queries' features and its picks are evaluated on the new corpus).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from bench.drift_data import Bundle, _roles, served_rewards
from bench.headroom import portfolio
from bench.policy import WARM_STARTS, warm_starts
from bench.policy_ppo import run_ppo, with_train

SYSTEM = "ppo-policy"


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
          warm: tuple[str, ...] = WARM_STARTS) -> TrainedPPO:
    """One policy per seed on `bundle`'s train role, selected on valid (module docstring).
    `router`: the fitted supervised router of the `router-policy` system (its train picks are
    warm starts)."""
    ev = bundle.ev
    configs = portfolio(ev.policy)
    if [n for n, _ in configs] != bundle.names:
        raise ValueError("the bundle's arms are not the headroom portfolio")
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
