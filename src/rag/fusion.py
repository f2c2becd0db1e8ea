"""Score fusion and MMR re-selection.

- `normalise`: min-max to [0, 1] or z-score; a single hit or all-equal scores map to 1.0 (min-max)
  or 0.0 (z-score) so that one list never dominates by a division by ~0.
- `fuse_scores`: convex combination sum_i w_i * norm_i(score) over the union of hits. A passage
  missing from list i gets list i's minimum normalised value (it scored no better than that
  list's worst retrieved passage), which keeps single-list evidence from being over-rewarded.
  `method="rrf"` ignores scores: sum_i w_i / (rrf_k + rank_i), absent lists contribute 0.
- `mmr_select`: maximal marginal relevance over unit vectors.
Ties are broken by passage id so results are deterministic.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from rag.errors import ConfigError
from rag.types import Hit


def normalise(scores: Sequence[float], method: str = "minmax") -> np.ndarray:
    s = np.asarray(scores, dtype=np.float64)
    if s.size == 0:
        return s
    if method == "minmax":
        lo, hi = s.min(), s.max()
        return np.ones_like(s) if hi - lo < 1e-12 else (s - lo) / (hi - lo)
    if method == "zscore":
        sd = s.std()
        return np.zeros_like(s) if sd < 1e-12 else (s - s.mean()) / sd
    raise ConfigError("normalisation", f"unknown method {method!r} (minmax | zscore | rrf)")


def fuse_scores(hit_lists: Sequence[Sequence[Hit]], weights: Sequence[float],
                method: str = "minmax", rrf_k: int = 60, top_n: int | None = None) -> list[Hit]:
    """Fuse ranked lists into one, best first (see module doc for the exact rules)."""
    if len(hit_lists) != len(weights):
        raise ConfigError("weights", "need one weight per hit list")
    if any(w < 0 for w in weights):
        raise ConfigError("weights", "must be >= 0")
    fused: dict[str, float] = {}
    if method == "rrf":
        for hits, w in zip(hit_lists, weights, strict=True):
            for rank, h in enumerate(hits, 1):
                fused[h.id] = fused.get(h.id, 0.0) + w / (rrf_k + rank)
    else:
        ids = {h.id for hits in hit_lists for h in hits}
        for hits, w in zip(hit_lists, weights, strict=True):
            if not hits:
                continue
            norm = normalise([h.score for h in hits], method)
            floor = float(norm.min())
            per = {h.id: float(v) for h, v in zip(hits, norm, strict=True)}
            for pid in ids:
                fused[pid] = fused.get(pid, 0.0) + w * per.get(pid, floor)
    out = sorted((Hit(s, pid) for pid, s in fused.items()), key=lambda h: (-h.score, h.id))
    return out[:top_n] if top_n else out


def hybrid_fuse(bm25_hits: Sequence[Hit], dense_hits: Sequence[Hit], w: float,
                method: str = "minmax", rrf_k: int = 60, top_n: int | None = None) -> list[Hit]:
    """RAGConfig.fusion_weight semantics: `w` on dense, `1 - w` on bm25."""
    if not 0.0 <= w <= 1.0:
        raise ConfigError("fusion_weight", f"must be in [0, 1], got {w}")
    return fuse_scores([bm25_hits, dense_hits], [1.0 - w, w], method, rrf_k, top_n)


def mmr_select(query_vec: np.ndarray, cand_ids: Sequence[str], cand_vecs: np.ndarray,
               relevance: Sequence[float], k: int, lam: float) -> list[str]:
    """Pick k ids greedily by lam * rel - (1 - lam) * max cosine to those already picked.

    `relevance` is min-max normalised first, so lam trades like for like; lam = 1 returns the
    relevance order. `query_vec` is accepted for callers that score relevance by cosine.
    """
    if not 0.0 <= lam <= 1.0:
        raise ConfigError("mmr_lambda", f"must be in [0, 1], got {lam}")
    n = len(cand_ids)
    if n == 0 or k <= 0:
        return []
    rel = normalise(relevance, "minmax")
    order = sorted(range(n), key=lambda i: (-rel[i], cand_ids[i]))
    if lam >= 1.0:
        return [cand_ids[i] for i in order[:k]]
    vecs = np.asarray(cand_vecs, dtype=np.float64)
    sims = vecs @ vecs.T
    chosen: list[int] = []
    max_sim = np.full(n, -np.inf)
    remaining = set(range(n))
    while remaining and len(chosen) < k:
        best = max(remaining, key=lambda i: (
            lam * rel[i] - (1 - lam) * (max_sim[i] if chosen else 0.0), -order.index(i)))
        chosen.append(best)
        remaining.discard(best)
        max_sim = np.maximum(max_sim, sims[best])
    return [cand_ids[i] for i in chosen]
