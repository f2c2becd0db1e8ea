"""bench/policy.py's comparison rows on toy matrices (no evaluation runs)."""

from __future__ import annotations

import numpy as np
import pytest
from bench.policy import _delta_rows


def _rows(ch):
    R = np.array([[0.5, 1.0], [0.5, 0.0], [0.5, 1.0], [0.5, 0.0]])
    M = {"R": R, "Q": R + 0.1, "T": np.tile([100.0, 150.0], (4, 1))}
    oracle = np.argmax(R, axis=1)
    return {(r["system"], r["metric"]): r for r in _delta_rows("toy", "x", M, np.asarray(ch), 0,
                                                                oracle, seed=0)}


def test_a_system_that_matches_the_oracle_captures_all_headroom():
    rows = _rows([1, 0, 1, 0])
    assert rows[("x", "headroom_captured")]["value"] == pytest.approx(1.0)
    assert rows[("x - best-static", "delta_reward")]["value"] == pytest.approx(0.25)
    assert rows[("x - best-static", "delta_quality")]["value"] == pytest.approx(0.25)
    # two of four queries move to the 150-token arm: +25% mean tokens
    assert rows[("x - best-static", "delta_cost_pct")]["value"] == pytest.approx(25.0)


def test_the_static_choice_captures_nothing():
    rows = _rows([0, 0, 0, 0])
    r = rows[("x", "headroom_captured")]
    assert r["value"] == 0.0 and r["ci_low"] == 0.0 and r["ci_high"] == 0.0
    assert rows[("x - best-static", "delta_cost_pct")]["value"] == 0.0
