"""The learned per-query policy behind the drift benchmark's `router-policy` systems.

`fit_learned_policy(kind, bundle, seed)` fits it from the bundle's train split and selects
it on valid; it never reads the test split (the streams draw from test only). It returns a
`LearnedPolicy`: `act(X)` the frozen choice per query, `scores(X)` (n, K) predicted reward
per arm in reward units (what `router-policy-online` corrects online), `describe` the
implementation (in `meta.notes.router_policy`).

Kinds: `router` (the only one): the supervised router (`rl.policy.router.select_router`,
per-arm gradient boosting, parameters chosen by realised valid reward), the per-query policy
the product ships as default (`bench/results/policy.json`). Issue 19's per-query PPO
(`rl.policy.ppo_policy`) acts on the whole config space, not on this portfolio's arms, so it
is not a kind here: `bench/drift_ppo.py` trains it and scores its own choices per query.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

ROUTER_GRID = None
"""The router's parameter grid (None: `rl.policy.router.PARAM_GRID`; tests shrink it)."""


@dataclass
class LearnedPolicy:
    act: Callable[[np.ndarray], np.ndarray]
    scores: Callable[[np.ndarray], np.ndarray]
    describe: str
    router: Any = None
    """The fitted `rl.policy.router.Router` behind `act` (the PPO policy's warm starts)."""


def fit_router(X_train: np.ndarray, R_train: np.ndarray, T_train: np.ndarray,
               X_valid: np.ndarray, R_valid: np.ndarray, arms: np.ndarray | None,
               seed: int) -> LearnedPolicy:
    """The supervised router fitted on train, selected on valid (no token price: it
    maximises the per-query reward, which already charges tokens)."""
    from rl.policy.router import PARAM_GRID, select_router

    router, sel = select_router(X_train, R_train, X_valid, R_valid, T_train,
                                grid=ROUTER_GRID or PARAM_GRID, seed=seed, arms=arms)
    p = sel.tried[sel.best]
    desc = (f"supervised router (rl.policy.router.select_router; chosen on valid: max_iter "
            f"{p['max_iter']}, leaves {p['max_leaf_nodes']}, shrink {p['shrink']}, pooled "
            f"{p['pooled']}; valid reward {p['valid_reward']:.4f})")
    return LearnedPolicy(lambda X: router.choose(X, 0.0), router.predict, desc, router)


def fit_learned_policy(kind: str, bundle, seed: int) -> LearnedPolicy:
    """The policy of `kind` (module docstring) from `bundle`'s train and valid roles only."""
    args = (bundle.X["train"], bundle.R["train"], bundle.T["train"], bundle.X["valid"],
            bundle.R["valid"], bundle.arm_descriptors, seed)
    if kind != "router":
        raise ValueError(f"unknown learned policy {kind!r} (known: router)")
    return fit_router(*args)
