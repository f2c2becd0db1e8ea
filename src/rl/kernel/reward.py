"""The reward and its hard gates: one specification, `RewardSpec`, for every place that scores
a config (the tuner's evaluator and env, the holdout report, offline replay, the promotion
evaluators) and `feedback_reward` for one logged interaction (the serving bandit).

    r = C − λ·P
    C = α·F + β·R − γ·min(p95 / T, 2) − δ·min(cost / C_ref, 2)       (the continuous part)
    P = [F < θ_F] + [R < θ_R] + [p95 > T] + 0.5·[se > band] + w_pii·L   (the penalty)

Units. F (faithfulness) and R (relevancy) are in [0, 1]; p95 is the 95th-percentile latency in
ms and T the latency gate (`Thresholds.p95_latency_ms`, ms); cost is tokens per query (in +
out) and C_ref the reference cost (`TunerSettings.cost_ref_tokens`, tokens); se is the standard
error of the batch's mean quality q = αF + βR per query; L is PII leaks per query
(`serving.pii.leak_count`: PII in an answer that is not in its inputs) and w_pii the penalty
per leak (`PII_LEAK_WEIGHT`, 1.0: a leak per query costs as much as a failed gate). The
latency and cost terms saturate at 2 so one pathological batch cannot swamp the quality
signal. A batch that measured no leaks has L = 0 and the reward it had before the term existed.

Gates. Faithfulness, relevancy and p95 latency are hard gates (a config failing one is never
promoted; each failure adds 1 to P); stability (se <= band) only adds 0.5 to P. A gate on a
NaN statistic fails (NaN compares false). `Gate.passes` is the one comparison. With a margin
`gate_z` > 0 (`TunerSettings.gate_z`) the F and R gates compare the lower bound mean − z·se of
the batch mean instead of the mean, so a config must clear them by more than sampling noise.
With `gate_expected` (`TunerSettings.gate_expected`) P charges the F and R gates by the
probability that a new batch of as many queries fails them, Φ((θ − mean)/(√2·se)), instead of
0/1: r is then the expected reward on new queries, smooth in F and R near their thresholds
(the verdicts in `gates` stay the point ones).

Missing values (a query without gold for a metric, or an answer that cannot be scored, e.g.
support of a bare yes/no, is NaN). One rule everywhere: a missing value is left out, never
scored as 0 (a 0 would punish a correct yes/no answer as an ungrounded one):
  * batch means (`RewardSpec.batch`) are the mean over the queries that have the metric; a
    batch where no query has it gets NaN, which fails its gate and makes the reward NaN;
  * a single query's quality (`RewardSpec.quality`: per-query rewards, and the per-query q
    behind se) is the weighted mean of the metrics it has, on the same α+β scale: a query
    without R scores (α+β)·F, one without F (α+β)·R. A query with neither has no quality
    term (0): there is nothing to leave it out of, and a NaN reward would poison every mean
    and bootstrap over queries.
  * PII leak counts are never missing: absent means 0 (not measured), NaN or < 0 is an error.

Abstention (`score_abstentions`, applied by the tuner's evaluator to F and R before either
reduction): an answer that abstains scores F = R = 1 when the gold marks the question
unanswerable and F = R = 0 when it is answerable (whatever F and R measure: otherwise an
abstention gets support 1.0 and, where R reads only the retrieval, never costs anything); an
answer to a question the gold marks unanswerable scores R = 0 (the right response was to
abstain), its F (grounding) as measured.

Per query (`RewardSpec.per_query`): the same C with one query's latency and tokens in place of
the batch p95 and mean cost, and P = w_pii·L only (gates are properties of a batch).

Vectorised: every method takes floats or numpy arrays; `RewardSpec.batch` reduces the last axis
(the queries of a batch), so a (B × m) matrix of resampled queries gives B batch metrics at
once, and the result is the same number, bit for bit, as B separate one-batch calls.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass
from typing import Any

import numpy as np
from numpy.typing import ArrayLike

from rl.kernel.settings import RewardWeights, Thresholds

PII_LEAK_WEIGHT = 1.0
"""Penalty units per PII leak (per query on average for a batch; per interaction for one row)."""
PII_COLUMN = "pii_leaks"
"""Per-query leak counts in a tuner table, when it has them (else L = 0)."""
HARD_GATES = ("faithfulness", "relevancy", "p95_latency_ms")
MEAN_GATES = HARD_GATES[:2]
"""The gates on a batch mean, which `gate_z` and `gate_expected` act on (they carry an se)."""
SATURATION = 2.0
"""Cap of the latency and cost ratios."""
UNSTABLE_PENALTY = 0.5
SHAPING_BAND = 0.1
"""Relative violation at which a shaped gate penalty reaches a full failed gate (10% short of
a floor, or 10% over the latency ceiling)."""

Value = Any
"""A float, or a numpy array of them (one element per batch or per query)."""


def _out(x: Any) -> Any:
    """A 0-d result as a Python float (bool for verdicts), an array as it is."""
    a = np.asarray(x)
    if a.ndim:
        return a
    return bool(a) if a.dtype == bool else float(a)


def _leaks(pii_leaks: ArrayLike) -> Value:
    x = np.asarray(pii_leaks, dtype=np.float64)
    if not np.all(x >= 0.0):  # also NaN
        raise ValueError(f"pii_leaks must be a count >= 0, got {pii_leaks!r}")
    return _out(x)


@dataclass(frozen=True)
class StepMetrics:
    """What one evaluation of a config on a batch measured (floats; arrays of one value per
    batch when `RewardSpec.batch` reduced many batches at once)."""

    faithfulness: Value
    relevancy: Value
    p95_latency_ms: Value
    cost: Value
    """Mean tokens per query (in + out)."""
    quality_se: Value = 0.0
    """Standard error of the batch's mean quality (αF+βR per query)."""
    pii_leaks: Value = 0.0
    """Mean PII leaks per query (`serving.pii.mean_leaks`); 0 = none measured."""
    faithfulness_se: Value = 0.0
    """Standard error of the batch's mean F (over the queries that have it; 0 below two)."""
    relevancy_se: Value = 0.0
    """Standard error of the batch's mean R (likewise): with `faithfulness_se`, what a gate
    margin (`RewardSpec.gate_z`) is measured in."""


