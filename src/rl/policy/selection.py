"""Model selection of the per-query PPO policy on valid (`rl.policy.ppo_policy`,
`rl.policy.warm_start`, `bench/policy_ppo.py`): one rule for checkpoints, warm starts and
settings."""

from __future__ import annotations


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
