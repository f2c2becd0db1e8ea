"""bench/serve_load.py's canary-share statistics (`user_share_stats`): CIs over users, whose
requests share one sticky route, and the per-replica difference reported signed, so two
replicas that route alike get a CI containing 0 (the old bootstrap of |difference| could not
reach 0) and two that route differently do not. Synthetic logs, no Serve."""

from __future__ import annotations

import numpy as np
from bench.serve_load import user_share_stats


def _log(n_users: int, canary: float, seed: int, second_replica_canary: float | None = None):
    """Each user sends 2 requests; the proxy sends each request to replica 0 or 1 at random.
    A user is on the canary with probability `canary` (a fixed per-user draw, as a hash
    is); with `second_replica_canary`, replica 1 routes by its own, different split."""
    rng = np.random.default_rng(seed)
    user = np.repeat(np.arange(n_users), 2)
    replica = rng.integers(0, 2, user.size)
    draw = rng.random(n_users)[user]
    on = (draw < canary).astype(float)
    if second_replica_canary is not None:
        on = np.where(replica == 1, draw < second_replica_canary, on).astype(float)
    return user, replica, on


def test_replicas_that_route_alike_get_a_signed_ci_around_zero():
    user, replica, on = _log(2000, 0.10, seed=0)
    st = user_share_stats(user, replica, on, seed=0)
    value, lo, hi = st["diff"]
    assert lo < 0.0 < hi and lo < value < hi
    a, b = on[replica == 0].mean(), on[replica == 1].mean()
    assert value == (a - b) * 100
    assert st["abs_diff"] == (abs(value), 0.0, max(-lo, hi))
    share, s_lo, s_hi = st["share"]
    assert share == on.mean() * 100 and s_lo < 10.0 < s_hi


def test_replicas_that_route_differently_are_told_apart():
    user, replica, on = _log(2000, 0.10, seed=3, second_replica_canary=0.20)
    value, lo, hi = user_share_stats(user, replica, on, seed=0)["diff"]
    assert hi < 0.0 and lo < value < hi and -14.0 < value < -6.0
    _, abs_lo, abs_hi = user_share_stats(user, replica, on, seed=0)["abs_diff"]
    assert abs_lo == -hi > 0.0 and abs_hi == -lo


def test_users_not_requests_are_resampled():
    # a user's two requests share one route: the share's CI is wider than a bootstrap that
    # treats the 4,000 requests as independent (about sqrt(2) for two requests per user)
    user, replica, on = _log(2000, 0.10, seed=5)
    _, lo, hi = user_share_stats(user, replica, on, seed=1)["share"]
    rng = np.random.default_rng(1)
    naive = [on[rng.integers(0, on.size, on.size)].mean() * 100 for _ in range(2000)]
    n_lo, n_hi = np.quantile(naive, [0.025, 0.975])
    assert 1.2 < (hi - lo) / (n_hi - n_lo) < 1.7