@dataclass(frozen=True)
class Gate:
    """One gate: `statistic` (a `StepMetrics` field) must be >= `threshold` when
    `higher_is_better`, else <= it. NaN fails."""

    name: str
    statistic: str
    threshold: float
    higher_is_better: bool

    def passes(self, value: ArrayLike) -> Value:
        v = np.asarray(value, dtype=np.float64)
        return _out(v >= self.threshold if self.higher_is_better else v <= self.threshold)

    def violation(self, value: ArrayLike) -> Value:
        """How far `value` is on the wrong side of the threshold, relative to it (<= 0:
        passes; 0.1: 10% short of a floor or over a ceiling; NaN: 1, a full violation). What
        a constrained searcher reads as its feasibility signal (Optuna `constraints_func`)."""
        v = np.asarray(value, dtype=np.float64)
        scale = max(abs(self.threshold), 1e-9)
        gap = (self.threshold - v) if self.higher_is_better else (v - self.threshold)
        return _out(np.where(np.isnan(v), 1.0, gap / scale))


def hard_gates(t: Thresholds) -> tuple[Gate, Gate, Gate]:
    """The three hard gates of thresholds `t` (F, R: at least; p95 ms: at most)."""
    return (Gate("faithfulness", "faithfulness", t.faithfulness, True),
            Gate("relevancy", "relevancy", t.relevancy, True),
            Gate("p95_latency_ms", "p95_latency_ms", t.p95_latency_ms, False))


