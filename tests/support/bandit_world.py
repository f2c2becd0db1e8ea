"""Test support: a seeded synthetic contextual bandit with a known reward function, for testing
off-policy evaluation (`rl.stats.ope`).

World: contexts x ~ N(0, I_dim); action k (one of `n_actions` configs) succeeds with probability
q(x, k) = sigmoid(scale * x . theta_k + bias_k) and the logged reward is r ~ Bernoulli(q), so
r is in {0, 1} and E[r | x, k] = q(x, k). The logging policy is a softmax over a noisy copy of
the true logits mixed with `epsilon` uniform exploration, so every propensity is at least
epsilon / n_actions and is known exactly. A policy is any callable mapping an (n, dim) context
matrix to an (n, n_actions) matrix of action probabilities (rows sum to 1).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from rag.errors import ConfigError

Policy = Callable[[np.ndarray], np.ndarray]


def _softmax(logits: np.ndarray, temperature: float) -> np.ndarray:
    z = logits / temperature
    z = np.exp(z - z.max(axis=1, keepdims=True))
    return z / z.sum(axis=1, keepdims=True)


@dataclass(frozen=True)
class LoggedBandit:
    """Logged data: contexts `x` (n, dim), actions `a` (n,) int, propensities `p` = pi0(a|x),
    rewards `r` in {0, 1}, and the full logging distribution `pi0` (n, n_actions)."""

    x: np.ndarray
    a: np.ndarray
    p: np.ndarray
    r: np.ndarray
    pi0: np.ndarray

    @property
    def n(self) -> int:
        return int(self.a.size)


class BanditSimulator:
    """Seeded world (see module doc). The same `seed` gives the same reward function, logging
    policy and evaluation contexts; `sample(n, seed)` draws a logged data set.

    `true_value(policy)` is the exact expected reward of `policy` given a context, averaged over
    a fixed sample of `n_eval` contexts (reward noise integrated out exactly), so its error as
    the population value is about 0.5 / sqrt(n_eval) (~0.001 at the default 200k)."""

    def __init__(self, n_actions: int = 5, dim: int = 5, seed: int = 0, *, scale: float = 1.5,
                 epsilon: float = 0.1, logging_noise: float = 1.0,
                 logging_temperature: float = 1.0, n_eval: int = 200_000):
        if n_actions < 2:
            raise ConfigError("n_actions", f"must be >= 2, got {n_actions}")
        if dim < 1:
            raise ConfigError("dim", f"must be >= 1, got {dim}")
        if not 0.0 < epsilon <= 1.0:
            raise ConfigError("epsilon", f"must be in (0, 1], got {epsilon}")
        if logging_temperature <= 0:
            raise ConfigError("logging_temperature", "must be > 0")
        rng = np.random.default_rng(seed)
        self.seed, self.n_actions, self.dim, self.epsilon = seed, n_actions, dim, epsilon
        self.logging_temperature = logging_temperature
        self.theta = scale * rng.normal(0.0, 1.0 / np.sqrt(dim), size=(n_actions, dim))
        self.bias = rng.normal(0.0, 0.5, size=n_actions)
        self.logging_theta = self.theta + rng.normal(0.0, logging_noise / np.sqrt(dim),
                                                     size=(n_actions, dim))
        self.eval_x = rng.normal(size=(n_eval, dim))

    def logits(self, x: np.ndarray) -> np.ndarray:
        return np.asarray(x, dtype=np.float64) @ self.theta.T + self.bias

    def expected_reward(self, x: np.ndarray) -> np.ndarray:
        """q(x, k) = E[r | x, k], shape (n, n_actions)."""
        return 1.0 / (1.0 + np.exp(-self.logits(x)))

    def logging_policy(self, x: np.ndarray) -> np.ndarray:
        """pi0(.|x): (1 - epsilon) softmax(noisy logits / T) + epsilon / n_actions."""
        noisy = np.asarray(x, dtype=np.float64) @ self.logging_theta.T + self.bias
        soft = _softmax(noisy, self.logging_temperature)
        return (1.0 - self.epsilon) * soft + self.epsilon / self.n_actions

    def target_policy(self, temperature: float = 0.5) -> Policy:
        """A good target policy: softmax of the true logits at `temperature` (-> greedy as
        temperature -> 0)."""
        if temperature <= 0:
            raise ConfigError("temperature", "must be > 0")
        return lambda x: _softmax(self.logits(x), temperature)

    def sample(self, n: int, seed: int = 0) -> LoggedBandit:
        """n logged rounds: x ~ N(0, I), a ~ pi0(.|x), r ~ Bernoulli(q(x, a)), drawn from
        default_rng((world seed, seed)) so different worlds never share samples."""
        if n < 1:
            raise ConfigError("n", f"must be >= 1, got {n}")
        rng = np.random.default_rng((self.seed, seed))
        x = rng.normal(size=(n, self.dim))
        pi0 = self.logging_policy(x)
        a = (rng.random(n)[:, None] > np.cumsum(pi0, axis=1)).sum(axis=1)
        a = np.minimum(a, self.n_actions - 1)  # guards against cumsum rounding just below 1
        q = self.expected_reward(x)[np.arange(n), a]
        r = (rng.random(n) < q).astype(np.float64)
        return LoggedBandit(x, a, pi0[np.arange(n), a], r, pi0)

    def true_value(self, policy: Policy) -> float:
        """E_x[sum_k policy(k|x) q(x, k)] over the fixed evaluation contexts."""
        probs = np.asarray(policy(self.eval_x), dtype=np.float64)
        if probs.shape != (self.eval_x.shape[0], self.n_actions):
            raise ConfigError("policy", f"must return shape (n, {self.n_actions}), got "
                                        f"{probs.shape}")
        return float(np.mean(np.sum(probs * self.expected_reward(self.eval_x), axis=1)))
