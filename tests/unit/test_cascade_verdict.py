"""The cascade's verdict in the objective's two terms (rl.routing.train.cascade_verdict)."""

import pytest

from rl.routing.train import cascade_verdict


def _rows(q, c):
    """Holdout rows of 'cascade - best-static': delta_quality and delta_cost_pct (value, lo, hi)."""
    return [{"system": "cascade - best-static", "metric": m, "value": v, "ci_low": lo,
             "ci_high": hi, "n": 100} for m, (v, lo, hi) in
            (("delta_quality", q), ("delta_cost_pct", c))]


@pytest.mark.parametrize("q, c, verdict, says", [
    ((0.03, 0.01, 0.05), (1.0, -2.0, 4.0), "cascade", "better quality"),
    ((0.03, 0.01, 0.05), (6.0, 2.0, 9.0), "best-static", "tokens +6.0%"),  # paid for it
    ((-0.002, -0.008, 0.004), (-40.0, -45.0, -35.0), "cascade", "cheaper at non-inferior"),
    ((-0.01, -0.02, 0.0), (-40.0, -45.0, -35.0), "best-static", "quality -0.0100"),  # worse
    ((0.0, -0.005, 0.005), (-3.0, -7.0, 1.0), "best-static", "[-7.0%, +1.0%]"),  # not cheaper
])
def test_the_verdict_needs_a_quality_gain_at_no_extra_cost_or_a_cut_at_non_inferior_quality(
        q, c, verdict, says):
    got, reason = cascade_verdict(_rows(q, c), margin=0.01)
    assert got == verdict and says in reason


def test_a_missing_row_is_named():
    with pytest.raises(ValueError, match="delta_cost_pct"):
        cascade_verdict(_rows((0.1, 0.05, 0.15), (0, 0, 0))[:1], margin=0.01)