def gate_verdicts(values: dict[str, float | None], t: Thresholds) -> dict[str, bool | None]:
    """Hard-gate verdicts of measured statistics (`HARD_GATES` keys); a statistic that was not
    measured (None or absent) gets verdict None, which does not fail (the promotion reports)."""
    return {g.name: None if values.get(g.statistic) is None else g.passes(values[g.statistic])
            for g in hard_gates(t)}


@dataclass(frozen=True)
class GateVerdicts:
    """Gate verdicts of one batch (bools) or of many (bool arrays)."""

    faithfulness: Value
    relevancy: Value
    p95_latency_ms: Value
    stable: Value

    @property
    def passed(self) -> Value:
        """All hard gates pass (stability is a penalty, not a gate)."""
        return _out(np.logical_and.reduce([self.faithfulness, self.relevancy,
                                           self.p95_latency_ms]))

    @property
    def n_failed(self) -> Value:
        """Failed hard gates (0–3), as a float (array)."""
        return _out(sum(np.logical_not(getattr(self, n)).astype(np.float64)
                        for n in HARD_GATES))

    @property
    def failed(self) -> list[str]:
        """Names of the failed hard gates (one batch only)."""
        return [n for n in HARD_GATES if not getattr(self, n)]

    def as_dict(self) -> dict[str, bool]:
        return {"faithfulness": self.faithfulness, "relevancy": self.relevancy,
                "p95_latency_ms": self.p95_latency_ms, "stable": self.stable,
                "passed": self.passed}


@dataclass(frozen=True)
class RewardBreakdown:
    """C, the gate verdicts, P and r = C − λ·P of one batch (floats) or many (arrays)."""

    continuous: Value
    gates: GateVerdicts
    penalty: Value
    total: Value


