"""What every tuner (PPO or a baseline) returns."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from rag.config import RAGConfig


@dataclass
class TuneResult:
    """What any tuner (PPO or a baseline) returns."""

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
