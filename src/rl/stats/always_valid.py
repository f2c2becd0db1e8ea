"""Always-valid inference for a mean difference: confidence sequences that may be read after
every request without inflating the error rate, the sample size they need, and CUPED.

The confidence sequence is the normal-mixture boundary (Robbins; the mSPRT of Johari et al.
2017 inverted; in the asymptotic form of Waudby-Smith et al. 2021, "Time-uniform central limit
theory"): with running mean m_n, standard error se_n = sd_n / sqrt(n) and mixing parameter
rho² > 0,

    m_n ± se_n · sqrt( 2 (n rho² + 1) / (n rho²) · log( sqrt(n rho² + 1) / alpha ) )

covers the true mean at *every* n at once with probability >= 1 − alpha (two-sided; each
one-sided bound therefore also holds with probability >= 1 − alpha). rho² sets the n where
the sequence is tightest (`rho2_for`). The guarantee is asymptotic (a CLT at the stopping
time): it needs tens of observations, not a handful; callers set a minimum n.

Every function is vectorised over numpy arrays (the rollout simulation runs thousands of
rollouts at once). Bad input raises ConfigError naming the argument.
"""

from __future__ import annotations

import math

import numpy as np
from numpy.typing import ArrayLike
from scipy.special import ndtri

from rag.errors import ConfigError
from rl.stats._checks import _prob


def rho2_for(n_plan: float, alpha: float) -> float:
    """The mixing parameter rho² that makes the confidence sequence tightest at `n_plan`
    observations (Waudby-Smith et al., eq. for the optimal rho): (−2 log alpha + log(1 − 2 log
    alpha)) / n_plan."""
    alpha = _prob("alpha", alpha)
    if not n_plan >= 1:
        raise ConfigError("n_plan", f"must be >= 1, got {n_plan}")
    la = -2.0 * math.log(alpha)
    return (la + math.log(1.0 + la)) / float(n_plan)


def radius_factor(n: ArrayLike, alpha: float, rho2: float) -> np.ndarray:
    """The confidence sequence's half-width in standard errors at n observations (>= the fixed
    z of one look; e.g. alpha 0.05, rho² tuned to n: about 3.0 instead of 1.96). Where n < 1 the
    factor is inf."""
    alpha = _prob("alpha", alpha)
    if not rho2 > 0:
        raise ConfigError("rho2", f"must be > 0, got {rho2}")
    n = np.asarray(n, dtype=np.float64)
    with np.errstate(divide="ignore", invalid="ignore"):
        a = n * rho2
        f = np.sqrt(2.0 * (a + 1.0) / a * np.log(np.sqrt(a + 1.0) / alpha))
    return np.where(n >= 1, f, np.inf)


def mean_se(n: ArrayLike, s: ArrayLike, ss: ArrayLike) -> tuple[np.ndarray, np.ndarray]:
    """Mean and standard error of the mean from the sufficient statistics n, sum and sum of
    squares (sample variance with n − 1; se inf where n < 2)."""
    n, s, ss = (np.asarray(x, dtype=np.float64) for x in (n, s, ss))
    with np.errstate(divide="ignore", invalid="ignore"):
        m = np.where(n > 0, s / np.maximum(n, 1), np.nan)
        var = np.maximum((ss - n * m * m) / np.maximum(n - 1, 1), 0.0)
        se = np.where(n >= 2, np.sqrt(var / np.maximum(n, 1)), np.inf)
    return m, se


def paired_cs(n: ArrayLike, s: ArrayLike, ss: ArrayLike, alpha: float,
              rho2: float) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(mean, low, high) of the mean of paired differences (candidate − stable per request)
    from their running n, sum and sum of squares: the confidence sequence of the module doc."""
    m, se = mean_se(n, s, ss)
    r = radius_factor(n, alpha, rho2) * se
    return m, m - r, m + r


def unpaired_cs(n_c: ArrayLike, s_c: ArrayLike, ss_c: ArrayLike, n_s: ArrayLike, s_s: ArrayLike,
                ss_s: ArrayLike, alpha: float,
                rho2: float) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(difference, low, high) of candidate mean − stable mean from two independent samples
    (a live split): se² = se_c² + se_s², the sequence indexed by the candidate's count n_c
    (the smaller arm of a canary, whose se dominates)."""
    mc, sec = mean_se(n_c, s_c, ss_c)
    ms, ses = mean_se(n_s, s_s, ss_s)
    se = np.sqrt(sec * sec + ses * ses)
    r = radius_factor(n_c, alpha, rho2) * se
    d = mc - ms
    return d, d - r, d + r


def required_n(effect: float, sd: float, alpha: float, power: float = 0.8,
               rho2: float | None = None, n_max: int = 10_000_000) -> int:
    """Observations (pairs, or candidate requests with `sd` the per-candidate-request sd of the
    difference) until the confidence sequence's bound excludes 0 with probability about
    `power` when the true mean is `effect`: the smallest n with sd/√n · (factor(n) + z_power)
    <= |effect|. `rho2` defaults to the value tuned at that n (searched jointly). An effect of
    0 needs infinitely many: returns n_max."""
    alpha, power = _prob("alpha", alpha), _prob("power", power)
    if not (math.isfinite(sd) and sd >= 0):
        raise ConfigError("sd", f"must be a finite number >= 0, got {sd}")
    if not math.isfinite(effect):
        raise ConfigError("effect", f"must be finite, got {effect}")
    if effect == 0:
        return n_max
    if sd == 0:
        return 2
    zb = float(ndtri(power))

    def ok(n: int) -> bool:
        r2 = rho2 if rho2 is not None else rho2_for(n, alpha)
        return sd / math.sqrt(n) * (float(radius_factor(n, alpha, r2)) + zb) <= abs(effect)

    lo, hi = 2, 2
    while not ok(hi):
        if hi >= n_max:
            return n_max
        lo, hi = hi, min(hi * 2, n_max)
    while lo < hi:  # smallest ok n in (lo, hi]
        mid = (lo + hi) // 2
        if ok(mid):
            hi = mid
        else:
            lo = mid + 1
    return hi


def cuped(y: ArrayLike, x: ArrayLike, theta: float | None = None) -> tuple[np.ndarray, float]:
    """CUPED (Deng et al. 2013): y − theta·(x − mean(x)) with theta = cov(x, y) / var(x) unless
    given, so the mean is unchanged and the variance falls by the squared correlation of x and
    y. `x` is a covariate the treatment cannot move (a pre-period value, or a request's
    property such as its question length). Returns (adjusted y, theta). For a comparison of
    two arms, fit theta once on both arms pooled and pass it to each."""
    y, x = np.asarray(y, dtype=np.float64), np.asarray(x, dtype=np.float64)
    if y.shape != x.shape or y.ndim != 1:
        raise ConfigError("x", f"must be a vector like y, got shapes {x.shape} and {y.shape}")
    if not (np.all(np.isfinite(y)) and np.all(np.isfinite(x))):
        raise ConfigError("y", "y and x must be finite")
    if theta is None:
        vx = float(np.var(x))
        theta = float(np.cov(x, y, ddof=0)[0, 1] / vx) if vx > 0 and y.size > 1 else 0.0
    return y - theta * (x - x.mean()), float(theta)
