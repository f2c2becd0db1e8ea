"""Statistics for comparing a candidate config with the baseline on the same queries.

Conventions: `a` is the baseline, `b` the candidate, and every difference is `b - a` (candidate
minus baseline, in the metric's own units, e.g. faithfulness in [0, 1]), so a positive mean
difference means the candidate is better. Inputs may be lists or arrays; bad input raises
`ConfigError` naming the argument. Every random procedure takes a `seed` and draws from
`np.random.default_rng(seed)`, so the same call gives the same answer.

- `bootstrap_mean_ci`, `paired_bootstrap`: percentile bootstrap of a mean (of `b - a`).
- `unpaired_bootstrap`: the same for `mean(b) - mean(a)` with the arms resampled independently.
- `bootstrap_statistic`: the resampling engine under them all, for any vectorised statistic of
  resampled rows (several paired arrays, quantiles, dicts of statistics).
- `permutation_test`: two-sided p-value, sign flips (paired) or label shuffles (unpaired).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TypeVar

import numpy as np
from numpy.typing import ArrayLike

from rl.stats._checks import _count, _pair, _prob, _vector

_CHUNK_ELEMENTS = 2_000_000  # bound on the size of one resampling matrix (16 MB of float64)


def _chunks(total: int, row_len: int):
    """Row counts of successive chunks so that one chunk holds ~_CHUNK_ELEMENTS values."""
    step = max(1, _CHUNK_ELEMENTS // max(1, row_len))
    for start in range(0, total, step):
        yield min(step, total - start)


# --------------------------------------------------------------------------- bootstrap

S = TypeVar("S", np.ndarray, dict)


def bootstrap_statistic(statistic: Callable[[np.ndarray], S], n: int,
                        n_resamples: int = 10_000, seed: int = 0) -> S:
    """`statistic` of `n_resamples` bootstrap resamples of n rows, vectorised.

    `statistic(idx)` receives a (chunk × n) matrix of row indices drawn with replacement (one
    resample per row; chunks hold ~2M indices) and returns one value per resample: an array
    of length chunk, or a dict of such arrays. Indexing several arrays with the same `idx`
    resamples them as pairs (paired bootstrap). Returns the chunks concatenated (an array of
    `n_resamples`, or a dict of them). Draws `rng.integers(0, n, (chunk, n))` per chunk from
    `np.random.default_rng(seed)`, so a seed gives the same resamples to every caller."""
    n, n_resamples = _count("n", n), _count("n_resamples", n_resamples)
    rng = np.random.default_rng(seed)
    parts = [statistic(rng.integers(0, n, size=(m, n))) for m in _chunks(n_resamples, n)]
    if isinstance(parts[0], dict):
        return {k: np.concatenate([p[k] for p in parts]) for k in parts[0]}
    return np.concatenate(parts)


def _p_value(stats: np.ndarray) -> float:
    """Two-sided p-value of H0 "statistic = 0" by inverting the percentile interval."""
    below, above = np.count_nonzero(stats <= 0.0), np.count_nonzero(stats >= 0.0)
    return float(min(1.0, 2.0 * (min(below, above) + 1) / (stats.size + 1)))


@dataclass(frozen=True)
class BootstrapResult:
    """`mean_diff`: the observed mean of `b - a` (one-sample: the mean of `x`); `ci_low`,
    `ci_high`: percentile bootstrap interval; `p_value`: two-sided, for H0 mean = 0, the smallest
    level at which the percentile interval excludes 0; `n`: number of (paired) observations
    (unpaired: of both arms)."""

    mean_diff: float
    ci_low: float
    ci_high: float
    p_value: float
    n: int


def bootstrap_mean_ci(x: ArrayLike, n_resamples: int = 10_000, seed: int = 0,
                      ci: float = 0.95) -> BootstrapResult:
    """Percentile bootstrap of the mean of `x` (n values, any units).

    Resamples are drawn as (chunk x n) index matrices, chunked so one holds ~2M entries.
    p_value = min(1, 2 * min(#(m* <= 0) + 1, #(m* >= 0) + 1) / (B + 1)) over the B resampled
    means m*, i.e. the inversion of the percentile interval (never exactly 0)."""
    v = _vector("x", x)
    n_resamples = _count("n_resamples", n_resamples)
    ci = _prob("ci", ci)
    means = bootstrap_statistic(lambda idx: v[idx].mean(axis=1), v.size, n_resamples, seed)
    tail = (1.0 - ci) / 2.0
    lo, hi = np.quantile(means, [tail, 1.0 - tail])
    return BootstrapResult(float(v.mean()), float(lo), float(hi), _p_value(means), int(v.size))


def paired_bootstrap(a: ArrayLike, b: ArrayLike, n_resamples: int = 10_000, seed: int = 0,
                     ci: float = 0.95) -> BootstrapResult:
    """Bootstrap of the mean paired difference `b - a` (candidate minus baseline): queries are
    resampled as pairs. Same contract as `bootstrap_mean_ci` applied to `b - a`."""
    va, vb = _pair(a, b)
    return bootstrap_mean_ci(vb - va, n_resamples=n_resamples, seed=seed, ci=ci)


def unpaired_bootstrap(a: ArrayLike, b: ArrayLike, n_resamples: int = 10_000, seed: int = 0,
                       ci: float = 0.95) -> BootstrapResult:
    """Percentile bootstrap of `mean(b) - mean(a)` with the arms resampled independently (two
    groups of different requests). Per chunk (~2M indices of the longer arm) `b`'s resamples
    are drawn before `a`'s. `n` is a.size + b.size; p_value as in `bootstrap_mean_ci`."""
    va, vb = _vector("a", a), _vector("b", b)
    n_resamples = _count("n_resamples", n_resamples)
    ci = _prob("ci", ci)
    rng = np.random.default_rng(seed)
    d = np.concatenate([vb[rng.integers(0, vb.size, (m, vb.size))].mean(axis=1)
                        - va[rng.integers(0, va.size, (m, va.size))].mean(axis=1)
                        for m in _chunks(n_resamples, max(va.size, vb.size))])
    tail = (1.0 - ci) / 2.0
    lo, hi = np.quantile(d, [tail, 1.0 - tail])
    return BootstrapResult(float(vb.mean() - va.mean()), float(lo), float(hi), _p_value(d),
                           int(va.size + vb.size))


# --------------------------------------------------------------------------- permutation


def permutation_test(a: ArrayLike, b: ArrayLike, n_permutations: int = 10_000, seed: int = 0,
                     paired: bool = True) -> float:
    """Two-sided Monte-Carlo permutation p-value for "b and a have the same mean".

    paired=True: statistic |mean(b - a)|, null draws flip the sign of each difference at random.
    paired=False: statistic |mean(b) - mean(a)|, null draws shuffle the group labels.
    Returns (1 + #(null >= observed)) / (1 + n_permutations), which is a valid p-value (its
    rejection rate under H0 is at most the level). Vectorised and chunked."""
    n_permutations = _count("n_permutations", n_permutations)
    rng = np.random.default_rng(seed)
    if paired:
        va, vb = _pair(a, b)
        d = vb - va
        observed = abs(d.mean())
        null = np.concatenate([
            np.abs((rng.integers(0, 2, size=(m, d.size)) * 2.0 - 1.0) @ d) / d.size
            for m in _chunks(n_permutations, d.size)])
    else:
        va, vb = _vector("a", a), _vector("b", b)
        pooled = np.concatenate([vb, va])
        observed = abs(vb.mean() - va.mean())
        null_parts = []
        for m in _chunks(n_permutations, pooled.size):
            perm = rng.permuted(np.tile(pooled, (m, 1)), axis=1)
            null_parts.append(np.abs(perm[:, :vb.size].mean(axis=1)
                                     - perm[:, vb.size:].mean(axis=1)))
        null = np.concatenate(null_parts)
    tol = 1e-12 * max(1.0, observed)  # equal statistics computed in a different order
    return float((1 + np.count_nonzero(null >= observed - tol)) / (1 + n_permutations))
