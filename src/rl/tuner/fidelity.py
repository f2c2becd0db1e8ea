"""Fidelity rungs of a multi-fidelity search: which queries of a split a config is scored on
at each rung.

Rung n of a split of `n_total` queries is the first n indices of one fixed seeded permutation
of the split (`rung_indices`), so rungs are nested (rung 25 is a prefix of rung 75), every
config of every search is scored on the same queries at a given rung (comparable rewards, and
rows cached per (config, query) are reused from rung to rung), and the full split is the last
rung. `rungs_for` turns a rung schedule such as (25, 75, None) into concrete sizes.

    rungs_for(200, (25, 75, None))  -> (25, 75, 200)
    rungs_for(60, (25, 75, None))   -> (25, 60)
    rung_indices(200, 25)           -> 25 distinct indices in [0, 200)
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

RUNG_SEED = 0
"""Seed of the permutation every search uses (one set of rung queries per split)."""


def rung_indices(n_total: int, n: int, seed: int = RUNG_SEED) -> np.ndarray:
    """The first `n` indices (int64, in permutation order) of the seeded permutation of
    `range(n_total)`. ValueError unless 1 <= n <= n_total."""
    if not 1 <= n <= n_total:
        raise ValueError(f"rung size must be in [1, {n_total}], got {n}")
    return np.random.default_rng(seed).permutation(n_total)[:n].astype(np.int64)


def rungs_for(n_total: int, rungs: Sequence[int | None]) -> tuple[int, ...]:
    """Concrete, strictly increasing rung sizes for a split of `n_total` queries: None stands
    for the full split, sizes >= `n_total` are dropped and the full split always ends the
    schedule. ValueError for a size < 1, a None before the last rung, an empty split or sizes
    that do not increase."""
    if n_total < 1:
        raise ValueError(f"the split has no queries (n_total={n_total})")
    if any(r is None for r in rungs[:-1]):
        raise ValueError(f"rung sizes: only the last may be None (full), got {list(rungs)}")
    sizes = [int(r) for r in rungs if r is not None]
    if any(s < 1 for s in sizes):
        raise ValueError(f"rung sizes must be >= 1, got {list(rungs)}")
    if any(b <= a for a, b in zip(sizes, sizes[1:], strict=False)):
        raise ValueError(f"rung sizes must increase, got {list(rungs)}")
    return (*[s for s in sizes if s < n_total], n_total)
