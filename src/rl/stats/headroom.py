"""How much a per-query (or per-segment) choice of config could gain over one static config.

Every function takes a reward matrix `R` of shape (n queries × C configs): `R[i, j]` is query
i's reward under config j (the tuner's per-query reward, any units), and returns plain numpy
values. Nothing here runs a pipeline: the caller (`rl.routing.train`) builds the matrices from
the tuner's per-query tables. Ties are broken towards the lower config index (numpy argmax), so
every answer is deterministic.

- `best_static`: the config with the highest mean reward (the ceiling of any static choice).
- `oracle_choice`: each query's best config (the ceiling of any per-query policy).
- `equal_cost_oracle`: the per-query oracle held to a mean cost budget (Lagrangian, bisection).
- `segment_choice` / `segment_values`: the best config per segment, chosen in-sample.
- `crossfit_segment_gain`: the same chosen on one half of the queries and scored on the other.
- `fold_assignment` / `group_folds`: folds stratified by label, or whole groups (conversations)
  dealt to the emptiest fold, for cross-fitting.
- `rung_spearman`: rank agreement of configs' means on m-query subsets with the full means.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np
from numpy.typing import ArrayLike
from scipy.stats import rankdata

from rag.errors import ConfigError


def _matrix(name: str, x: ArrayLike) -> np.ndarray:
    m = np.asarray(x, dtype=np.float64)
    if m.ndim != 2 or m.shape[0] < 1 or m.shape[1] < 1:
        raise ConfigError(name, f"must be a non-empty (queries × configs) matrix, got shape "
                                f"{m.shape}")
    if not np.all(np.isfinite(m)):
        raise ConfigError(name, "contains NaN or infinite values")
    return m


def best_static(R: ArrayLike) -> int:
    """Column of `R` with the highest mean over queries (first on ties)."""
    return int(np.argmax(_matrix("R", R).mean(axis=0)))


def oracle_choice(R: ArrayLike) -> np.ndarray:
    """Per query, the column with the highest reward (n ints; first on ties)."""
    return np.argmax(_matrix("R", R), axis=1)


def pick(M: ArrayLike, choice: ArrayLike) -> np.ndarray:
    """`M[i, choice[i]]` for every row i: a per-query value under per-query choices."""
    M = np.asarray(M, dtype=np.float64)
    return M[np.arange(M.shape[0]), np.asarray(choice, dtype=np.int64)]


def equal_cost_oracle(R: ArrayLike, cost: ArrayLike, budget: float, iters: int = 200
                      ) -> tuple[np.ndarray, float]:
    """The per-query oracle whose mean cost stays <= `budget`: per query the column that
    maximises `R − mu·cost`, with mu >= 0 the smallest multiplier (bisection) that meets the
    budget. `cost` has R's shape (e.g. tokens per query); `budget` in the same units.

    Returns (choice: n column indices, mu). mu = 0 when the unconstrained oracle already meets
    the budget. Raises when no choice can meet it (the per-query cheapest columns cost more on
    average than `budget`). The mean cost of the Lagrangian choice falls as mu grows, so the
    bisection keeps an upper end that always meets the budget and returns its choice; with
    discrete columns some budget may stay unspent (the Lagrangian's duality gap)."""
    R, C = _matrix("R", R), _matrix("cost", cost)
    if R.shape != C.shape:
        raise ConfigError("cost", f"must have R's shape {R.shape}, got {C.shape}")

    def choose(mu: float) -> np.ndarray:
        return np.argmax(R - mu * C, axis=1)

    def spend(mu: float) -> float:
        return float(pick(C, choose(mu)).mean())

    if spend(0.0) <= budget:
        return choose(0.0), 0.0
    if C.min(axis=1).mean() > budget + 1e-12:
        raise ConfigError("budget", f"{budget} is below the mean of the cheapest choices "
                                    f"({C.min(axis=1).mean():.6g})")
    # above hi = (reward spread) / (smallest cost step) every query takes its cheapest column
    steps = np.diff(np.unique(C))
    hi = (R.max() - R.min() + 1.0) / (steps.min() if steps.size else 1.0)
    while spend(hi) > budget:  # ties among the cheapest columns; doubling settles them
        hi *= 2.0
    hi = lowest_price(spend, budget, hi, iters, rel_tol=1e-12)
    return choose(hi), float(hi)


def lowest_price(spend: Callable[[float], float], budget: float, hi: float, iters: int,
                 rel_tol: float = 0.0) -> float:
    """Bisection on [0, `hi`] for the lowest price mu with `spend(mu)` <= `budget`, given that
    `spend(hi)` <= `budget` and spend falls as the price rises; `iters` halvings at most,
    stopping early once the bracket is within `rel_tol` of `hi`. Returns the feasible end."""
    lo = 0.0
    for _ in range(iters):
        mid = 0.5 * (lo + hi)
        if spend(mid) <= budget:
            hi = mid
        else:
            lo = mid
        if hi - lo <= rel_tol * max(hi, 1e-300):
            break
    return float(hi)


def _labels(labels: Sequence, n: int) -> np.ndarray:
    lab = np.asarray([str(x) for x in labels])
    if lab.size != n:
        raise ConfigError("labels", f"needs one label per query ({n}), got {lab.size}")
    return lab


def segment_choice(R: ArrayLike, labels: Sequence) -> dict[str, int]:
    """Per segment label, the column with the highest mean over that segment's queries."""
    R = _matrix("R", R)
    lab = _labels(labels, R.shape[0])
    return {s: int(np.argmax(R[lab == s].mean(axis=0))) for s in sorted(set(lab.tolist()))}


def segment_values(R: ArrayLike, labels: Sequence, choice: dict[str, int],
                   fallback: int | None = None) -> np.ndarray:
    """Per query, its reward under its segment's chosen column (`fallback` for a segment
    `choice` does not name; without one such a segment raises)."""
    R = _matrix("R", R)
    lab = _labels(labels, R.shape[0])
    cols = []
    for s in lab.tolist():
        if s not in choice and fallback is None:
            raise ConfigError("labels", f"segment {s!r} has no chosen config")
        cols.append(choice.get(s, fallback))
    return pick(R, cols)


def fold_assignment(labels: Sequence, n_folds: int, seed: int) -> np.ndarray:
    """A fold (0..n_folds−1) per query, stratified by label: each segment's queries are
    shuffled (`np.random.default_rng(seed)`) and dealt round-robin, starting at a random fold,
    so every segment of at least n_folds queries appears in every fold."""
    lab = np.asarray([str(x) for x in labels])
    rng = np.random.default_rng(seed)
    folds = np.empty(lab.size, dtype=np.int64)
    for s in sorted(set(lab.tolist())):
        idx = np.flatnonzero(lab == s)
        idx = idx[rng.permutation(idx.size)]
        folds[idx] = (np.arange(idx.size) + rng.integers(n_folds)) % n_folds
    return folds


def group_folds(groups: Sequence[str], k: int, seed: int = 0) -> np.ndarray:
    """Fold (0 .. k-1) of each row: groups shuffled (seeded) and dealt to the fold with the
    fewest rows so far, so a group never straddles folds."""
    labels = [str(g) for g in groups]
    uniq = sorted(set(labels))
    if len(uniq) < k:
        raise ConfigError("groups", f"{len(uniq)} groups cannot fill {k} folds")
    rng = np.random.default_rng(seed)
    size = {g: 0 for g in uniq}
    for g in labels:
        size[g] += 1
    fold_of, load = {}, np.zeros(k, dtype=np.int64)
    for j in rng.permutation(len(uniq)):
        f = int(np.argmin(load))
        fold_of[uniq[j]] = f
        load[f] += size[uniq[j]]
    return np.array([fold_of[g] for g in labels], dtype=np.int64)


def crossfit_segment_gain(R: ArrayLike, labels: Sequence, n_folds: int = 2, repeats: int = 10,
                          seed: int = 0) -> np.ndarray:
    """Per query, the out-of-fold gain of a per-segment choice over a static one: on each of
    `n_folds` stratified folds (`fold_assignment`), the best column per segment and the best
    column overall are chosen on the other folds' queries and both are scored on this fold's
    queries (a segment with no query outside the fold takes the overall choice). Averaged over
    `repeats` fold assignments (seeds seed, seed+1, ...). Returns n gains (reward units); their
    mean is the cross-fitted per-segment headroom, free of the in-sample selection bias."""
    R = _matrix("R", R)
    lab = _labels(labels, R.shape[0])
    gain = np.zeros(R.shape[0])
    for rep in range(repeats):
        folds = fold_assignment(lab, n_folds, seed + rep)
        for f in range(n_folds):
            train, test = folds != f, folds == f
            if not train.any() or not test.any():
                continue
            overall = best_static(R[train])
            seg = segment_choice(R[train], lab[train])
            seg_val = segment_values(R[test], lab[test], seg, fallback=overall)
            gain[test] += seg_val - R[test, overall]
    return gain / repeats


def rung_spearman(R: ArrayLike, m: int, n_subsets: int = 20, seed: int = 0,
                  score: Callable[[np.ndarray], np.ndarray] | None = None) -> np.ndarray:
    """Spearman correlation, over the configs (columns), between their score on a random
    m-query subset (without replacement) and on all queries; one value per subset
    (`n_subsets`, drawn from `np.random.default_rng(seed)`). The score of query indices `idx`
    is `score(idx)` (one value per column, e.g. a batch reward with gates), by default the
    mean of `R[idx]`. Ties take average ranks; a subset whose scores are all equal gives NaN
    (no ranking)."""
    R = _matrix("R", R)
    n = R.shape[0]
    if not 1 <= m <= n:
        raise ConfigError("m", f"must be in [1, {n}] (the queries), got {m}")
    if score is None:
        def score(idx: np.ndarray) -> np.ndarray:
            return R[idx].mean(axis=0)
    full = rankdata(score(np.arange(n)))
    rng = np.random.default_rng(seed)
    out = np.empty(n_subsets)
    for s in range(n_subsets):
        sub = rankdata(score(np.sort(rng.choice(n, size=m, replace=False))))
        out[s] = _pearson(sub, full)
    return out


def _pearson(a: np.ndarray, b: np.ndarray) -> float:
    a, b = a - a.mean(), b - b.mean()
    den = np.sqrt((a * a).sum() * (b * b).sum())
    return float((a * b).sum() / den) if den > 0 else float("nan")
