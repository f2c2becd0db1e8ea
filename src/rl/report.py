"""Tuning reports: holdout comparisons with paired bootstrap CIs, evaluations-to-target, the
quality/latency/cost Pareto frontier, and PNG plots.

The reward of a config on a split is a *batch* statistic (p95 latency and the gates are not
per-query), so the paired bootstrap resamples queries and recomputes the whole batch reward of
both configs on every resample (vectorised: B × n index matrix).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from rag.config import RAGConfig
from rl.evaluation import QueryTable, TunerEvaluator


def batch_rewards(ev: TunerEvaluator, tab: QueryTable, idx: np.ndarray) -> np.ndarray:
    """The reward of every row of `idx` (B × m query indices), as `evaluate` computes it."""
    p, t = ev.policy, ev.thresholds
    w = p.reward_weights
    F, R = (np.nan_to_num(a) for a in ev.quality(tab))
    Fm = np.where(np.isnan(ev.quality(tab)[0]), np.nan, F)
    f = np.nanmean(Fm[idx], axis=1)
    r = R[idx].mean(axis=1)
    q = w.alpha * F[idx] + w.beta * R[idx]
    se = q.std(axis=1, ddof=1) / np.sqrt(idx.shape[1])
    p95 = np.percentile(tab["latency_ms"][idx], 95, axis=1)
    cost = tab["tokens"][idx].mean(axis=1)
    pen = ((f < t.faithfulness).astype(float) + (r < t.relevancy) + (p95 > t.p95_latency_ms)
           + 0.5 * (se > p.instability_band))
    return (w.alpha * f + w.beta * r - w.gamma * np.minimum(p95 / t.p95_latency_ms, 2.0)
            - w.delta * np.minimum(cost / p.cost_ref_tokens, 2.0) - w.lambda_ * pen)


@dataclass(frozen=True)
class Comparison:
    candidate: str
    baseline: str
    candidate_reward: float
    baseline_reward: float
    diff: float
    ci_low: float
    ci_high: float
    n: int

    @property
    def relative(self) -> float:
        return self.diff / abs(self.baseline_reward) if self.baseline_reward else float("nan")


def compare(ev: TunerEvaluator, candidate: RAGConfig, baseline: RAGConfig, split: str,
            n_resamples: int = 10_000, seed: int = 0) -> Comparison:
    """Reward(candidate) − reward(baseline) on `split`, paired bootstrap 95% CI."""
    ta, tb = ev.table(candidate, split), ev.table(baseline, split)
    n = ta["latency_ms"].size
    full = np.arange(n)[None, :]
    ra, rb = batch_rewards(ev, ta, full)[0], batch_rewards(ev, tb, full)[0]
    rng = np.random.default_rng(seed)
    diffs = []
    chunk = max(1, 2_000_000 // n)
    for start in range(0, n_resamples, chunk):
        idx = rng.integers(0, n, size=(min(chunk, n_resamples - start), n))
        diffs.append(batch_rewards(ev, ta, idx) - batch_rewards(ev, tb, idx))
    d = np.concatenate(diffs)
    lo, hi = np.quantile(d, [0.025, 0.975])
    return Comparison(candidate.config_hash, baseline.config_hash, float(ra), float(rb),
                      float(ra - rb), float(lo), float(hi), n)


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
    fig.tight_layout()
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def plot_curves(curves: dict[str, Sequence[float]], ceiling: float, path: str | Path,
                title: str = "") -> Path:
    """Incumbent reward (full tuning split) vs evaluations spent, per method."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 4))
    for name, ys in curves.items():
        ax.plot(range(1, len(ys) + 1), ys, label=name, lw=1.2)
    ax.axhline(ceiling, c="k", ls="--", lw=1, label="grid best")
    ax.set_xlabel("evaluations")
    ax.set_ylabel("incumbent reward (tuning split)")
    ax.set_title(title)
    ax.legend(fontsize=7)
    fig.tight_layout()
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
