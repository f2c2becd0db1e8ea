"""Statistics for comparing a candidate config with the baseline on the same queries.

Conventions: `a` is the baseline, `b` the candidate, and every difference is `b - a` (candidate
minus baseline, in the metric's own units, e.g. faithfulness in [0, 1]), so a positive mean
difference means the candidate is better. Inputs may be lists or arrays; bad input raises
`ConfigError` naming the argument. Every random procedure takes a `seed` and draws from
`np.random.default_rng(seed)`, so the same call gives the same answer.

- `bootstrap_mean_ci`, `paired_bootstrap`: percentile bootstrap of a mean (of `b - a`).
- `permutation_test`: two-sided p-value, sign flips (paired) or label shuffles (unpaired).
- `required_sample_size`, `power`: normal-approximation power analysis.
- `alpha_spending`, `group_sequential_bounds`, `classic_bounds`, `SequentialTest`: group
  sequential testing with Lan-DeMets alpha spending, boundaries computed exactly (to grid
  accuracy) by the Armitage-McPherson-Rowe recursion over the Brownian motion of the z-statistics.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

import numpy as np
from numpy.typing import ArrayLike
from scipy.optimize import brentq
from scipy.special import ndtr, ndtri

from rag.errors import ConfigError

_CHUNK_ELEMENTS = 2_000_000  # bound on the size of one resampling matrix (16 MB of float64)
SpendingKind = Literal["obrien_fleming", "pocock"]


def _vector(name: str, x: ArrayLike, min_size: int = 1) -> np.ndarray:
    v = np.asarray(x, dtype=np.float64)
    if v.ndim != 1:
        raise ConfigError(name, f"must be one-dimensional, got shape {v.shape}")
    if v.size < min_size:
        raise ConfigError(name, f"needs at least {min_size} value(s), got {v.size}")
    if not np.all(np.isfinite(v)):
        raise ConfigError(name, "contains NaN or infinite values")
    return v


def _pair(a: ArrayLike, b: ArrayLike) -> tuple[np.ndarray, np.ndarray]:
    va, vb = _vector("a", a), _vector("b", b)
    if va.size != vb.size:
        raise ConfigError("b", f"paired test needs equal lengths, got {va.size} and {vb.size}")
    return va, vb


def _prob(name: str, value: float) -> float:
    if not 0.0 < float(value) < 1.0:
        raise ConfigError(name, f"must be in (0, 1), got {value}")
    return float(value)


def _count(name: str, value: int) -> int:
    if int(value) != value or value < 1:
        raise ConfigError(name, f"must be a positive integer, got {value}")
    return int(value)


def _chunks(total: int, row_len: int):
    """Row counts of successive chunks so that one chunk holds ~_CHUNK_ELEMENTS values."""
    step = max(1, _CHUNK_ELEMENTS // max(1, row_len))
    for start in range(0, total, step):
        yield min(step, total - start)


# --------------------------------------------------------------------------- bootstrap


@dataclass(frozen=True)
class BootstrapResult:
    """`mean_diff`: the observed mean of `b - a` (one-sample: the mean of `x`); `ci_low`,
    `ci_high`: percentile bootstrap interval; `p_value`: two-sided, for H0 mean = 0, the smallest
    level at which the percentile interval excludes 0; `n`: number of (paired) observations."""

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
    rng = np.random.default_rng(seed)
    means = np.concatenate([v[rng.integers(0, v.size, size=(m, v.size))].mean(axis=1)
                            for m in _chunks(n_resamples, v.size)])
    tail = (1.0 - ci) / 2.0
    lo, hi = np.quantile(means, [tail, 1.0 - tail])
    below, above = np.count_nonzero(means <= 0.0), np.count_nonzero(means >= 0.0)
    p = min(1.0, 2.0 * (min(below, above) + 1) / (n_resamples + 1))
    return BootstrapResult(float(v.mean()), float(lo), float(hi), float(p), int(v.size))


def paired_bootstrap(a: ArrayLike, b: ArrayLike, n_resamples: int = 10_000, seed: int = 0,
                     ci: float = 0.95) -> BootstrapResult:
    """Bootstrap of the mean paired difference `b - a` (candidate minus baseline): queries are
    resampled as pairs. Same contract as `bootstrap_mean_ci` applied to `b - a`."""
    va, vb = _pair(a, b)
    return bootstrap_mean_ci(vb - va, n_resamples=n_resamples, seed=seed, ci=ci)


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


# --------------------------------------------------------------------------- power analysis


def _sided(sided: int) -> int:
    if sided not in (1, 2):
        raise ConfigError("sided", f"must be 1 or 2, got {sided}")
    return sided


def _z_alpha(alpha: float, sided: int) -> float:
    return float(ndtri(1.0 - _prob("alpha", alpha) / _sided(sided)))


def _effect(delta: float, sd: float) -> float:
    if not math.isfinite(delta) or delta == 0:
        raise ConfigError("delta", f"must be a finite non-zero effect, got {delta}")
    if not math.isfinite(sd) or sd <= 0:
        raise ConfigError("sd", f"must be > 0, got {sd}")
    return abs(float(delta)) / float(sd)


def required_sample_size(delta: float, sd: float, alpha: float = 0.05, power: float = 0.8, *,
                         paired: bool = True, sided: int = 2) -> int:
    """Smallest n (queries) with normal-approximation power >= `power` to detect a mean
    difference `delta` (metric units) at level `alpha`.

    paired=True: `sd` is the sd of the per-query difference b - a, n = ceil(((z_a + z_b) sd /
    delta)^2), n = number of queries each config answers. paired=False (two independent samples,
    common sd): n per group = ceil(2 ((z_a + z_b) sd / delta)^2). z_a = z_{1 - alpha/sided},
    z_b = z_{power}. Example: to detect a faithfulness gain of 0.03 at 80% power, two-sided
    alpha 0.05, with per-query difference sd 0.1 takes 88 paired queries; with sd 0.2, 349."""
    e = _effect(delta, sd)
    z = _z_alpha(alpha, sided) + float(ndtri(_prob("power", power)))
    factor = 1.0 if paired else 2.0
    return max(1, math.ceil(factor * (z / e) ** 2 - 1e-9))


def power(n: int, delta: float, sd: float, alpha: float = 0.05, *, paired: bool = True,
          sided: int = 2) -> float:
    """Normal-approximation power of the z-test with n queries (per group if unpaired) against
    a true mean difference `delta`; two-sided power counts rejections in both tails."""
    n = _count("n", n)
    shift = _effect(delta, sd) * math.sqrt(n if paired else n / 2.0)
    z = _z_alpha(alpha, sided)
    p = float(ndtr(shift - z))
    return p + float(ndtr(-shift - z)) if sided == 2 else p


# --------------------------------------------------------------------------- alpha spending


def alpha_spending(t: ArrayLike, alpha: float = 0.05, kind: SpendingKind = "obrien_fleming"):
    """Lan-DeMets spending function: the type-I error spent by information fraction t in [0, 1].

    obrien_fleming: 2 - 2 Phi(z_{1 - alpha/2} / sqrt(t)); pocock: alpha ln(1 + (e - 1) t).
    Both are 0 at t = 0 and `alpha` at t = 1. `alpha` is the level of a one-sided test (a
    symmetric two-sided design spends this function at alpha / 2 on each tail, see
    `group_sequential_bounds`). Returns a float for scalar t, else an array."""
    alpha = _prob("alpha", alpha)
    tt = np.asarray(t, dtype=np.float64)
    if np.any(~np.isfinite(tt)) or np.any(tt < 0) or np.any(tt > 1):
        raise ConfigError("t", "information fractions must lie in [0, 1]")
    if kind == "obrien_fleming":
        with np.errstate(divide="ignore"):
            out = np.where(tt > 0, 2.0 - 2.0 * ndtr(ndtri(1 - alpha / 2) / np.sqrt(tt)), 0.0)
    elif kind == "pocock":
        out = alpha * np.log1p((math.e - 1.0) * tt)
    else:
        raise ConfigError("kind", f"unknown spending function {kind!r} (obrien_fleming | pocock)")
    return float(out) if out.ndim == 0 else out


def _spent(t: ArrayLike, alpha: float, kind: SpendingKind, sided: int) -> np.ndarray:
    """Cumulative type-I error to spend by fractions t. Two-sided (symmetric) designs spend
    `alpha / 2` per tail with the same function (the ldbounds / gsDesign convention, which gives
    the published two-sided tables), so the total is 2 * spend(t, alpha / 2)."""
    if sided == 1:
        return np.asarray(alpha_spending(t, alpha, kind), dtype=np.float64)
    return 2.0 * np.asarray(alpha_spending(t, alpha / 2.0, kind), dtype=np.float64)


def _fractions(information: int | ArrayLike) -> np.ndarray:
    if isinstance(information, (int, np.integer)):
        k = _count("information", information)
        return np.arange(1, k + 1) / k
    t = _vector("information", information)
    if np.any(t <= 0) or np.any(t > 1) or np.any(np.diff(t) <= 0):
        raise ConfigError("information", "fractions must be strictly increasing in (0, 1]")
    return t


class _Recursion:
    """Sub-density of the B-value B(t) = Z(t) sqrt(t) (standard Brownian motion under H0) on the
    continuation region, after the looks so far; Simpson nodes `x` with weights `w` (so the
    integral of f(x) g(x) is w @ g(x)). Starts as a point mass at B(0) = 0."""

    def __init__(self, sided: int):
        self.sided, self.t, self.x, self.w = sided, 0.0, np.zeros(1), np.ones(1)

    def exit_prob(self, b: float, t: float) -> float:
        """P(no earlier crossing, and |Z(t)| >= b (two-sided) / Z(t) >= b (one-sided))."""
        s, c = math.sqrt(t - self.t), b * math.sqrt(t)
        tail = ndtr((self.x - c) / s)
        if self.sided == 2:
            tail = tail + ndtr((-c - self.x) / s)
        return float(self.w @ tail)

    def advance(self, b: float, t: float) -> None:
        """Condition on not crossing boundary b at look time t."""
        s, root_t, span = math.sqrt(t - self.t), math.sqrt(t), 9.0
        hi = min(b * root_t, span * root_t) if math.isfinite(b) else span * root_t
        lo = -hi if self.sided == 2 else -span * root_t
        m = int(np.clip(math.ceil((hi - lo) / (s / 10.0)), 800, 6000)) | 1  # odd, h <= s / 10
        y = np.linspace(lo, hi, m)
        simpson = np.ones(m)
        simpson[1:-1:2], simpson[2:-1:2] = 4.0, 2.0
        simpson *= (hi - lo) / (m - 1) / 3.0
        dens = np.exp(-0.5 * ((y[:, None] - self.x[None, :]) / s) ** 2) @ self.w
        self.x, self.w, self.t = y, simpson * dens / (s * math.sqrt(2 * math.pi)), t


def _solve_bound(rec: _Recursion, t: float, target: float) -> float:
    """Boundary b at time t whose exit probability is `target` (inf if nothing is to spend)."""
    if target <= 1e-15:
        return math.inf
    lo = 0.0 if rec.sided == 2 else -10.0
    if rec.exit_prob(lo, t) <= target:
        raise ConfigError("alpha", "spending more than the remaining probability; alpha too big")
    return float(brentq(lambda b: rec.exit_prob(b, t) - target, lo, 40.0, xtol=1e-10))


@dataclass(frozen=True)
class Boundaries:
    """Critical values on the z scale, one per look: reject at look k when Z_k >= z[k]
    (one-sided) or |Z_k| >= z[k] (two-sided). `alpha_spent[k]` is the cumulative type-I error
    P(reject at some look <= k | H0), equal to the spending function at `information[k]`."""

    information: tuple[float, ...]
    z: tuple[float, ...]
    alpha_spent: tuple[float, ...]
    alpha: float
    sided: int


def group_sequential_bounds(information: int | ArrayLike, alpha: float = 0.05,
                            kind: SpendingKind = "obrien_fleming", sided: int = 1) -> Boundaries:
    """Lan-DeMets boundaries for looks at the given information fractions (an int K means K
    equally spaced looks), total type-I error `alpha` (one-sided if sided=1; sided=2 is the
    symmetric two-sided design that spends alpha / 2 per tail, 2 * spend(t, alpha / 2) in all).
    Boundary k solves P(no crossing before k, crossing at k) = spent(t_k) - spent(t_{k-1})
    under H0, where (Z_1..Z_K) are the z-statistics of a Brownian motion observed
    at t_1..t_K; the joint probabilities are integrated by the Armitage-McPherson-Rowe
    recursion on a Simpson grid (>= 800 nodes, spacing <= 1/10 of the increment's sd), accurate
    to about 1e-3 in z. E.g. 5 equal looks, two-sided 0.05 (or one-sided 0.025), OBF-type:
    4.88, 3.36, 2.68, 2.29, 2.03; Pocock-type: 2.44, 2.43, 2.41, 2.40, 2.39."""
    t = _fractions(information)
    spent = _spent(t, _prob("alpha", alpha), kind, _sided(sided))
    rec, z = _Recursion(sided), []
    for k, tk in enumerate(t):
        b = _solve_bound(rec, float(tk), float(spent[k] - (spent[k - 1] if k else 0.0)))
        z.append(b)
        if k + 1 < t.size:
            rec.advance(b, float(tk))
    return Boundaries(tuple(map(float, t)), tuple(z), tuple(map(float, spent)), alpha, sided)


def classic_bounds(information: int | ArrayLike, alpha: float = 0.05, kind: SpendingKind = "pocock",
                   sided: int = 2) -> Boundaries:
    """The original (non-spending) designs: Pocock's constant boundary z_k = c, or
    O'Brien-Fleming's z_k = c / sqrt(t_k), with c chosen so the total type-I error is `alpha`
    (same recursion as `group_sequential_bounds`). 5 equal looks, two-sided 0.05: Pocock
    c = 2.413; O'Brien-Fleming final boundary 2.040."""
    t = _fractions(information)
    alpha, sided = _prob("alpha", alpha), _sided(sided)
    if kind not in ("pocock", "obrien_fleming"):
        raise ConfigError("kind", f"unknown design {kind!r} (obrien_fleming | pocock)")
    shape = np.ones_like(t) if kind == "pocock" else 1.0 / np.sqrt(t)

    def cumulative(c: float) -> np.ndarray:
        rec, out = _Recursion(sided), []
        for k, tk in enumerate(t):
            out.append(rec.exit_prob(c * shape[k], float(tk)))
            if k + 1 < t.size:
                rec.advance(c * shape[k], float(tk))
        return np.cumsum(out)

    c = brentq(lambda c: cumulative(c)[-1] - alpha, 0.0, 40.0, xtol=1e-10)
    return Boundaries(tuple(map(float, t)), tuple(float(c * s) for s in shape),
                      tuple(map(float, cumulative(c))), alpha, sided)


# --------------------------------------------------------------------------- sequential test


@dataclass(frozen=True)
class LookResult:
    """One interim analysis: `look` (1-based), `n` differences used, `information` fraction,
    `z` = mean / (sd / sqrt(n)) of b - a, `boundary` (reject when z >= boundary, or |z| >= it
    two-sided), `reject`, `alpha_spent` (cumulative, by this look)."""

    look: int
    n: int
    information: float
    z: float
    boundary: float
    reject: bool
    alpha_spent: float


class SequentialTest:
    """Group sequential test of "candidate beats baseline" on paired differences b - a.

    Plan the looks with `information` (an int K for K equal looks, or increasing fractions in
    (0, 1]; default 5 equal looks) or with `n_per_look` (cumulative planned numbers of
    differences). Each `look(diffs)` gets every difference observed so far. With `n_per_look`,
    the actual fraction n / n_max is used (Lan-DeMets: the boundary of a look that deviates from
    plan is recomputed from the spending function, given the earlier looks' boundaries); the
    last planned look, or any look with n >= n_max, is the final analysis and spends all of
    `alpha`. One-sided ("greater", the default: we promote only a better candidate) or
    "two-sided". Refuses looks beyond the plan and looks after a rejection (the test stopped)."""

    def __init__(self, information: int | ArrayLike | None = None, *,
                 n_per_look: Sequence[int] | None = None,
                 alpha: float = 0.05, kind: SpendingKind = "obrien_fleming",
                 alternative: Literal["greater", "two-sided"] = "greater"):
        if alternative not in ("greater", "two-sided"):
            raise ConfigError("alternative", f"must be 'greater' or 'two-sided', got "
                                             f"{alternative!r}")
        self.n_per_look = None
        if n_per_look is not None and information is not None:
            raise ConfigError("n_per_look", "plan with information or n_per_look, not both")
        if n_per_look is None and information is None:
            information = 5
        if n_per_look is not None:
            ns = _vector("n_per_look", n_per_look)
            if np.any(ns < 2) or np.any(np.diff(ns) <= 0) or np.any(ns != np.round(ns)):
                raise ConfigError("n_per_look", "must be increasing integers >= 2")
            self.n_per_look, information = ns.astype(int), ns / ns[-1]
        self.alpha, self.kind, self.alternative = _prob("alpha", alpha), kind, alternative
        self.sided = 1 if alternative == "greater" else 2
        self.plan = group_sequential_bounds(information, alpha, kind, self.sided)
        self.history: list[LookResult] = []

    @property
    def n_looks(self) -> int:
        return len(self.plan.z)

    @property
    def stopped(self) -> bool:
        return bool(self.history) and (self.history[-1].reject or len(self.history) ==
                                       self.n_looks or self.history[-1].information >= 1.0)

    def _bound(self, k: int, t: float) -> float:
        planned = [h.information for h in self.history] + [t]
        if np.allclose(planned, self.plan.information[:k + 1], rtol=0, atol=1e-12):
            return self.plan.z[k]
        rec = _Recursion(self.sided)  # off plan: replay the actual looks, solve this one
        for h in self.history:
            rec.advance(h.boundary, h.information)
        spent = self.history[-1].alpha_spent if self.history else 0.0
        return _solve_bound(rec, t, float(_spent(t, self.alpha, self.kind, self.sided)) - spent)

    def look(self, diffs_so_far: ArrayLike) -> LookResult:
        """Analyse all differences b - a observed so far (at least 2)."""
        k = len(self.history)
        if self.stopped:
            why = "rejected H0" if self.history[-1].reject else f"all {self.n_looks} looks done"
            raise ConfigError("look", f"the test has stopped ({why}); no more looks")
        d = _vector("diffs_so_far", diffs_so_far, min_size=2)
        if self.history and d.size <= self.history[-1].n:
            raise ConfigError("diffs_so_far", "must hold every difference so far, plus new ones")
        if self.n_per_look is None or k == self.n_looks - 1:
            t = self.plan.information[k]
        else:  # reaching n_max early makes this the final analysis
            t = min(d.size / self.n_per_look[-1], 1.0)
        b = self._bound(k, t)
        mean, sd = float(d.mean()), float(d.std(ddof=1))
        if sd > 0:
            z = mean * math.sqrt(d.size) / sd
        else:  # every difference equal: infinitely strong evidence unless they are all 0
            z = 0.0 if mean == 0 else math.copysign(math.inf, mean)
        reject = z >= b if self.sided == 1 else abs(z) >= b
        res = LookResult(k + 1, int(d.size), float(t), z, float(b), bool(reject),
                         float(_spent(t, self.alpha, self.kind, self.sided)))
        self.history.append(res)
        return res
