"""Tuning reports: holdout comparisons, evaluations-to-target, the quality/latency/cost Pareto
frontier, a power plan, and PNG plots.

How a holdout comparison stays statistically sound (`compare`). The reward of a config on a
split is r = C − λ·P with
    C = αF + βR − γ·min(p95/T, 2) − δ·min(cost/C_ref, 2)      (the continuous part)
    P = [F < θ_F] + [R < θ_R] + [p95 > T] + 0.5·[se > band] + w_pii·L    (the penalty)
(`rl.kernel.reward.RewardSpec`, the one definition; L = mean PII leaks per query, 0 unless the
table has a `pii_leaks` column).
C is built from means, a quantile and saturating clips: smooth (or Lipschitz) functions of the
query sample, for which the percentile bootstrap is consistent. P is a sum of step functions; a
bootstrap of an indicator whose statistic sits near its threshold is not: resamples fall on both
sides of the step, the bootstrap law of Δr becomes a mixture of modes λ apart, and its
percentiles describe the step rather than the uncertainty of Δ (bench/results/tuning.md once
read Δ −0.125 with "CI" [−0.142, +0.889] on MTRAG: a config near a gate, and the resamples on
the wrong side of it charged a whole λ). Hence:
  * Δ (`Comparison.diff`) and its paired-bootstrap CI are those of C: queries are resampled
    jointly for both configs and C, p95 included, is recomputed on every resample;
  * the gates are reported apart, per config (`GateEvidence`): the verdict on the full split
    (exactly what `evaluate` says), the statistic, its threshold and a bootstrap CI of the
    statistic from the same resamples, so a verdict whose CI straddles its threshold reads
    `marginal` instead of leaking into Δ's interval;
  * the full rewards C − λP of both configs (= `evaluate(...).reward`) are reported as point
    values, `Comparison.reward_diff`; it equals `diff` whenever both configs pay the same
    penalty (e.g. both pass every gate).
F and R are NaN-aware means everywhere (a query without gold of a metric is left out, not
counted as 0), as in `TunerEvaluator.summarize`.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from rag.config import RAGConfig
from rl.kernel.evaluator import QueryTable, TunerEvaluator
from rl.kernel.reward import PII_COLUMN
from rl.stats.bootstrap import bootstrap_statistic

GATES = ("faithfulness", "relevancy", "p95_latency_ms", "stable")


def batch_components(ev: TunerEvaluator, tab: QueryTable, idx: np.ndarray
                     ) -> dict[str, np.ndarray]:
    """For every row of `idx` (B × m query indices), what `evaluate` computes for that batch
    (`RewardSpec.batch` and `.breakdown`, vectorised): `faithfulness`, `relevancy` (NaN-aware
    means), `p95_latency_ms`, `cost` (mean tokens), `quality_se`, `pii_leaks` (mean per query,
    0 when the table has none), `continuous` (C) and `penalty` (P; a NaN statistic fails its
    gate). Each value is an array of length B."""
    spec = TunerEvaluator.reward_spec(ev)
    idx = np.atleast_2d(np.asarray(idx, dtype=np.int64))
    F, R = ev.quality(tab)
    leaks = tab.get(PII_COLUMN)
    m = spec.batch(F[idx], R[idx], tab["latency_ms"][idx], tab["tokens"][idx],
                   None if leaks is None else leaks[idx])
    b = spec.breakdown(m)
    out = {k: np.broadcast_to(np.asarray(v, dtype=np.float64), idx.shape[:1])
           for k, v in vars(m).items()}
    return {**out, "continuous": b.continuous, "penalty": b.penalty}


def batch_rewards(ev: TunerEvaluator, tab: QueryTable, idx: np.ndarray) -> np.ndarray:
    """The reward C − λ·P of every row of `idx` (B × m query indices), as `evaluate` computes
    it. Not for bootstrapping (see the module docstring): `compare` resamples C alone."""
    c = batch_components(ev, tab, idx)
    return c["continuous"] - ev.policy.reward_weights.lambda_ * c["penalty"]


@dataclass(frozen=True)
class GateEvidence:
    """One gate of one config on the full split. `passed` is the verdict `evaluate` gives;
    `value` the statistic (F, R, p95 ms, or the se of mean quality for `stable`), `threshold`
    its bound, [`ci_low`, `ci_high`] a percentile bootstrap CI of the statistic over queries.
    `clear`: the whole CI lies on the verdict's side of the threshold; otherwise the verdict is
    `marginal` (another sample of queries could well flip it)."""

    gate: str
    passed: bool
    value: float
    threshold: float
    ci_low: float
    ci_high: float
    higher_is_better: bool

    @property
    def clear(self) -> bool:
        lo_ok = self.ci_low >= self.threshold if self.higher_is_better else \
            self.ci_high <= self.threshold
        hi_bad = self.ci_high < self.threshold if self.higher_is_better else \
            self.ci_low > self.threshold
        return lo_ok if self.passed else hi_bad

    @property
    def verdict(self) -> str:
        return ("pass" if self.passed else "FAIL") + ("" if self.clear else " (marginal)")

    def describe(self) -> str:
        op = "≥" if self.higher_is_better else "≤"
        return (f"{self.gate} {self.value:.4g} [{self.ci_low:.4g}, {self.ci_high:.4g}] "
                f"{op} {self.threshold:g}: {self.verdict}")

    def as_dict(self) -> dict[str, Any]:
        return {"gate": self.gate, "passed": self.passed, "clear": self.clear,
                "value": self.value, "threshold": self.threshold, "ci_low": self.ci_low,
                "ci_high": self.ci_high}


@dataclass(frozen=True)
class Comparison:
    """Candidate vs baseline on one split (see the module docstring).

    `diff` = C(candidate) − C(baseline), the continuous reward part, with its paired bootstrap
    CI [`ci_low`, `ci_high`]; `candidate_reward`/`baseline_reward` are the full rewards
    (C − λP, as `evaluate` reports them), point values; `*_gates` the per-gate evidence."""

    candidate: str
    baseline: str
    candidate_reward: float
    baseline_reward: float
    diff: float
    ci_low: float
    ci_high: float
    n: int
    candidate_continuous: float = math.nan
    baseline_continuous: float = math.nan
    candidate_gates: tuple[GateEvidence, ...] = ()
    baseline_gates: tuple[GateEvidence, ...] = ()

    @property
    def reward_diff(self) -> float:
        """Full-reward difference (penalties included): a point value, no CI."""
        return self.candidate_reward - self.baseline_reward

    @property
    def relative(self) -> float:
        """`diff` relative to the baseline's continuous reward."""
        b = self.baseline_continuous
        return self.diff / abs(b) if b and math.isfinite(b) else float("nan")

    @property
    def excludes_zero(self) -> bool:
        return self.ci_low > 0 or self.ci_high < 0

    @staticmethod
    def gates_text(gates: Sequence[GateEvidence]) -> str:
        """`pass` when every gate passes clearly, else the gates that fail or are marginal."""
        odd = [g for g in gates if not (g.passed and g.clear)]
        return "pass" if not odd else "; ".join(g.describe() for g in odd)


