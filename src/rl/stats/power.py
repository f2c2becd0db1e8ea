"""Normal-approximation power analysis for paired or unpaired comparisons of means (conventions as
in `rl.stats.bootstrap`)."""

from __future__ import annotations

import math

from scipy.special import ndtr, ndtri

from rag.errors import ConfigError
from rl.stats._checks import _count, _prob

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
