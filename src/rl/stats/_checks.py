"""Argument checks shared by the statistics modules: bad input raises `ConfigError` naming the
argument."""

from __future__ import annotations

import numpy as np
from numpy.typing import ArrayLike

from rag.errors import ConfigError


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

