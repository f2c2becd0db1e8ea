"""State features of the tuner env.

A state says how the system is doing and what it runs now:
  quality     rolling means of F and R over the last `window` steps
  cost        the last step's p50 and p95 latency (÷ the latency gate T) and cost (÷ C_ref),
              the last reward
  config      the current config (`ConfigSpace.one_hot`: one-hot variant / rerank / prompt, scaled
              k index and weight, then each extra head one-hot or scaled to its bounds)
  workload    the batch's category mix (share of each dataset category)
  corpus      log10 passages, and corpus age in days (0 when the corpus carries no timestamp)
  time        the step's position in the episode
The numeric block is robust-scaled ((x − median) / (IQR/1.349)), with statistics the env refits
at each episode start from the states it has seen (no extra evaluations), and clipped to ±3;
one-hot and share features are left as they are.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Sequence

import numpy as np

N_NUMERIC = 6  # F mean, R mean, p50/T, p95/T, cost/C_ref, reward


class RobustScaler:
    def __init__(self, clip: float = 3.0):
        self.clip = clip
        self.center: np.ndarray | None = None
        self.scale: np.ndarray | None = None

    def fit(self, x: np.ndarray) -> RobustScaler:
        x = np.asarray(x, dtype=np.float64)
        self.center = np.median(x, axis=0)
        q75, q25 = np.percentile(x, [75, 25], axis=0)
        iqr = (q75 - q25) / 1.349
        sd = x.std(axis=0)
        # constant or near-constant features: fall back to the std, then to 1
        self.scale = np.where(iqr > 1e-9, iqr, np.where(sd > 1e-9, sd, 1.0))
        return self

    def transform(self, x: np.ndarray) -> np.ndarray:
        if self.center is None:
            return np.clip(x, -self.clip, self.clip)
        return np.clip((x - self.center) / self.scale, -self.clip, self.clip)


class StateTracker:
    """Keeps the recent steps and turns them into an observation vector."""

    def __init__(self, categories: Sequence[str], config_dim: int, n_passages: int,
                 latency_gate_ms: float, cost_ref: float, window: int = 5,
                 corpus_age_days: float = 0.0):
        self.categories = list(categories)
        self.config_dim = config_dim
        self.T, self.C = latency_gate_ms, cost_ref
        self.window = window
        self.corpus = np.array([np.log10(max(n_passages, 1)), corpus_age_days / 365.0],
                               dtype=np.float32)
        self.scaler = RobustScaler()
        self.reset()

    @property
    def dim(self) -> int:
        return N_NUMERIC + self.config_dim + len(self.categories) + 2 + 1

    def reset(self) -> None:
        self.hist: deque[tuple[float, float]] = deque(maxlen=self.window)
        self.last = np.zeros(4, dtype=np.float64)  # p50/T, p95/T, cost/C, reward

    def numeric(self) -> np.ndarray:
        fr = np.mean(self.hist, axis=0) if self.hist else np.zeros(2)
        return np.concatenate([fr, self.last])

    def update(self, F: float, R: float, p50: float, p95: float, cost: float,
               reward: float) -> None:
        self.hist.append((F, R))
        self.last = np.array([p50 / self.T, p95 / self.T, cost / self.C, reward])

    def observe(self, config_vec: np.ndarray, batch_categories: Sequence[str],
                progress: float) -> np.ndarray:
        mix = np.zeros(len(self.categories), dtype=np.float32)
        if batch_categories:
            for c in batch_categories:
                if c in self.categories:
                    mix[self.categories.index(c)] += 1
            mix /= len(batch_categories)
        num = self.scaler.transform(self.numeric())
        return np.concatenate([num, config_vec, mix, self.corpus, [progress]]).astype(
            np.float32)