@dataclass(frozen=True)
class RewardSpec:
    """The reward of the module docstring with its weights, gates, C_ref (tokens per query),
    stability band (se units) and PII weight (penalty units per leak)."""

    weights: RewardWeights = RewardWeights()
    thresholds: Thresholds = Thresholds()
    cost_ref: float = 1000.0
    instability_band: float = 0.05
    pii_weight: float = PII_LEAK_WEIGHT
    gate_z: float = 0.0
    """F and R gates pass when mean − gate_z·se clears the threshold (`TunerSettings.gate_z`)."""
    gate_expected: bool = False
    """P charges the F and R gates by their probability of failing on new queries
    (`expected_penalty`; `TunerSettings.gate_expected`)."""

    def __post_init__(self) -> None:
        if not 0 <= self.gate_z <= 5:
            raise ValueError(f"gate_z must be in [0, 5], got {self.gate_z!r}")
        if self.gate_expected and self.gate_z > 0:
            raise ValueError("gate_expected and gate_z > 0 are two rules for the same gates: "
                             "set one")
        if not self.cost_ref > 0:
            raise ValueError(f"cost_ref must be > 0, got {self.cost_ref!r}")
        if not self.instability_band >= 0:
            raise ValueError(f"instability_band must be >= 0, got {self.instability_band!r}")
        if not self.pii_weight >= 0:
            raise ValueError(f"pii_weight must be >= 0, got {self.pii_weight!r}")

    @classmethod
    def from_settings(cls, settings: Any, thresholds: Thresholds | None = None,
                      pii_weight: float = PII_LEAK_WEIGHT) -> RewardSpec:
        """The spec of `TunerSettings` `settings` (weights, C_ref, band) with `thresholds`
        (default: the settings' global ones; pass `settings.thresholds_for(dataset)`)."""
        return cls(settings.reward_weights, thresholds or settings.thresholds,
                   settings.cost_ref_tokens, settings.instability_band, pii_weight,
                   float(getattr(settings, "gate_z", 0.0)),
                   bool(getattr(settings, "gate_expected", False)))

    # ---- parts ------------------------------------------------------------------------------
    @property
    def gates_spec(self) -> tuple[Gate, ...]:
        """The three hard gates, then stability (se at most the band)."""
        return (*hard_gates(self.thresholds),
                Gate("stable", "quality_se", self.instability_band, False))

    def quality(self, faithfulness: ArrayLike, relevancy: ArrayLike) -> Value:
        """Per-query quality αF + βR; a missing (NaN) metric is left out and the other stands
        for both ((α+β)·F or (α+β)·R); neither present: 0 (module docstring)."""
        w = self.weights
        f, r = (np.asarray(x, dtype=np.float64) for x in (faithfulness, relevancy))
        hf, hr = ~np.isnan(f), ~np.isnan(r)
        wf, wr = w.alpha * hf, w.beta * hr
        total = wf + wr
        both = np.where(hf, f, 0.0) * wf + np.where(hr, r, 0.0) * wr
        with np.errstate(invalid="ignore", divide="ignore"):
            q = np.where(total > 0, both * (w.alpha + w.beta) / np.where(total > 0, total, 1.0),
                         0.0)
        return _out(q)

    def continuous(self, faithfulness: ArrayLike, relevancy: ArrayLike,
                   p95_latency_ms: ArrayLike, cost: ArrayLike) -> Value:
        """C = αF + βR − γ·min(p95/T, 2) − δ·min(cost/C_ref, 2) (no missing-value rule: NaN
        in, NaN out)."""
        w, T = self.weights, self.thresholds.p95_latency_ms
        f, r, lat, c = (np.asarray(x, dtype=np.float64)
                        for x in (faithfulness, relevancy, p95_latency_ms, cost))
        return _out(w.alpha * f + w.beta * r - w.gamma * np.minimum(lat / T, SATURATION)
                    - w.delta * np.minimum(c / self.cost_ref, SATURATION))

    def gated_value(self, m: StepMetrics, statistic: str) -> Value:
        """What a gate compares with its threshold: the statistic itself, or for F and R with
        `gate_z` > 0 its lower bound mean − gate_z·se (NaN stays NaN and fails)."""
        v = getattr(m, statistic)
        if self.gate_z > 0 and statistic in MEAN_GATES:
            se = np.nan_to_num(np.asarray(getattr(m, f"{statistic}_se"), dtype=np.float64))
            return _out(np.asarray(v, dtype=np.float64) - self.gate_z * se)
        return v

    def gates(self, m: StepMetrics) -> GateVerdicts:
        f, r, lat, st = (g.passes(self.gated_value(m, g.statistic)) for g in self.gates_spec)
        return GateVerdicts(f, r, lat, st)

    def violations(self, m: StepMetrics) -> dict[str, Value]:
        """Each hard gate's relative violation (`Gate.violation` of `gated_value`; <= 0
        passes)."""
        return {g.name: g.violation(self.gated_value(m, g.statistic))
                for g in self.gates_spec[:3]}

    def shaped_reward(self, m: StepMetrics) -> Value:
        """What PPO trains on when `TunerSettings.gate_penalty` is "shaped": C − λ·(Σ over hard
        gates of min(1, violation / SHAPING_BAND) + w_pii·L). A config 2% short of a gate costs
        0.2λ instead of the full λ, so the policy's gradient points back towards feasibility
        instead of off a cliff, and a 25-query batch's noise around a threshold does not swing
        the reward by λ. Stability is not charged (it is a property of the batch size). Reports,
        incumbents and promotion always use `reward`."""
        c = self.continuous(m.faithfulness, m.relevancy, m.p95_latency_ms, m.cost)
        viol = self.violations(m)
        shaped = sum(np.clip(np.asarray(v, dtype=np.float64) / SHAPING_BAND, 0.0, 1.0)
                     for v in viol.values())
        p = shaped + self.pii_weight * np.asarray(_leaks(m.pii_leaks))
        return _out(np.asarray(c) - self.weights.lambda_ * p)

    def penalty(self, v: GateVerdicts, pii_leaks: ArrayLike = 0.0) -> Value:
        """P: failed hard gates + 0.5 if unstable + w_pii × `pii_leaks` (mean per query)."""
        unstable = np.logical_not(v.stable).astype(np.float64) * UNSTABLE_PENALTY
        return _out(v.n_failed + unstable + self.pii_weight * np.asarray(_leaks(pii_leaks)))

    def expected_penalty(self, m: StepMetrics, v: GateVerdicts) -> Value:
        """P with each F and R gate charged by the probability that a new batch of as many
        queries fails it: Φ((θ − mean) / (√2·se)) (normal approximation: the new batch's mean
        and this one's differ by √2·se); a NaN mean fails (1), se 0 gives the 0/1 verdict.
        p95, stability and leaks as in `penalty`."""
        from scipy.special import ndtr

        total = np.asarray(self.penalty(v, m.pii_leaks), dtype=np.float64)
        for g in self.gates_spec[:len(MEAN_GATES)]:
            x = np.asarray(getattr(m, g.statistic), dtype=np.float64)
            se = np.nan_to_num(np.asarray(getattr(m, f"{g.statistic}_se"), dtype=np.float64))
            with np.errstate(divide="ignore", invalid="ignore"):
                prob = np.where(se > 0, ndtr((g.threshold - x) / (np.sqrt(2.0) * se)),
                                (x < g.threshold).astype(np.float64))
            prob = np.where(np.isnan(x), 1.0, prob)
            # the 0/1 charge `penalty` made from this gate's verdict in `v`, replaced
            total = total - np.logical_not(getattr(v, g.name)) + prob
        return _out(total)

    # ---- one batch, or many -----------------------------------------------------------------
    def breakdown(self, m: StepMetrics) -> RewardBreakdown:
        """C, gates, P and r of batch metrics `m` (floats, or arrays of one value per batch)."""
        v = self.gates(m)
        c = self.continuous(m.faithfulness, m.relevancy, m.p95_latency_ms, m.cost)
        p = self.expected_penalty(m, v) if self.gate_expected else self.penalty(v, m.pii_leaks)
        return RewardBreakdown(c, v, p, _out(np.asarray(c) - self.weights.lambda_ * p))

    def reward(self, m: StepMetrics) -> tuple[Value, GateVerdicts]:
        """The reward r and the gate verdicts it was computed with."""
        b = self.breakdown(m)
        return b.total, b.gates

    def batch(self, faithfulness: ArrayLike, relevancy: ArrayLike, latency_ms: ArrayLike,
              tokens: ArrayLike, pii_leaks: ArrayLike | None = None) -> StepMetrics:
        """Batch metrics from per-query values, reducing the last axis (the m queries of a
        batch): NaN-aware mean F and R, p95 latency (ms), mean tokens, se of the mean of the
        per-query quality (`quality`, ddof 1; 0 for one query) and mean leaks (0 if None).
        1-d inputs give floats, (B × m) inputs arrays of B."""
        F, R, lat, tok = (np.asarray(x, dtype=np.float64)
                          for x in (faithfulness, relevancy, latency_ms, tokens))
        m = F.shape[-1]
        with warnings.catch_warnings():  # a metric no query has is NaN: the gate fails
            warnings.simplefilter("ignore", RuntimeWarning)
            f, r = np.nanmean(F, axis=-1), np.nanmean(R, axis=-1)
        q = np.asarray(self.quality(F, R))
        se = q.std(axis=-1, ddof=1) / np.sqrt(m) if m > 1 else np.zeros(F.shape[:-1])
        leaks = 0.0 if pii_leaks is None else np.asarray(_leaks(pii_leaks)).mean(axis=-1)
        return StepMetrics(_out(f), _out(r), _out(np.percentile(lat, 95, axis=-1)),
                           _out(tok.mean(axis=-1)), _out(se), _out(leaks),
                           _out(_mean_se(F)), _out(_mean_se(R)))

    # ---- one query --------------------------------------------------------------------------
    def per_query(self, faithfulness: ArrayLike, relevancy: ArrayLike, latency_ms: ArrayLike,
                  tokens: ArrayLike, pii_leaks: ArrayLike | None = None) -> Value:
        """Each query's reward alone: quality (`quality`: a missing metric is left out) − γ·min(latency/T, 2)
        − δ·min(tokens/C_ref, 2) − λ·w_pii·leaks; no gates (they belong to a batch)."""
        w, T = self.weights, self.thresholds.p95_latency_ms
        lat, tok = (np.asarray(x, dtype=np.float64) for x in (latency_ms, tokens))
        c = (np.asarray(self.quality(faithfulness, relevancy))
             - w.gamma * np.minimum(lat / T, SATURATION)
             - w.delta * np.minimum(tok / self.cost_ref, SATURATION))
        if pii_leaks is not None:
            c = c - w.lambda_ * (self.pii_weight * np.asarray(_leaks(pii_leaks)))
        return _out(c)


