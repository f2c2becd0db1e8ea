"""The learned per-query policy behind the drift benchmark's `router-policy` systems.

`fit_learned_policy(kind, bundle, seed)` fits it from the bundle's train split and selects
it by cross-validation over train; it never reads the test split (the streams draw from test only). It returns a
`LearnedPolicy`: `act(X)` the frozen choice per query, `scores(X)` (n, K) predicted reward
per arm in reward units (what `router-policy-online` corrects online), `describe` the
implementation (in `meta.notes.router_policy`).

Kinds: `router` (the only one): the supervised router (`rl.routing.router.select_router_cv`,
per-arm gradient boosting, parameters chosen by grouped cross-validation over train (margin
0: plain argmax, `CV_MARGINS`), so valid stays out of sample for what reads it), the
per-query policy the product ships as default (`bench/results/policy.json`). Issue 19's
per-query PPO (`rl.routing.ppo_policy`) acts on the whole config space, not on this
portfolio's arms, so it is not a kind here: `bench/drift_ppo.py` trains it and scores its own
choices per query.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from rl.routing.router import CV_FOLDS

ROUTER_GRID = None
"""The router's parameter grid (None: `rl.routing.router.PARAM_GRID`; tests shrink it)."""


@dataclass
class LearnedPolicy:
    act: Callable[[np.ndarray], np.ndarray]
    scores: Callable[[np.ndarray], np.ndarray]
    describe: str
    router: Any = None
    """The fitted `rl.routing.router.SupervisedRouter` behind `act` (the PPO policy's warm starts)."""


def fit_router(X_train: np.ndarray, R_train: np.ndarray, T_train: np.ndarray,
               X_valid: np.ndarray, R_valid: np.ndarray, arms: np.ndarray | None,
               seed: int, groups: list[str] | None = None) -> LearnedPolicy:
    """The supervised router chosen by grouped cross-validation over train and refitted on
    it (`select_router_cv`: parameters, margin 0 over train's best static arm; no token
    price: it maximises the per-query reward, which already charges tokens). Valid
    stays unread here: frozen-static is chosen on it, `router-policy-online` calibrates
    against the router's valid residuals and the PPO policy selects on it, and all three
    need the router never to have fitted it. `X_valid` / `R_valid` give the description its
    valid reward."""
    from rl.routing.router import PARAM_GRID, select_router_cv
    from rl.stats.headroom import pick

    router, sel = select_router_cv(X_train, R_train, T_train, groups,
                                   grid=ROUTER_GRID or PARAM_GRID, seed=seed, arms=arms)
    p = sel.tried[sel.best]
    valid = float(pick(R_valid, router.choose(X_valid, 0.0)).mean())
    desc = (f"supervised router (rl.routing.router.select_router_cv; chosen by "
            f"{CV_FOLDS}-fold CV over train: max_iter {p['max_iter']}, leaves "
            f"{p['max_leaf_nodes']}, shrink {p['shrink']}, pooled {p['pooled']}, margin "
            f"{p['margin']:g}; CV reward {p['cv_reward']:.4f}, valid reward {valid:.4f})")
    return LearnedPolicy(lambda X: router.choose(X, 0.0), router.predict, desc, router)


def fit_learned_policy(kind: str, bundle, seed: int) -> LearnedPolicy:
    """The policy of `kind` (module docstring) from `bundle`'s train and valid roles only."""
    args = (bundle.X["train"], bundle.R["train"], bundle.T["train"], bundle.X["valid"],
            bundle.R["valid"], bundle.arm_descriptors, seed)
    if kind != "router":
        raise ValueError(f"unknown learned policy {kind!r} (known: router)")
    return fit_router(*args, groups=train_groups(bundle))


def train_groups(bundle) -> list[str]:
    """Each train query's group for grouped folds: its conversation (`Bundle.conversations`),
    the query's own id when the bundle carries none."""
    return [str(g) for g in bundle.conversations.get("train", bundle.ids["train"])]