def _gate_evidence(ev: TunerEvaluator, full: dict[str, np.ndarray],
                   boot: dict[str, np.ndarray], level: float) -> tuple[GateEvidence, ...]:
    a = (1 - level) / 2
    out = []
    for g in TunerEvaluator.reward_spec(ev).gates_spec:
        v = float(full[g.statistic][0])
        lo, hi = (float(x) for x in np.nanquantile(boot[g.statistic], [a, 1 - a])) \
            if np.isfinite(boot[g.statistic]).any() else (math.nan, math.nan)
        out.append(GateEvidence(g.name, bool(g.passes(v)), v, float(g.threshold), lo, hi,
                                g.higher_is_better))
    return tuple(out)


def compare_tables(ev: TunerEvaluator, ta: QueryTable, tb: QueryTable, candidate: str = "a",
                   baseline: str = "b", n_resamples: int = 10_000, seed: int = 0,
                   level: float = 0.95) -> Comparison:
    """`compare` on two per-query tables of the same queries (candidate `ta`, baseline `tb`)."""
    n = ta["latency_ms"].size
    if tb["latency_ms"].size != n:
        raise ValueError(f"tables differ in length: {n} vs {tb['latency_ms'].size}")
    lam = ev.policy.reward_weights.lambda_
    full = np.arange(n)[None, :]
    fa, fb = batch_components(ev, ta, full), batch_components(ev, tb, full)
    keys = ("faithfulness", "relevancy", "p95_latency_ms", "quality_se")

    def resampled(idx: np.ndarray) -> dict[str, np.ndarray]:
        ca, cb = batch_components(ev, ta, idx), batch_components(ev, tb, idx)
        return {"diff": ca["continuous"] - cb["continuous"], **{f"a.{k}": ca[k] for k in keys},
                **{f"b.{k}": cb[k] for k in keys}}

    boot = bootstrap_statistic(resampled, n, n_resamples, seed)
    d = boot["diff"]
    a = (1 - level) / 2
    lo, hi = np.quantile(d, [a, 1 - a])
    ca_, cb_ = float(fa["continuous"][0]), float(fb["continuous"][0])
    return Comparison(
        candidate, baseline, ca_ - lam * float(fa["penalty"][0]),
        cb_ - lam * float(fb["penalty"][0]), ca_ - cb_, float(lo), float(hi), n, ca_, cb_,
        _gate_evidence(ev, fa, {k: boot[f"a.{k}"] for k in keys}, level),
        _gate_evidence(ev, fb, {k: boot[f"b.{k}"] for k in keys}, level))


