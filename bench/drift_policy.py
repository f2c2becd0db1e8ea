"""The learned per-query policy behind the drift benchmark's `ppo-policy` systems.

`fit_learned_policy(kind, bundle, seed)` fits it from the bundle's train split and selects
it on valid; it never reads the test split (the streams draw from test only). It returns a
`LearnedPolicy`: `act(X)` the frozen choice per query, `scores(X)` (n, K) predicted reward
per arm in reward units (what `ppo-policy-online` corrects online), `describe` the
implementation (in `meta.notes.ppo_policy`).

Kinds: `router`: the supervised router (`rl.policy.router.select_router`, per-arm gradient
boosting, parameters chosen by realised valid reward); `ppo`: helper A's per-query PPO
(`rl.policy.ppo_policy.PerQueryPPO`): the integration point is `_fit_ppo`; `auto`: ppo when
that module imports, else the router.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

ROUTER_GRID = None
"""The router's parameter grid (None: `rl.policy.router.PARAM_GRID`; tests shrink it)."""


@dataclass
class LearnedPolicy:
    act: Callable[[np.ndarray], np.ndarray]
    scores: Callable[[np.ndarray], np.ndarray]
    describe: str


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
    return LearnedPolicy(lambda X: router.choose(X, 0.0), router.predict, desc)


def _fit_ppo(X_train, R_train, T_train, X_valid, R_valid, arms, seed) -> LearnedPolicy:
    """Helper A's per-query PPO. Assumed API (the lead wires the final one): a
    `PerQueryPPO(...).fit(X_train, R_train, X_valid, R_valid)` returning a
    `rl.policy.base.PerQueryPolicy` (`act`, `probs`); per-arm scores from its `predict` when
    it has one, else the train mean of each arm plus the reward spread × its probability (a
    prior the online correction can overrule)."""
    from rl.policy.ppo_policy import PerQueryPPO

    pol = PerQueryPPO(n_arms=R_train.shape[1], seed=seed).fit(X_train, R_train, X_valid,
                                                               R_valid)
    if hasattr(pol, "predict"):
        scores = pol.predict
    else:
        base, spread = R_train.mean(axis=0), float(R_train.max() - R_train.min())

        def scores(X):
            return base[None, :] + spread * np.asarray(pol.probs(X))
    return LearnedPolicy(lambda X: np.asarray(pol.act(X), dtype=np.int64), scores,
                         "per-query PPO (rl.policy.ppo_policy.PerQueryPPO)")


def ppo_available() -> bool:
    try:
        import rl.policy.ppo_policy  # noqa: F401
    except ImportError:
        return False
    return True


def fit_learned_policy(kind: str, bundle, seed: int) -> LearnedPolicy:
    """The policy of `kind` (module docstring) from `bundle`'s train and valid roles only."""
    args = (bundle.X["train"], bundle.R["train"], bundle.T["train"], bundle.X["valid"],
            bundle.R["valid"], bundle.arm_descriptors, seed)
    if kind == "ppo":
        return _fit_ppo(*args)
    if kind == "auto" and ppo_available():
        try:
            return _fit_ppo(*args)
        except (TypeError, AttributeError) as e:  # its API is not the assumed one yet
            pol = fit_router(*args)
            pol.describe += f"; rl.policy.ppo_policy imports but could not be fitted ({e})"
            return pol
    return fit_router(*args)
