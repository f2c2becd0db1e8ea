"""The scalar baseline of bench/promotion.py: Lan-DeMets group-sequential boundaries (the rule
canary stages used before promotion judged each metric with `rl.stats.always_valid`), computed
exactly (to grid accuracy) by the Armitage-McPherson-Rowe recursion over the Brownian motion of the
z-statistics. Bad input raises `ConfigError` naming the argument."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal

import numpy as np
from numpy.typing import ArrayLike
from scipy.optimize import brentq
from scipy.special import ndtr, ndtri

from rag.errors import ConfigError


def _prob(name: str, value: float) -> float:
    if not 0.0 < float(value) < 1.0:
        raise ConfigError(name, f"must be in (0, 1), got {value}")
    return float(value)


def _sided(sided: int) -> int:
    if sided not in (1, 2):
        raise ConfigError("sided", f"must be 1 or 2, got {sided}")
    return sided


SpendingKind = Literal["obrien_fleming", "pocock"]


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
        if information < 1:
            raise ConfigError("information", f"must be a positive integer, got {information}")
        return np.arange(1, int(information) + 1) / int(information)
    t = np.asarray(information, dtype=np.float64)
    if t.ndim != 1 or t.size < 1 or not np.all(np.isfinite(t)):
        raise ConfigError("information", "must be a non-empty 1-d list of finite fractions")
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
