"""What a tuning run reads of any method (`TuneResult`: PPO's own, a search's
`ask_tell.SearchResult.to_tune_result()`), and PPO's incumbent rule."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from rag.config import RAGConfig


@dataclass
class TuneResult:
    """What any method returns to `rl.tuner.run`: the config it recommends, its evaluations
    (PPO: env steps; a search: rung results), their curve, wall seconds and method extras."""

    method: str
    best_config: RAGConfig
    evaluations: int
    curve: list[dict[str, Any]] = field(default_factory=list)
    """One entry per evaluation: {"eval": i, "reward": r, "config_hash": h, "best_so_far": b}."""
    wall_s: float = 0.0
    extra: dict[str, Any] = field(default_factory=dict)


def curve_from_history(history: list[dict[str, Any]]) -> list[dict[str, Any]]:
    best = -np.inf
    out = []
    for i, h in enumerate(history, 1):
        best = max(best, h["reward"])
        out.append({"eval": i, "reward": h["reward"], "config_hash": h["config_hash"],
                    "best_so_far": best})
    return out


class Incumbent:
    """The incumbent of a run: among the configs evaluated so far, the one with the best mean
    observed reward (every evaluation of a config on a batch is one observation). Ties on the
    mean go to the config observed more often (more evidence), then to the one evaluated
    first: deterministic for a given sequence of observations.

        inc = Incumbent()
        inc.add("9c1d", 0.41); inc.add("7be0", 0.47); inc.add("9c1d", 0.55)
        inc.best()   # ("9c1d", 0.48)
    """

    def __init__(self) -> None:
        self._rewards: dict[str, list[float]] = {}  # insertion order = first evaluation
        self._means: dict[str, float] = {}

    def add(self, config_hash: str, reward: float) -> None:
        r = self._rewards.setdefault(config_hash, [])
        r.append(float(reward))
        self._means[config_hash] = float(np.mean(r))

    def __len__(self) -> int:
        """Distinct configs observed."""
        return len(self._rewards)

    def best(self) -> tuple[str, float]:
        """(config hash, its mean observed reward). ValueError when nothing was observed."""
        if not self._rewards:
            raise ValueError("no config evaluated yet: no incumbent")
        # max keeps the first of equal keys, and dicts iterate in first-evaluation order
        h = max(self._means, key=lambda k: (self._means[k], len(self._rewards[k])))
        return h, self._means[h]


def incumbent(history: Iterable[Mapping[str, Any]]) -> tuple[str, float]:
    """`Incumbent.best` of a history of evaluations ({"config_hash", "reward"} each)."""
    inc = Incumbent()
    for h in history:
        inc.add(h["config_hash"], h["reward"])
    return inc.best()
