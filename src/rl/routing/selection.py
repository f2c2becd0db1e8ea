"""Model selection of the per-query PPO policy on valid (`rl.routing.ppo_policy`,
`rl.routing.warm_start`, `rl.routing.train_ppo`): one rule for checkpoints, warm starts and
settings, and the evidence a checkpoint needs to replace the incumbent."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

EVIDENCE_RESAMPLES = 2000
"""Bootstrap resamples of `has_evidence` (seed 0: the same answer on every run)."""


def better_on_valid(rec: dict, best: dict | None, cap: float) -> bool:
    """Model selection's rule: is candidate `rec` ({"valid_reward", "valid_cost"}) better than
    `best`? Feasible (valid cost <= `cap`) beats infeasible; among feasible the higher valid
    reward wins (ties keep `best`, the earlier one); among infeasible the lower cost."""
    if best is None:
        return True
    feas, bfeas = rec["valid_cost"] <= cap, best["valid_cost"] <= cap
    if feas != bfeas:
        return feas
    if not feas:
        return rec["valid_cost"] < best["valid_cost"]
    return rec["valid_reward"] > best["valid_reward"]


def has_evidence(candidate: Sequence[float], incumbent: Sequence[float]) -> bool:
    """Is `candidate` better than `incumbent` on the same valid queries (per-query rewards,
    in the same order) with evidence: the paired bootstrap 95% CI of the mean difference is
    above 0 (the promotion gate's rule, `rl.stats.bootstrap.paired_bootstrap`)?"""
    from rl.stats.bootstrap import paired_bootstrap

    a, b = np.asarray(incumbent, dtype=float), np.asarray(candidate, dtype=float)
    if a.shape != b.shape:
        raise ValueError(f"per-query rewards of different queries: {a.shape} vs {b.shape}")
    return paired_bootstrap(a, b, n_resamples=EVIDENCE_RESAMPLES, seed=0).ci_low > 0


def replaces(rec: dict, best: dict | None, cap: float, rewards: Sequence[float] | None = None,
             best_rewards: Sequence[float] | None = None, rule: str = "mean") -> bool:
    """Does checkpoint `rec` replace the incumbent `best`? `rule` "mean": `better_on_valid`.
    "evidence": as "mean", but where both are feasible the candidate must also beat the
    incumbent with evidence (`has_evidence` over their per-query valid rewards): many noisy
    checkpoints are compared on few valid queries, and one that is better by chance would
    otherwise replace a start that generalises (docs/policy.md)."""
    if not better_on_valid(rec, best, cap):
        return False
    if rule == "mean" or best is None or best["valid_cost"] > cap:
        return True
    if rule != "evidence":
        raise ValueError(f"unknown selection rule {rule!r} (mean, evidence)")
    if rewards is None or best_rewards is None:
        raise ValueError("the evidence rule needs both per-query valid rewards")
    return has_evidence(rewards, best_rewards)
