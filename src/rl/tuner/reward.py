"""Reward and hard gates: pure functions of a step's measured summary.

    r = α·F + β·R − γ·min(p95 / T, 2) − δ·min(cost / C_ref, 2) − λ·P

F (faithfulness) and R (relevancy) are batch means in [0, 1]; p95 is the batch's 95th-percentile
latency in ms and T the latency gate; cost is mean tokens per query (in + out) and C_ref the
reference cost. P counts penalties: +1 for every failed hard gate (F, R, p95 latency), +0.5 when
the batch is unstable (the standard error of its mean quality exceeds the band), and
+ w_pii·L where L is the mean number of PII leaks per query (`serving.pii.leak_count`: PII in an
answer that is not in its inputs) and w_pii the per-leak weight (`PII_LEAK_WEIGHT`, 1.0: a
leak per query costs as much as a failed gate). L defaults to 0, so a batch without leaks gets
exactly the reward it got before the term existed. The latency and cost terms saturate at 2 so
one pathological batch cannot swamp the quality signal.

`feedback_reward` is the same penalty for one logged interaction: its [0, 1] reward (user
feedback or a score) minus w_pii per leak, clipped to [0, 1] (what the serving bandit and the
rollout's log evidence learn from).
"""

from __future__ import annotations

from dataclasses import dataclass

from rl.tuner.settings import RewardWeights, Thresholds

PII_LEAK_WEIGHT = 1.0
"""Penalty units per PII leak (per query on average for a batch; per interaction for one row)."""


@dataclass(frozen=True)
class StepMetrics:
    """What one evaluation of a config on a batch measured."""

    faithfulness: float
    relevancy: float
    p95_latency_ms: float
    cost: float
    """Mean tokens per query (in + out)."""
    quality_se: float = 0.0
    """Standard error of the batch's mean quality (αF+βR per query)."""
    pii_leaks: float = 0.0
    """Mean PII leaks per query (`serving.pii.mean_leaks`); 0 = none measured."""


@dataclass(frozen=True)
class GateVerdicts:
    faithfulness: bool
    relevancy: bool
    p95_latency_ms: bool
    stable: bool

    @property
    def passed(self) -> bool:
        """All hard gates pass (stability is a penalty, not a gate)."""
        return self.faithfulness and self.relevancy and self.p95_latency_ms

    @property
    def failed(self) -> list[str]:
        return [n for n in ("faithfulness", "relevancy", "p95_latency_ms")
                if not getattr(self, n)]

    def as_dict(self) -> dict[str, bool]:
        return {"faithfulness": self.faithfulness, "relevancy": self.relevancy,
                "p95_latency_ms": self.p95_latency_ms, "stable": self.stable,
                "passed": self.passed}


def gates(m: StepMetrics, t: Thresholds, instability_band: float) -> GateVerdicts:
    return GateVerdicts(faithfulness=m.faithfulness >= t.faithfulness,
                        relevancy=m.relevancy >= t.relevancy,
                        p95_latency_ms=m.p95_latency_ms <= t.p95_latency_ms,
                        stable=m.quality_se <= instability_band)


def _leaks(pii_leaks: float) -> float:
    x = float(pii_leaks)
    if not x >= 0.0:  # also NaN
        raise ValueError(f"pii_leaks must be a count >= 0, got {pii_leaks!r}")
    return x


def penalty(v: GateVerdicts, pii_leaks: float = 0.0,
            pii_weight: float = PII_LEAK_WEIGHT) -> float:
    """P: failed hard gates + 0.5 if unstable + `pii_weight` × `pii_leaks` (mean per query)."""
    return float(len(v.failed)) + (0.0 if v.stable else 0.5) + pii_weight * _leaks(pii_leaks)


def reward(m: StepMetrics, w: RewardWeights, t: Thresholds, cost_ref: float,
           instability_band: float, pii_weight: float = PII_LEAK_WEIGHT
           ) -> tuple[float, GateVerdicts]:
    """The scalar reward and the gate verdicts it was computed with."""
    v = gates(m, t, instability_band)
    r = (w.alpha * m.faithfulness + w.beta * m.relevancy
         - w.gamma * min(m.p95_latency_ms / t.p95_latency_ms, 2.0)
         - w.delta * min(m.cost / cost_ref, 2.0)
         - w.lambda_ * penalty(v, m.pii_leaks, pii_weight))
    return float(r), v


def feedback_reward(reward: float, pii_leaks: float = 0.0,
                    pii_weight: float = PII_LEAK_WEIGHT) -> float:
    """One interaction's reward in [0, 1] with the PII-leak penalty:
    clip(reward − pii_weight × pii_leaks, 0, 1). No leaks: `reward` unchanged."""
    return float(min(1.0, max(0.0, float(reward) - pii_weight * _leaks(pii_leaks))))