def score_abstentions(faithfulness: ArrayLike, relevancy: ArrayLike, abstained: ArrayLike,
                      unanswerable: ArrayLike) -> tuple[Value, Value]:
    """Per-query F and R with abstention scored by answerability (module docstring):
    abstained & answerable -> 0, 0; abstained & unanswerable -> 1, 1; answered & unanswerable
    -> F, 0; answered & answerable -> F, R. `abstained`, `unanswerable`: 0/1 per query (NaN
    counts as 0: not an abstention / not marked unanswerable)."""
    f, r = (np.asarray(x, dtype=np.float64) for x in (faithfulness, relevancy))
    a = np.nan_to_num(np.asarray(abstained, dtype=np.float64)) > 0
    u = np.nan_to_num(np.asarray(unanswerable, dtype=np.float64)) > 0
    f = np.where(a, np.where(u, 1.0, 0.0), f)
    r = np.where(a, np.where(u, 1.0, 0.0), np.where(u, 0.0, r))
    return _out(f), _out(r)


def _mean_se(x: np.ndarray) -> np.ndarray:
    """Standard error of the NaN-aware mean over the last axis (ddof 1); 0 where fewer than two
    values are present."""
    n = np.sum(~np.isnan(x), axis=-1)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        sd = np.nanstd(x, axis=-1, ddof=1)
    return np.where(n > 1, np.nan_to_num(sd) / np.sqrt(np.maximum(n, 1)), 0.0)


