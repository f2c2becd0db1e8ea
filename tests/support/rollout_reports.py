"""Batch reports for driving a rollout through the admin API in tests."""

from __future__ import annotations

import numpy as np

from rl.promotion.metrics import MetricStats

GATES = {"faithfulness": True, "relevancy": True, "p95_latency_ms": True}


def clean_batch(kind: str, n_c: int, n_s: int, batch: int = 0) -> dict:
    """A clean batch whose candidate is far better than stable: per metric (quality, tokens,
    latency, errors) the batch's statistics, paired except in canaries; `batch` makes each
    batch its own (the same report submitted twice counts once)."""
    rng = np.random.default_rng(batch)
    q = rng.uniform(0, 1, n_s)
    tok = rng.normal(200, 20, n_s)
    lat = rng.normal(50, 5, n_s)
    if kind == "canary":
        stats = {"tokens": MetricStats.of_arms(tok, tok[:n_c] - 40),
                 "latency_ms": MetricStats.of_arms(lat, lat[:n_c]),
                 "error_rate": MetricStats.of_arms(np.zeros(n_s), np.zeros(n_c))}
    else:
        stats = {"quality": MetricStats.of_pairs(q, q + 0.05),
                 "tokens": MetricStats.of_pairs(tok, tok - 40),
                 "latency_ms": MetricStats.of_pairs(lat, lat),
                 "error_rate": MetricStats.of_pairs(np.zeros(n_s), np.zeros(n_s))}
    return {"kind": kind, "paired": kind != "canary", "diff": 0.05, "diff_se": 0.001,
            "diff_sd": 0.02, "ci_low": 0.048, "ci_high": 0.052, "gates": GATES,
            "candidate": {"n": n_c, "reward": 0.65, "reward_sd": 0.05, "errors": 0, "slow": 0},
            "stable": {"n": n_s, "reward": 0.6, "reward_sd": 0.05},
            "metrics": {k: v.to_dict() for k, v in stats.items()}}
