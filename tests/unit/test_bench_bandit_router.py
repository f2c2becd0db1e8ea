"""bench/bandit_router.py's stream on a planted quality matrix (no evaluation runs): the Serve
app's bandit router, fed each served arm's quality, ends up serving each category's best arm."""

from __future__ import annotations

import numpy as np
import pytest
from bench.bandit_router import run_stream


@pytest.mark.parametrize("algorithm", ["ucb1", "thompson"])
def test_the_router_learns_each_categorys_best_arm_from_feedback(algorithm):
    rng = np.random.default_rng(0)
    n = 200
    cats = ["a" if i % 2 else "b" for i in range(n)]
    # arm 1 is best in category a, arm 2 in b; arm 0 (the stable default) is mediocre
    Q = np.full((n, 3), 0.5) + rng.normal(0, 0.05, size=(n, 3))
    Q[[i for i in range(n) if cats[i] == "a"], 1] += 0.3
    Q[[i for i in range(n) if cats[i] == "b"], 2] += 0.3
    Q = Q.clip(0, 1)
    order = rng.integers(0, n, size=1500)
    served = run_stream(Q, cats, ["stable", "x", "y"], algorithm, order, seed=1)
    last = slice(-300, None)
    want = np.array([1 if cats[q] == "a" else 2 for q in order])
    assert served.shape == order.shape
    assert (served[last] == want[last]).mean() > 0.85  # UCB1 (c = √2) still explores ~10%
    assert (served[:30] != want[:30]).any()  # it explored before it knew
