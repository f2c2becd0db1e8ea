"""Result rows with bootstrap CIs, in the results-file schema every benchmark and training run
writes:

    {"dataset", "system", "metric", "value", "ci_low", "ci_high", "n"}

`metric` is lower-cased; `value` is in the metric's own units (reward units, tokens, percent,
...); `ci_low`/`ci_high` bound a 95% percentile bootstrap interval over queries (`None` for a
row that has no interval, `plain_row`); `n` counts the queries (pairs, for a paired row).

Non-finite numbers, one rule for every function here: a row over per-query values that are not
all finite keeps their plain mean as `value` (NaN or ±inf) and gets the interval (NaN, NaN);
nothing is dropped from a mean and nothing raises. A ratio row (`ratio_row`) drops only the
resamples whose statistic is not finite (a resampled denominator of 0); when none is left, its
interval is (NaN, NaN). Resamples come from `rl.stats.bootstrap` with `seed`, so a seed gives
every caller the same interval.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

import numpy as np

from rag.errors import ConfigError
from rl.stats.bootstrap import bootstrap_mean_ci, bootstrap_statistic

Row = dict[str, Any]
NAN = float("nan")


def row(dataset: str, system: str, metric: str, value: float, ci_low: float | None,
        ci_high: float | None, n: int) -> Row:
    """One row; `ci_low`/`ci_high` None when the row has no interval."""
    return {"dataset": dataset, "system": system, "metric": metric.lower(),
            "value": float(value), "ci_low": None if ci_low is None else float(ci_low),
            "ci_high": None if ci_high is None else float(ci_high), "n": int(n)}


def plain_row(dataset: str, system: str, metric: str, value: float, n: int) -> Row:
    """A row without an interval (a count, a setting, a single measurement)."""
    return row(dataset, system, metric, value, None, None, n)


def bootstrap_ci(values: Iterable[float], n_resamples: int = 10_000, seed: int = 0,
                 ci: float = 0.95) -> tuple[float, float]:
    """Percentile bootstrap interval of the mean of `values`: one value is its own interval;
    no values, or a non-finite one, give (NaN, NaN) (module docstring)."""
    x = np.asarray(list(values), dtype=np.float64)
    if x.size == 1 and np.isfinite(x[0]):
        return float(x[0]), float(x[0])
    if x.size < 2 or not np.all(np.isfinite(x)):
        return NAN, NAN
    b = bootstrap_mean_ci(x, n_resamples, seed, ci)
    return b.ci_low, b.ci_high


def metric_row(dataset: str, system: str, metric: str, values: Iterable[float],
               seed: int = 0) -> Row:
    """The mean of per-query `values` with its bootstrap 95% interval."""
    x = np.asarray(list(values), dtype=np.float64)
    lo, hi = bootstrap_ci(x, seed=seed)
    return row(dataset, system, metric, float(x.mean()) if x.size else NAN, lo, hi, x.size)


def delta_row(dataset: str, system: str, metric: str, base: np.ndarray, got: np.ndarray,
              seed: int = 0) -> Row:
    """mean(got − base) over paired queries (candidate minus baseline, the same queries in the
    same order) with a paired bootstrap 95% interval. Raises `ConfigError` when the two
    arrays differ in length."""
    b = np.asarray(base, dtype=np.float64)
    g = np.asarray(got, dtype=np.float64)
    if b.ndim != 1 or b.shape != g.shape:
        raise ConfigError("got", f"needs two paired 1-d arrays of one length, got shapes "
                                 f"{b.shape} and {g.shape}")
    return metric_row(dataset, system, metric, g - b, seed)


def cost_pct(a: np.ndarray | float, b: np.ndarray | float) -> np.ndarray | float:
    """100 · (a / b − 1): the percent change of cost `a` against baseline `b` (b = 0 gives a
    non-finite value)."""
    with np.errstate(divide="ignore", invalid="ignore"):
        return 100.0 * (np.asarray(a, dtype=np.float64) / b - 1.0)


def ratio_row(dataset: str, system: str, metric: str, num: np.ndarray, den: np.ndarray,
              f: Callable[[np.ndarray, np.ndarray], np.ndarray], seed: int = 0) -> Row:
    """f(mean(num), mean(den)) over paired queries with a paired bootstrap 95% interval:
    each resample draws the same queries for `num` and `den`, and `f` maps the two resampled
    means (arrays) to the statistic (e.g. `cost_pct`). Non-finite resamples are dropped
    (module docstring)."""
    num = np.asarray(num, dtype=np.float64)
    den = np.asarray(den, dtype=np.float64)
    with np.errstate(divide="ignore", invalid="ignore"):
        boot = bootstrap_statistic(lambda idx: f(num[idx].mean(axis=1), den[idx].mean(axis=1)),
                                   num.size, seed=seed)
        value = float(f(num.mean(), den.mean()))
    boot = boot[np.isfinite(boot)]
    lo, hi = np.quantile(boot, [0.025, 0.975]) if boot.size else (NAN, NAN)
    return row(dataset, system, metric, value, lo, hi, num.size)