# ---- the functional interface (one spec built per call) ------------------------------------
def gates(m: StepMetrics, t: Thresholds, instability_band: float) -> GateVerdicts:
    return RewardSpec(thresholds=t, instability_band=instability_band).gates(m)


def penalty(v: GateVerdicts, pii_leaks: float = 0.0,
            pii_weight: float = PII_LEAK_WEIGHT) -> float:
    """P: failed hard gates + 0.5 if unstable + `pii_weight` × `pii_leaks` (mean per query)."""
    return RewardSpec(pii_weight=pii_weight).penalty(v, pii_leaks)


def reward(m: StepMetrics, w: RewardWeights, t: Thresholds, cost_ref: float,
           instability_band: float, pii_weight: float = PII_LEAK_WEIGHT
           ) -> tuple[float, GateVerdicts]:
    """The scalar reward and the gate verdicts it was computed with (`RewardSpec.reward`)."""
    return RewardSpec(w, t, cost_ref, instability_band, pii_weight).reward(m)


def feedback_reward(reward: float, pii_leaks: float = 0.0,
                    pii_weight: float = PII_LEAK_WEIGHT) -> float:
    """One logged interaction's reward in [0, 1] (user feedback or a score) with the PII-leak
    penalty: clip(reward − pii_weight × pii_leaks, 0, 1). No leaks: `reward` unchanged.
    `pii_weight` is the whole penalty per leak on this [0, 1] scale (serving's
    `pii.leak_penalty`): serving holds no tuner weights, so λ does not apply here."""
    return float(min(1.0, max(0.0, float(reward) - pii_weight * float(_leaks(pii_leaks)))))
