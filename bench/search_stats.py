"""The search benchmark's censored statistics (bench/search.py): query-evaluations to 99% of the
best-known reward, per seed, when some seeds never get there within their budget.

A seed that reaches the target within its budget has an observed value (the query-evaluations
spent when its best full-fidelity reward first reached the target); one that does not is
*censored*: its true value is above its budget, and it is counted as the budget. Because a
censored value is at least the budget and every observed value is at most it, the median of the
counted values is the true median exactly when the middle order statistics are observed
(`censored_median`: with n seeds, when fewer than ceil(n/2) are censored); otherwise it is only a
lower bound on the true median.

The acceptance ratio (default searcher / plain TPE, medians) follows (`median_ratio`):
  both medians exact                -> measured
  default exact, TPE a lower bound  -> the ratio is an upper bound (TPE needs at least that)
  default a lower bound, TPE exact  -> the ratio is a lower bound
  both lower bounds                 -> undetermined
and the target (<= 1/3) is met only when the value decides it: measured, or an upper bound at or
below the target; missed when measured, or a lower bound, above it.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

TARGET_RATIO = 1 / 3


def reach(curve: Sequence[dict[str, Any]], target: float, budget: float,
          axis: str = "query_evals") -> float | None:
    """`axis` (query_evals or seconds) at the first curve point whose best full-fidelity reward
    is >= `target`, if that point's query-evaluations are within `budget`; None (censored)
    otherwise. (A search may end past its budget: the trial in progress finishes its rung; a
    reach there is not counted, so every censored value lies above every observed one.)"""
    for p in curve:
        if p.get("best_full") is not None and p["best_full"] >= target:
            if p["query_evals"] > budget:
                return None
            v = p.get(axis)
            return None if v is None else float(v)
    return None


def censored_median(values: Sequence[float | None], budgets: Sequence[float]) -> dict[str, Any]:
    """Median of per-seed values with None (censored) counted as that seed's budget.
    Returns median, n, reached, censored, and exact (whether the median is the true one)."""
    if len(values) != len(budgets) or not values:
        raise ValueError("censored_median needs one budget per value and at least one value")
    n = len(values)
    # (value, censored?) sorted with censored seeds after observed ones at equal values
    pts = sorted(((float(b), 1) if v is None else (float(v), 0)
                  for v, b in zip(values, budgets, strict=True)))
    x = np.array([p[0] for p in pts])
    lo, hi = (n - 1) // 2, n // 2
    observed_mid = pts[lo][1] == 0 and pts[hi][1] == 0
    # a censored seed's true value exceeds its budget; that budget must not sit below the
    # middle (only possible when budgets differ between seeds)
    exact = observed_mid and all(b >= x[hi] for v, b in zip(values, budgets, strict=True)
                                 if v is None)
    censored = sum(v is None for v in values)
    return {"median": float(np.median(x)), "n": n, "reached": n - censored,
            "censored": censored, "exact": bool(exact)}


def median_ratio(a: dict[str, Any], b: dict[str, Any], target: float = TARGET_RATIO
                 ) -> dict[str, Any]:
    """a / b of two `censored_median` results (module docstring): value, bound (measured |
    upper | lower | undetermined) and verdict (met | missed | undetermined)."""
    value = a["median"] / b["median"]
    bound = {(True, True): "measured", (True, False): "upper", (False, True): "lower",
             (False, False): "undetermined"}[(a["exact"], b["exact"])]
    if bound == "measured":
        verdict = "met" if value <= target else "missed"
    elif bound == "upper" and value <= target:
        verdict = "met"
    elif bound == "lower" and value > target:
        verdict = "missed"
    else:
        verdict = "undetermined"
    return {"value": float(value), "bound": bound, "verdict": verdict,
            "margin": float(target - value)}


def ratio_ci(a_vals: Sequence[float], b_vals: Sequence[float], paired: bool = False,
             n_resamples: int = 10_000, seed: int = 0) -> tuple[float, float]:
    """95% percentile bootstrap CI of median(a) / median(b) over seeds, censored seeds at their
    budget. `paired`: a[i] and b[i] ran with the same seed (the two TPE searchers draw the same
    startup configs from it), so seeds are resampled as pairs; else each set on its own."""
    from rl.stats.bootstrap import bootstrap_statistic

    a, b = np.asarray(a_vals, dtype=np.float64), np.asarray(b_vals, dtype=np.float64)
    if a.size < 2 or b.size < 2:
        return float("nan"), float("nan")
    if paired and a.size == b.size:
        r = bootstrap_statistic(lambda idx: np.median(a[idx], axis=1)
                                / np.median(b[idx], axis=1), a.size, n_resamples, seed)
    else:
        ma = bootstrap_statistic(lambda idx: np.median(a[idx], axis=1), a.size, n_resamples,
                                 seed)
        mb = bootstrap_statistic(lambda idx: np.median(b[idx], axis=1), b.size, n_resamples,
                                 seed + 1)
        r = ma / mb
    return float(np.percentile(r, 2.5)), float(np.percentile(r, 97.5))


def merge_parts(parts: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """One part per dataset from parts of separate runs (searchers or seed ranges run apart):
    runs are concatenated per searcher (a seed twice for one searcher is an error), and the
    parts must price alike (same cost model, same static-default reward on the valid split),
    else their rewards are not comparable and best-known would mix them."""
    by: dict[str, dict[str, Any]] = {}
    for part in parts:
        ds = part["dataset"]
        for rs in part["runs"].values():
            for r in rs:
                r.setdefault("budget", part["budget"])
        if ds not in by:
            by[ds] = {**part, "runs": {m: list(rs) for m, rs in part["runs"].items()},
                      "wall_s": part.get("wall_s", 0.0)}
            continue
        cur = by[ds]
        if part["cost_model"]["components"] != cur["cost_model"]["components"]:
            raise ValueError(f"{ds}: parts priced by different cost models; re-run them on one")
        if part["default"]["valid"]["reward"] != cur["default"]["valid"]["reward"]:
            raise ValueError(f"{ds}: parts disagree on the static default's reward")
        if part.get("warm_start") != cur.get("warm_start"):
            raise ValueError(f"{ds}: parts mix warm and cold starts")
        if part.get("gate_rule", "point") != cur.get("gate_rule", "point"):
            raise ValueError(f"{ds}: parts mix gate rules (point and expected rewards)")
        for m, rs in part["runs"].items():
            have = {r["seed"] for r in cur["runs"].get(m, [])}
            dup = have & {r["seed"] for r in rs}
            if dup:
                raise ValueError(f"{ds}: {m} seed(s) {sorted(dup)} in two parts")
            cur["runs"].setdefault(m, []).extend(rs)
        cur["wall_s"] += part.get("wall_s", 0.0)
        if part["best_known"]["reward"] > cur["best_known"]["reward"]:
            cur["best_known"] = part["best_known"]
    for cur in by.values():
        cur["runs"] = {m: sorted(rs, key=lambda r: r["seed"]) for m, rs in cur["runs"].items()}
        cur["seeds"] = sorted({r["seed"] for rs in cur["runs"].values() for r in rs})
    return list(by.values())
