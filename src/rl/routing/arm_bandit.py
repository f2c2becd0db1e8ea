"""The Serve app's bandit router (`serving.traffic`, bandit mode): UCB1 and Gaussian Thompson
sampling over served configs (arms, named by config hash), learning from `/feedback` rewards.

Rewards are assumed bounded (tuner rewards lie in about [-3, 1]; user feedback in [0, 1]).
Both learners keep per-arm pulls and reward sums, so the serving router can persist and reload
them, and report `leaderboard()` rows with a normal-approximation 95% CI per arm.

    b = UCB1(["a", "b"], c=2.0)        b = Thompson(["a", "b"], prior_mean=0.5, prior_sd=0.5)
    arm = b.select(rng)                 b.update(arm, reward)
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from rag.errors import ConfigError


@dataclass
class ArmStats:
    pulls: int = 0
    total: float = 0.0
    total_sq: float = 0.0

    @property
    def mean(self) -> float:
        return self.total / self.pulls if self.pulls else float("nan")

    @property
    def sd(self) -> float:
        if self.pulls < 2:
            return float("nan")
        var = (self.total_sq - self.total ** 2 / self.pulls) / (self.pulls - 1)
        return math.sqrt(max(var, 0.0))


class Bandit:
    def __init__(self, arms: Sequence[str]):
        if not arms:
            raise ConfigError("arms", "need at least one arm")
        if len(set(arms)) != len(arms):
            raise ConfigError("arms", "arm names must be unique")
        self.arms = list(arms)
        self.stats = {a: ArmStats() for a in self.arms}

    def update(self, arm: str, reward: float) -> None:
        if arm not in self.stats:
            raise ConfigError("arm", f"unknown arm {arm!r}")
        if not math.isfinite(reward):
            raise ConfigError("reward", "must be a finite number")
        s = self.stats[arm]
        s.pulls += 1
        s.total += reward
        s.total_sq += reward * reward

    def select(self, rng: np.random.Generator) -> str:
        raise NotImplementedError

    def probabilities(self, rng: np.random.Generator, n: int = 2000) -> dict[str, float]:
        """Propensity of each arm under the current state (Monte-Carlo for Thompson)."""
        counts = {a: 0 for a in self.arms}
        for _ in range(n):
            counts[self.select(rng)] += 1
        return {a: c / n for a, c in counts.items()}

    def best(self) -> str:
        """The arm with the highest mean among pulled arms."""
        pulled = [a for a in self.arms if self.stats[a].pulls]
        if not pulled:
            return self.arms[0]
        return max(pulled, key=lambda a: (self.stats[a].mean, self.stats[a].pulls))

    def leaderboard(self) -> list[dict[str, float | int | str]]:
        rows = []
        for a in self.arms:
            s = self.stats[a]
            half = 1.96 * s.sd / math.sqrt(s.pulls) if s.pulls >= 2 else float("nan")
            rows.append({"arm": a, "pulls": s.pulls, "mean_reward": s.mean,
                         "ci_low": s.mean - half, "ci_high": s.mean + half})
        return sorted(rows, key=lambda r: -np.nan_to_num(r["mean_reward"], nan=-np.inf))


class UCB1(Bandit):
    """Pull every arm once, then argmax mean + c·sqrt(ln N / n)."""

    def __init__(self, arms: Sequence[str], c: float = math.sqrt(2.0)):
        super().__init__(arms)
        if c < 0:
            raise ConfigError("c", "must be >= 0")
        self.c = c

    def select(self, rng: np.random.Generator) -> str:
        unpulled = [a for a in self.arms if self.stats[a].pulls == 0]
        if unpulled:
            return unpulled[int(rng.integers(len(unpulled)))]
        total = sum(s.pulls for s in self.stats.values())
        scores = [self.stats[a].mean + self.c * math.sqrt(math.log(total) / self.stats[a].pulls)
                  for a in self.arms]
        best = max(scores)
        ties = [a for a, s in zip(self.arms, scores, strict=True) if s >= best - 1e-12]
        return ties[int(rng.integers(len(ties)))]


class Thompson(Bandit):
    """Gaussian Thompson sampling: prior N(prior_mean, prior_sd²) on each arm's mean, known
    noise sd `noise_sd`; posterior sampled per selection."""

    def __init__(self, arms: Sequence[str], prior_mean: float = 0.5, prior_sd: float = 0.5,
                 noise_sd: float = 0.25):
        super().__init__(arms)
        if prior_sd <= 0 or noise_sd <= 0:
            raise ConfigError("prior_sd" if prior_sd <= 0 else "noise_sd", "must be > 0")
        self.prior_mean, self.prior_sd, self.noise_sd = prior_mean, prior_sd, noise_sd

    def posterior(self, arm: str) -> tuple[float, float]:
        s = self.stats[arm]
        prec = 1.0 / self.prior_sd ** 2 + s.pulls / self.noise_sd ** 2
        mean = (self.prior_mean / self.prior_sd ** 2 + s.total / self.noise_sd ** 2) / prec
        return mean, math.sqrt(1.0 / prec)

    def select(self, rng: np.random.Generator) -> str:
        draws = [rng.normal(*self.posterior(a)) for a in self.arms]
        return self.arms[int(np.argmax(draws))]
