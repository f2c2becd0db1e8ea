"""`ppo_verdict`: `ragpilot router train --learner ppo` recommends PPO only where it earns its
place over the router it defers to (the shipped default), and says why with the deltas."""

import pytest

from rl.routing.train_ppo import ppo_verdict


def _rows(ppo_router, ppo_static, router_static):
    """delta_reward rows from (value, ci_low, ci_high) triples."""
    out = []
    for system, (v, lo, hi) in (("ppo-policy - supervised-router-equal-cost", ppo_router),
                                ("ppo-policy - best-static", ppo_static),
                                ("supervised-router-equal-cost - best-static", router_static)):
        out.append({"dataset": "d", "system": system, "metric": "delta_reward", "value": v,
                    "ci_low": lo, "ci_high": hi, "n": 100})
        # a delta_quality row of the same system must not be read as the reward's
        out.append({"dataset": "d", "system": system, "metric": "delta_quality", "value": -v,
                    "ci_low": -hi, "ci_high": -lo, "n": 100})
    return out


SIG, ZERO, NEG = (0.05, 0.02, 0.08), (0.0, 0.0, 0.0), (-0.03, -0.05, -0.01)
NOISE = (0.01, -0.01, 0.03)


@pytest.mark.parametrize("ppo_router, ppo_static, router_static, want, said", [
    # the router significantly ahead: it, whatever else holds
    (NEG, SIG, SIG, "supervised-router", "it is ahead of the PPO policy (PPO − router -0.0300"),
    # PPO significantly ahead of both
    (SIG, SIG, NOISE, "ppo-policy", "ahead of the router (PPO − router +0.0500"),
    # PPO = the router (MTRAG's kept PPO was its defer start): the simpler policy
    (ZERO, SIG, SIG, "supervised-router", "PPO adds nothing significant over it"),
    # PPO ahead of best static where the router is not
    (NOISE, SIG, NOISE, "ppo-policy", "and the router's does not (router − best static"),
    # neither shown ahead of best static
    (NOISE, NOISE, NOISE, "best-static", "PPO − best static +0.0100 [-0.0100, +0.0300]"),
])
def test_the_verdict_follows_the_cis(ppo_router, ppo_static, router_static, want, said):
    verdict, reason = ppo_verdict(_rows(ppo_router, ppo_static, router_static))
    assert verdict == want and said in reason


def test_a_missing_comparison_is_an_error_not_a_default():
    rows = [r for r in _rows(ZERO, SIG, SIG)
            if r["system"] != "supervised-router-equal-cost - best-static"]
    with pytest.raises(ValueError, match="supervised-router-equal-cost - best-static"):
        ppo_verdict(rows)