def compare(ev: TunerEvaluator, candidate: RAGConfig, baseline: RAGConfig, split: str,
            n_resamples: int = 10_000, seed: int = 0) -> Comparison:
    """Candidate vs baseline on `split`: Δ of the continuous reward with a paired bootstrap 95%
    CI (queries resampled jointly), full rewards as point values, gate evidence per config."""
    return compare_tables(ev, ev.table(candidate, split), ev.table(baseline, split),
                          candidate.config_hash, baseline.config_hash, n_resamples, seed)


@dataclass(frozen=True)
class PowerPlan:
    """Queries needed to detect a faithfulness change `delta` at `power` (two-sided `alpha`,
    normal approximation, `rl.stats.power.required_sample_size`), from measured per-query F:
    `sd_paired` = sd of the per-query difference candidate − baseline (shadow / offline replay:
    both configs answer the same queries), `sd` = sd of the baseline's per-query F (canary:
    different requests per arm, n per arm). `n` = queries with F for both configs."""

    delta: float
    power: float
    alpha: float
    sd_paired: float
    sd: float
    n_paired: int | None
    n_per_arm: int | None
    n: int

    def describe(self) -> str:
        return (f"To detect Δ = {self.delta:g} faithfulness at {self.power:.0%} power "
                f"(two-sided α {self.alpha:g}), from per-query faithfulness measured on "
                f"{self.n} queries: {_fmt_n(self.n_paired)} paired queries (sd of the "
                f"difference {self.sd_paired:.3f}), or {_fmt_n(self.n_per_arm)} requests per "
                f"arm unpaired (sd {self.sd:.3f}).")


def _fmt_n(n: int | None) -> str:
    return "— (no variation measured, so no estimate)" if n is None else f"{n:,}"


def power_plan(ev: TunerEvaluator, ta: QueryTable, tb: QueryTable, delta: float = 0.03,
               power: float = 0.8, alpha: float = 0.05) -> PowerPlan:
    """`PowerPlan` from two per-query tables (candidate `ta`, baseline `tb`) of one split."""
    from rl.stats.power import required_sample_size

    fa, fb = ev.quality(ta)[0], ev.quality(tb)[0]
    ok = ~(np.isnan(fa) | np.isnan(fb))
    d, b = (fa - fb)[ok], fb[ok]
    sdp = float(d.std(ddof=1)) if d.size > 1 else math.nan
    sd = float(b.std(ddof=1)) if b.size > 1 else math.nan

    def need(s: float, paired: bool) -> int | None:
        if not (math.isfinite(s) and s > 0):
            return None
        return required_sample_size(delta, s, alpha, power, paired=paired)

    return PowerPlan(delta, power, alpha, sdp, sd, need(sdp, True), need(sd, False),
                     int(ok.sum()))


