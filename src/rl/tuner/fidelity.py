"""Fidelity rungs: a config is scored on the first n queries of one fixed, seeded permutation of
a split, so every rung is a prefix of the next (25 -> 75 -> the whole split) and a config
promoted to the next rung pays only for the new queries (rows are lazy per query)."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from rag.errors import ConfigError

PERMUTATION_SEED = 0
"""One permutation per split size for every search and seed: rung scores are comparable."""


def rung_indices(n_total: int, n: int, seed: int = PERMUTATION_SEED) -> np.ndarray:
    """The first `n` indices of the seeded permutation of range(`n_total`)."""
    if not 1 <= n <= n_total:
        raise ConfigError("rung", f"size must be in [1, {n_total}], got {n}")
    return np.random.default_rng(seed).permutation(n_total)[:n]


def rungs_for(n_total: int, rungs: Sequence[int | None]) -> list[int]:
    """Increasing rung sizes ending at the full split: None means `n_total`; sizes at or
    above it are dropped (the full split is always the last rung)."""
    out = sorted({int(r) for r in rungs if r is not None and 0 < int(r) < n_total})
    return out + [n_total]
