"""UCB1 and Thompson sampling on seeded Bernoulli arms."""

import numpy as np
import pytest

from rag.errors import ConfigError
from rl.routing.arm_bandit import UCB1, Thompson

MEANS = {"a": 0.3, "b": 0.5, "c": 0.7}


@pytest.mark.parametrize("make", [lambda: UCB1(list(MEANS)),
                                  lambda: Thompson(list(MEANS), prior_mean=0.5, prior_sd=0.5,
                                                   noise_sd=0.5)])
def test_bandit_concentrates_on_best_arm(make):
    rng = np.random.default_rng(0)
    b = make()
    for _ in range(2000):
        arm = b.select(rng)
        b.update(arm, float(rng.random() < MEANS[arm]))
    pulls = {a: b.stats[a].pulls for a in MEANS}
    assert b.best() == "c"
    assert pulls["c"] > 0.75 * 2000, pulls
    board = b.leaderboard()
    assert board[0]["arm"] == "c" and board[0]["ci_low"] < 0.7 < board[0]["ci_high"]


def test_ucb_pulls_every_arm_first_and_validates():
    b = UCB1(["x", "y", "z"])
    rng = np.random.default_rng(1)
    seen = set()
    for _ in range(3):
        arm = b.select(rng)
        seen.add(arm)
        b.update(arm, 0.5)
    assert seen == {"x", "y", "z"}
    with pytest.raises(ConfigError, match="arm"):
        b.update("nope", 1.0)
    with pytest.raises(ConfigError, match="reward"):
        b.update("x", float("nan"))
    with pytest.raises(ConfigError, match="arms"):
        UCB1(["x", "x"])