def evals_to_reach(curve: Sequence[dict[str, Any]], value_of: dict[str, float],
                   target: float) -> int | None:
    """First evaluation at which the incumbent's (full-split) reward reaches `target`."""
    for c in curve:
        if value_of.get(c["incumbent"], -np.inf) >= target:
            return int(c["eval"])
    return None


def pareto_front(points: Sequence[tuple[float, float]]) -> list[int]:
    """Indices of points not dominated when maximising quality (x) and minimising cost (y)."""
    order = sorted(range(len(points)), key=lambda i: (points[i][1], -points[i][0]))
    front, best_q = [], -np.inf
    for i in order:
        if points[i][0] > best_q:
            front.append(i)
            best_q = points[i][0]
    return front


def plot_pareto(grid_reports: Sequence[dict[str, Any]], marked: dict[str, dict[str, Any]],
                path: str | Path, cost_key: str = "p95_latency_ms",
                title: str = "") -> Path:
    """Quality (αF+βR mean) vs `cost_key` for every grid config, the frontier, and named
    configs (static default, grid best, PPO) overlaid."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    pts = [(r["quality"], r[cost_key]) for r in grid_reports]
    front = pareto_front(pts)
    fig, ax = plt.subplots(figsize=(6, 4))
    ax.scatter([p[1] for p in pts], [p[0] for p in pts], s=8, c="#bbbbbb", label="grid configs")
    fp = sorted((pts[i] for i in front), key=lambda p: p[1])
    ax.plot([p[1] for p in fp], [p[0] for p in fp], "-", c="#333333", lw=1, label="Pareto front")
    for (name, r), m in zip(marked.items(), "os^Dv", strict=False):
        ax.scatter([r[cost_key]], [r["quality"]], marker=m, s=60, label=name, zorder=3)
    ax.set_xlabel(cost_key.replace("_", " "))
    ax.set_ylabel("quality (αF + βR)")
    ax.set_title(title)
    ax.legend(fontsize=7)
    return _save_figure(fig, path)


def plot_curves(curves: dict[str, Sequence[float]], ceiling: float, path: str | Path,
                title: str = "", ceiling_label: str = "grid best",
                ylabel: str = "incumbent reward (tuning split)") -> Path:
    """Reward vs evaluations spent, per method (by default the incumbent's full tuning-split
    reward), with a horizontal line at `ceiling` labelled `ceiling_label`."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 4))
    for name, ys in curves.items():
        ax.plot(range(1, len(ys) + 1), ys, label=name, lw=1.2)
    ax.axhline(ceiling, c="k", ls="--", lw=1, label=ceiling_label)
    ax.set_xlabel("evaluations")
    ax.set_ylabel(ylabel)
    ax.set_title(title)
    ax.legend(fontsize=7)
    return _save_figure(fig, path)


def plot_run_curve(rewards: Sequence[float], path: str | Path, title: str = "") -> Path:
    """One tuning run's history: the reward of every evaluation (a config on a batch) and the
    best so far, with the best observed reward as the ceiling line."""
    ys = np.asarray(rewards, dtype=float)
    best = np.maximum.accumulate(ys)
    return plot_curves({"batch reward": ys, "best so far": best}, float(best[-1]), path, title,
                       ceiling_label="best observed", ylabel="batch reward")


def _save_figure(fig, path: str | Path) -> Path:
    """Lay out, write `path` (PNG, 110 dpi; parent folders made) and close the figure."""
    import matplotlib.pyplot as plt

    fig.tight_layout()
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
