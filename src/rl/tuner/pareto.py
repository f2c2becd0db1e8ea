"""The tuner's product: a Pareto front of quality vs cost (tokens per query) vs p95 latency over
a run's full-fidelity evaluations, and the operating point the objective picks from it.

    p = build(ev, settings, search_best=res.best_config)   # on the tune split
    p.write(run_dir)          # pareto.json + pareto.png
    p.chosen                  # the operating point (a RAGConfig); p.choice.better

Full fidelity: a config counts when every query of the split has a row for it (so its
numbers are whole-split numbers, not a rung's prefix); the incumbent (the settings' static
default) and the search's own pick are evaluated on the whole split if they were not. The
front is the set of those configs no other dominates (quality ≥, tokens ≤, p95 ≤, one
strictly). The operating point is chosen from every full-fidelity config by
`rl.kernel.objective.choose`: lower confidence bounds of paired differences with the
incumbent on this split, so a config that won by sampling luck is not taken. Not from the
front alone: a config whose point estimates another dominates can still be the cheapest one
shown non-inferior, when the one dominating it differs from the incumbent on more queries.

Hypervolume (`hypervolume`): the volume a set of points dominates up to a reference point in
(quality ↑, tokens ↓, p95 ↓), exact by slicing; `bench/objectives.py` compares a run's front
with the best-known front that way.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from rag.config import RAGConfig
from rl.kernel.objective import (
    COST,
    LATENCY,
    QUALITY,
    Choice,
    Columns,
    choose,
    columns,
    paired_deltas,
    statement,
)

if TYPE_CHECKING:
    from rl.kernel.evaluator import TunerEvaluator

PARETO_JSON = "pareto.json"
PARETO_PNG = "pareto.png"


def nondominated(points: np.ndarray) -> list[int]:
    """Indices (ascending) of the rows of `points` (n × 3: quality, tokens, p95 ms) that no
    other row dominates (quality ≥, tokens ≤, p95 ≤, one strictly). Exact duplicates are all
    kept."""
    p = np.asarray(points, dtype=np.float64).reshape(-1, 3)
    x = p * np.array([-1.0, 1.0, 1.0])  # all three minimised
    keep = []
    for i in range(len(x)):
        le = np.all(x <= x[i], axis=1)
        lt = np.any(x < x[i], axis=1)
        if not np.any(le & lt):
            keep.append(i)
    return keep


def _hv2(pts: np.ndarray, ref: np.ndarray) -> float:
    """Area dominated by 2-D points (both minimised) up to `ref`."""
    pts = pts[np.all(pts < ref, axis=1)]
    if not len(pts):
        return 0.0
    pts = pts[np.lexsort((pts[:, 1], pts[:, 0]))]
    # staircase: sweep x ascending, the running minimum of y defines the step heights
    xs = list(pts[:, 0]) + [ref[0]]
    area, run_min = 0.0, ref[1]
    for i in range(len(pts)):
        run_min = min(run_min, pts[i, 1])
        area += (xs[i + 1] - xs[i]) * (ref[1] - run_min)
    return float(area)


def hypervolume(points: np.ndarray, ref: np.ndarray) -> float:
    """Volume dominated by `points` (n × 3: quality ↑, tokens ↓, p95 ↓) and bounded by `ref`
    (a worse corner: lower quality, more tokens, higher p95). Units: quality × tokens × ms;
    compare hypervolumes only under the same `ref`."""
    p = np.asarray(points, dtype=np.float64).reshape(-1, 3) * np.array([-1.0, 1.0, 1.0])
    r = np.asarray(ref, dtype=np.float64) * np.array([-1.0, 1.0, 1.0])
    p = p[np.all(p < r, axis=1)]
    if not len(p):
        return 0.0
    order = np.argsort(p[:, 0], kind="stable")
    p = p[order]
    cuts = list(p[:, 0]) + [r[0]]
    vol = 0.0
    for i in range(len(p)):
        width = cuts[i + 1] - cuts[i]
        if width > 0:
            vol += width * _hv2(p[: i + 1, 1:], r[1:])
    return float(vol)


@dataclass
class Pareto:
    """A run's full-fidelity points on `split`, its front and the objective's choice."""

    split: str
    configs: dict[str, RAGConfig]
    cols: dict[str, Columns]
    points: dict[str, tuple[float, float, float]]
    front: list[str]
    choice: Choice
    incumbent: str
    objective: dict[str, Any]

    @property
    def chosen(self) -> RAGConfig:
        return self.configs[self.choice.key]

    def to_dict(self) -> dict[str, Any]:
        """What pareto.json holds: every point (quality, tokens, p95 ms, on the front or not,
        the objective's verdict and, for non-incumbents, its deltas with the incumbent) and
        the choice."""
        pts = []
        for k, (q, t, p) in self.points.items():
            d = self.choice.deltas.get(k, {})
            pts.append({"config_hash": k, "quality": q, "tokens": t, "p95_latency_ms": p,
                        "on_front": k in self.front, "verdict": self.choice.verdicts.get(k),
                        "config": self.configs[k].model_dump(mode="json"),
                        "deltas": {m: x.as_dict() for m, x in d.items()}})
        return {"split": self.split, "objective": self.objective,
                "incumbent": self.incumbent, "chosen": self.choice.key,
                "better": self.choice.better, "reason": self.choice.reason,
                "n_points": len(self.points), "front": self.front, "points": pts}

    def write(self, out: str | Path, title: str = "") -> tuple[Path, Path]:
        """`out`/pareto.json and `out`/pareto.png (quality vs tokens, p95 as colour; the
        front, the incumbent and the operating point marked)."""
        out = Path(out)
        out.mkdir(parents=True, exist_ok=True)
        j = out / PARETO_JSON
        j.write_text(json.dumps(self.to_dict(), indent=1, default=str))
        return j, plot(self, out / PARETO_PNG, title)


def full_fidelity(ev: TunerEvaluator, split: str) -> list[RAGConfig]:
    """Configs `ev` has evaluated (`ev.seen`) with a row for every query of `split`."""
    return [c for c in list(ev.seen.values()) if ev.is_cached(c, split)]


def build(ev: TunerEvaluator, settings: Any, *, search_best: RAGConfig | None = None,
          split: str | None = None, extra: list[RAGConfig] | tuple = (),
          seed: int = 0) -> Pareto:
    """The front of `ev`'s full-fidelity evaluations on `split` (default: the tune split) with
    the incumbent (`settings.base_config()`), `search_best` and `extra` evaluated on the
    whole split first, and the objective's choice (`settings.objective`) among every
    full-fidelity config (for the `reward` objective: `search_best`)."""
    split = split or ev.slice.tune_split
    incumbent = settings.base_config()
    for c in (incumbent, search_best, *extra):
        if c is not None:
            ev.evaluate(c, split)
    configs = {c.config_hash: c for c in full_fidelity(ev, split)}
    cols = {k: columns(ev, ev.table(c, split)) for k, c in configs.items()}
    points = {k: (float(np.mean(v[QUALITY])), float(np.mean(v[COST])),
                  float(np.percentile(v[LATENCY], 95))) for k, v in cols.items()}
    keys = list(points)
    front = [keys[i] for i in nondominated(np.array([points[k] for k in keys]))]
    inc = incumbent.config_hash
    choice = choose(settings.objective, cols, inc,
                    ev.slice.faithfulness, ev.slice.relevancy,
                    ev.thresholds.p95_latency_ms,
                    search_best=None if search_best is None else search_best.config_hash,
                    seed=seed)
    obj = settings.objective.model_dump(mode="json")
    obj.update(quality=f"(αF + βR)/(α + β), F = {ev.slice.faithfulness}, "
                       f"R = {ev.slice.relevancy}",
               p95_slo_ms=ev.thresholds.p95_latency_ms)
    return Pareto(split, configs, cols, points, front, choice, inc, obj)


def objective_summary(ev: TunerEvaluator, p: Pareto, settings: Any, split: str | None = None,
                      seed: int = 0) -> dict[str, Any]:
    """The run's result in the objective's terms (summary.json's `objective`): the choice, its
    deltas with the incumbent on the tune split (what it was chosen by) and on `split`
    (default: the holdout split, paired bootstrap), and `statement`, the line `tune` prints."""
    split = split or ev.slice.holdout_split
    obj = settings.objective
    hold = {}
    if p.choice.better:
        hold = paired_deltas(columns(ev, ev.table(p.chosen, split)),
                             columns(ev, ev.table(p.configs[p.incumbent], split)),
                             obj.n_resamples, seed, obj.level)
    return {"kind": obj.kind, "margin": obj.margin, "level": obj.level,
            "chosen": p.choice.key, "incumbent": p.incumbent, "better": p.choice.better,
            "reason": p.choice.reason, "full_fidelity_configs": len(p.points),
            "pareto_points": len(p.front), "holdout_split": split,
            "statement": statement(obj.kind, hold, obj.margin, obj.level, p.choice.better,
                                   p.choice.reason),
            "tune": {m: d.as_dict() for m, d in p.choice.deltas.get(p.choice.key, {}).items()},
            "holdout": {m: d.as_dict() for m, d in hold.items()}}


def plot(p: Pareto, path: str | Path, title: str = "") -> Path:
    """Quality vs tokens per query for every full-fidelity config (colour: p95 ms), the front,
    the incumbent and the operating point."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from rl.tuner.report import _save_figure

    keys = list(p.points)
    q = np.array([p.points[k][0] for k in keys])
    t = np.array([p.points[k][1] for k in keys])
    lat = np.array([p.points[k][2] for k in keys])
    fig, ax = plt.subplots(figsize=(6.4, 4.2))
    sc = ax.scatter(t, q, c=lat, s=14, cmap="viridis", label="full-fidelity configs")
    fig.colorbar(sc, ax=ax, label="p95 latency (ms)")
    fr = sorted(p.front, key=lambda k: p.points[k][1])
    ax.scatter([p.points[k][1] for k in fr], [p.points[k][0] for k in fr], s=60,
               facecolors="none", edgecolors="k", label=f"Pareto front ({len(fr)})")
    inc = p.points[p.incumbent]
    ax.scatter([inc[1]], [inc[0]], marker="s", s=70, c="tab:red", label="incumbent (default)")
    if p.choice.better:
        ch = p.points[p.choice.key]
        ax.scatter([ch[1]], [ch[0]], marker="*", s=160, c="tab:orange",
                   label=f"operating point ({p.choice.kind})")
    ax.set_xlabel("tokens per query")
    ax.set_ylabel("quality (αF + βR)/(α + β)")
    ax.set_title(title or f"{p.split}: quality vs cost vs p95")
    ax.legend(fontsize=7)
    return _save_figure(fig, path)
