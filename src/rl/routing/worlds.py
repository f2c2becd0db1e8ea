"""What the per-query policy is trained and scored against: a `QueryWorld` answers "what does
config c get on query i" with an `Outcome` (tuner reward, quality, cost).

`EvaluatorWorld` is the real one: queries `idx` of a split of a `TunerEvaluator`'s data; the
outcome of (config, query) is read from the evaluator's lazy per-(config, query) rows
(`TunerEvaluator.table`, computed on first use and cached in memory and SQLite):
    reward  = `TunerEvaluator.per_query_reward` (alpha F + beta R minus latency and cost terms)
    quality = `RewardSpec.quality(F, R)` (alpha F + beta R, abstentions scored by answerability)
    cost    = tokens (in + out) / C_ref (`TunerSettings.cost_ref_tokens`), the Lagrangian cost.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

import numpy as np

from rag.config import RAGConfig


@dataclass(frozen=True)
class Outcome:
    reward: float
    quality: float
    cost: float
    """Tokens / C_ref."""


class QueryWorld(Protocol):
    n: int
    """Queries, addressed 0 .. n-1."""
    cost_ref: float
    """Tokens per unit of cost (C_ref)."""

    def outcome(self, i: int, config: RAGConfig) -> Outcome: ...

    def outcomes(self, configs: Sequence[RAGConfig]) -> list[Outcome]:
        """configs[i] on query i, for every query (batched where the world can)."""
        ...


@dataclass(frozen=True)
class RoleData:
    """One role's queries (train, or valid for model selection) as `PerQueryPPO.train` reads
    them: `world` (a QueryWorld: the outcome of any config on each query), `X` (the raw
    `QueryFeaturizer` features, one row per query of `world`; the policy standardises them)
    and `base` (the base policy's config per query, what the `defer` head hands a query to:
    required, one per row of `X`, when the layout has that head, else None; `train` raises a
    ValueError naming `train.base` or `valid.base` otherwise)."""

    world: QueryWorld
    X: np.ndarray
    base: Sequence[RAGConfig] | None = None


class EvaluatorWorld:
    """Queries `idx` (default: all) of `split` of `ev`'s data (module docstring)."""

    def __init__(self, ev, split: str, idx: Sequence[int] | None = None):
        self.ev, self.split = ev, split
        self.idx = np.arange(len(ev.data.examples(split))) if idx is None else np.asarray(idx)
        self.n = len(self.idx)
        self.cost_ref = float(ev.policy.cost_ref_tokens)
        self._cache: dict[tuple[str, int], Outcome] = {}

    def _read(self, config: RAGConfig, qs: Sequence[int]) -> dict[int, Outcome]:
        tab = dict(self.ev.table(config, self.split, qs))
        n = len(tab["tokens"])
        for name in (self.ev.slice.faithfulness, self.ev.slice.relevancy):
            # a metric no computed row of this config has yet (e.g. `support` is absent from
            # a row whose answer cites nothing) is NaN, which the reward leaves out
            tab.setdefault(name, np.full(n, np.nan))
        R = self.reward(tab)
        Q = self.ev.per_query_quality(tab)
        return {q: Outcome(float(R[q]), float(Q[q]), float(tab["tokens"][q]) / self.cost_ref)
                for q in qs}

    def reward(self, tab: dict) -> np.ndarray:
        """Per-query reward of a config's table (`TunerEvaluator.per_query_reward`; a world
        that prices differently overrides this)."""
        return self.ev.per_query_reward(tab)

    def outcome(self, i: int, config: RAGConfig) -> Outcome:
        key = (config.config_hash, int(i))
        got = self._cache.get(key)
        if got is None:
            q = int(self.idx[i])
            got = self._cache[key] = self._read(config, [q])[q]
        return got

    def outcomes(self, configs: Sequence[RAGConfig]) -> list[Outcome]:
        groups: dict[str, list[int]] = defaultdict(list)
        by_hash = {}
        for i, c in enumerate(configs):
            if (c.config_hash, i) not in self._cache:
                groups[c.config_hash].append(i)
                by_hash[c.config_hash] = c
        for h, rows in groups.items():
            got = self._read(by_hash[h], [int(self.idx[i]) for i in rows])
            for i in rows:
                self._cache[(h, i)] = got[int(self.idx[i])]
        return [self._cache[(c.config_hash, i)] for i, c in enumerate(configs)]


class TableWorld:
    """Queries of a computed (queries x configs) table: the outcome of `configs[j]` on query i
    is (R[i, j], Q[i, j], T[i, j] / cost_ref), a lookup (e.g. `rl.routing.train.prepare`'s
    per-role matrices over the portfolio). A config not in `configs` is a ValueError naming
    its hash."""

    def __init__(self, R: np.ndarray, Q: np.ndarray, T: np.ndarray,
                 configs: Sequence[RAGConfig], cost_ref: float):
        R, Q, T = (np.asarray(a, np.float64) for a in (R, Q, T))
        if not R.shape == Q.shape == T.shape or R.ndim != 2 or R.shape[1] != len(configs):
            raise ValueError(f"R, Q, T must be (queries x {len(configs)}) alike, got "
                             f"{R.shape}, {Q.shape}, {T.shape}")
        self.R, self.Q, self.T = R, Q, T
        self.n = len(R)
        self.cost_ref = float(cost_ref)
        self._col = {c.config_hash: j for j, c in enumerate(configs)}

    def outcome(self, i: int, config: RAGConfig) -> Outcome:
        j = self._col.get(config.config_hash)
        if j is None:
            raise ValueError(f"config {config.config_hash} is not a column of the table")
        return Outcome(float(self.R[i, j]), float(self.Q[i, j]), float(self.T[i, j]) / self.cost_ref)

    def outcomes(self, configs: Sequence[RAGConfig]) -> list[Outcome]:
        return [self.outcome(i, c) for i, c in enumerate(configs)]


class ConcatWorld:
    """Several worlds as one: query i of the first, then of the second, ... (a role that
    spans splits, e.g. a cross-fitted fold's train part made of train, valid and test
    queries). All parts must price cost alike (one `cost_ref`)."""

    def __init__(self, parts: Sequence[QueryWorld]):
        if not parts:
            raise ValueError("ConcatWorld needs at least one world")
        refs = {float(p.cost_ref) for p in parts}
        if len(refs) != 1:
            raise ValueError(f"worlds price cost differently (cost_ref {sorted(refs)})")
        self.parts = list(parts)
        self.cost_ref = refs.pop()
        self._starts = np.cumsum([0] + [p.n for p in self.parts])
        self.n = int(self._starts[-1])

    def _locate(self, i: int) -> tuple[int, int]:
        if not 0 <= i < self.n:
            raise IndexError(f"query {i} outside 0..{self.n - 1}")
        j = int(np.searchsorted(self._starts, i, side="right")) - 1
        return j, i - int(self._starts[j])

    def outcome(self, i: int, config: RAGConfig) -> Outcome:
        j, k = self._locate(int(i))
        return self.parts[j].outcome(k, config)

    def outcomes(self, configs: Sequence[RAGConfig]) -> list[Outcome]:
        if len(configs) != self.n:
            raise ValueError(f"{len(configs)} configs for {self.n} queries")
        out: list[Outcome] = []
        for j, p in enumerate(self.parts):
            out += p.outcomes(configs[self._starts[j]:self._starts[j + 1]])
        return out
