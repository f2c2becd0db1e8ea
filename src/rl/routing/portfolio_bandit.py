"""Bandits over the arms of a config portfolio (`rl.routing.portfolio`): which config answers a
query, learnt from bandit feedback. (The bandits over the Serve app's variants are
`rl.tuner.bandit`.)

- `LinUCB`: disjoint linear UCB (Li et al. 2010), one ridge regression per arm
  on standardised features plus an intercept. It learns from logged decisions of any logging
  policy (`fit(X, arms, rewards, propensities)`; with ε-greedy logs, `rl.routing.decision_log`)
  and online (`update`). Scores per arm: mean(x) ± alpha·width(x) with width = sqrt(xᵀA⁻¹x):
  `+` (optimism) when it explores online, `−` (pessimism, a lower confidence bound) when a
  policy learnt from logs is deployed, so arms the logs rarely tried do not win on noise.
  Rewards are centred on the logged mean first, so an arm with no data predicts that mean.
- `LinUCBPolicy`: a fitted `LinUCB` as a `rl.routing.base.PerQueryPolicy` (greedy on the LCB).
- `DiscountedUCB` / `SlidingWindowUCB`: non-contextual UCB over configs for a drifting world
  (Garivier & Moulines 2011): past pulls are discounted by `gamma` per step, or forgotten
  after `window` steps, so the learner follows a change of the best arm.

Rewards in [0, 1] (reward units); features are `rl.routing.features` vectors.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from rag.config import RAGConfig
from rag.errors import ConfigError
from rl.routing.base import one_hot


class LinUCB:
    """Disjoint LinUCB over `n_arms` arms and `dim` features (module docstring).

    `l2`: ridge penalty (the prior precision of every arm's coefficients); `alpha`: width
    multiplier used by `select` (online). The feature scaler (mean, sd) is set by the first
    `fit` (or `set_scaler`); until then features are used as given."""

    def __init__(self, n_arms: int, dim: int, alpha: float = 1.0, l2: float = 1.0):
        if n_arms < 1 or dim < 1:
            raise ConfigError("n_arms", f"needs n_arms >= 1 and dim >= 1, got {n_arms}, {dim}")
        if not l2 > 0 or not alpha >= 0:
            raise ConfigError("l2", f"needs l2 > 0 and alpha >= 0, got {l2}, {alpha}")
        self.n_arms, self.dim, self.alpha, self.l2 = int(n_arms), int(dim), alpha, l2
        d = self.dim + 1  # + intercept
        self.A = np.stack([l2 * np.eye(d) for _ in range(self.n_arms)])
        self.b = np.zeros((self.n_arms, d))
        self.n = np.zeros(self.n_arms)
        self.mu, self.sd = np.zeros(self.dim), np.ones(self.dim)
        self.offset = 0.0
        """Reward centre subtracted before fitting (the logged mean reward)."""
        self._inv: tuple[np.ndarray, np.ndarray] | None = None

    # ---- features ------------------------------------------------------------------------
    def set_scaler(self, X: np.ndarray, offset: float = 0.0) -> None:
        X = np.asarray(X, dtype=np.float64)
        self.mu, sd = X.mean(axis=0), X.std(axis=0)
        self.sd = np.where(sd > 1e-9, sd, 1.0)
        self.offset = float(offset)

    def _z(self, X: np.ndarray) -> np.ndarray:
        X = np.atleast_2d(np.asarray(X, dtype=np.float64))
        if X.shape[1] != self.dim:
            raise ConfigError("X", f"has {X.shape[1]} features, the model {self.dim}")
        return np.hstack([(X - self.mu) / self.sd, np.ones((X.shape[0], 1))])

    # ---- learning ------------------------------------------------------------------------
    def update(self, x: np.ndarray, arm: int, reward: float, weight: float = 1.0) -> None:
        """One observation: arm `arm` got `reward` on features `x` (weight: an importance
        weight, 1 for on-policy data)."""
        z = self._z(x)[0]
        self.A[arm] += weight * np.outer(z, z)
        self.b[arm] += weight * (reward - self.offset) * z
        self.n[arm] += 1
        self._inv = None

    def fit(self, X: np.ndarray, arms: np.ndarray, rewards: np.ndarray,
            propensities: np.ndarray | None = None, ips: bool = False) -> LinUCB:
        """Batch-learn from logged decisions (n rounds): sets the scaler and reward centre
        from these logs, then adds every round to its arm's regression. `ips`: weight each
        round by 1 / (M·propensity) (mean weight ~1), which removes the logging policy's
        context-dependent selection bias from each arm's fit at the price of variance; plain
        ε-greedy logs of a *static* arm carry no such bias, so the default is unweighted."""
        X = np.asarray(X, dtype=np.float64)
        a = np.asarray(arms, dtype=np.int64)
        r = np.asarray(rewards, dtype=np.float64)
        if not (X.ndim == 2 and a.shape == r.shape == (X.shape[0],)):
            raise ConfigError("X", f"needs X (n, d), arms (n,), rewards (n,); got {X.shape}, "
                                   f"{a.shape}, {r.shape}")
        if np.any(a < 0) or np.any(a >= self.n_arms):
            raise ConfigError("arms", f"must be in [0, {self.n_arms})")
        w = np.ones(r.size)
        if ips:
            if propensities is None:
                raise ConfigError("propensities", "needed for ips weighting")
            w = 1.0 / (self.n_arms * np.asarray(propensities, dtype=np.float64))
        self.set_scaler(X, float(r.mean()))
        Z = self._z(X)
        for j in range(self.n_arms):
            m = a == j
            if m.any():
                Zj, wj = Z[m], w[m]
                self.A[j] += (Zj * wj[:, None]).T @ Zj
                self.b[j] += Zj.T @ (wj * (r[m] - self.offset))
                self.n[j] += int(m.sum())
        self._inv = None
        return self

    # ---- scoring -------------------------------------------------------------------------
    def _inverses(self) -> tuple[np.ndarray, np.ndarray]:
        """(A⁻¹ (M, d+1, d+1), θ = A⁻¹b (M, d+1)), computed once per fit or update: a served
        pick (the candidate-aware mode scores every request) only multiplies by them."""
        if self._inv is None:
            inv = np.linalg.inv(self.A)
            self._inv = (inv, np.einsum("kij,kj->ki", inv, self.b))
        return self._inv

    def mean_width(self, X: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(predicted reward (n, M), confidence width sqrt(zᵀA⁻¹z) (n, M))."""
        Z = self._z(X)
        inv, theta = self._inverses()
        mean = Z @ theta.T + self.offset
        # zᵀA⁻¹z per arm by batched matmul (BLAS), not a three-operand einsum (faster)
        quad = np.einsum("knj,nj->nk", np.matmul(Z, inv), Z)
        return mean, np.sqrt(np.maximum(quad, 0.0))

    def scores(self, X: np.ndarray, alpha: float | None = None) -> np.ndarray:
        """mean + alpha·width (n, M); a negative alpha gives a lower confidence bound."""
        mean, width = self.mean_width(X)
        return mean + (self.alpha if alpha is None else alpha) * width

    def select(self, x: np.ndarray) -> int:
        """The optimistic (UCB) arm for one feature vector (online exploration)."""
        return int(np.argmax(self.scores(x)[0]))


@dataclass
class LinUCBPolicy:
    """A fitted `LinUCB` deployed greedily on its lower confidence bound mean − beta·width
    (beta = 0: plain predicted reward). A `rl.routing.base.PerQueryPolicy`."""

    model: LinUCB
    arms: Sequence[RAGConfig]
    beta: float = 1.0

    def act(self, X: np.ndarray) -> np.ndarray:
        return np.argmax(self.model.scores(X, -self.beta), axis=1)

    def probs(self, X: np.ndarray) -> np.ndarray:
        return one_hot(self.act(X), len(self.arms))


BETA_GRID = (0.0, 0.25, 0.5, 1.0, 2.0, 4.0)
L2_GRID = (1.0, 10.0, 100.0)


def select_linucb(X_logs: np.ndarray, arms: np.ndarray, rewards: np.ndarray,
                  propensities: np.ndarray, X_valid: np.ndarray, R_valid: np.ndarray,
                  configs: Sequence[RAGConfig], betas: Sequence[float] = BETA_GRID,
                  l2s: Sequence[float] = L2_GRID) -> tuple[LinUCBPolicy, list[dict]]:
    """Fit LinUCB on the logs for each `l2`, deploy it with each `beta`, and keep the pair
    whose greedy choices score the highest mean realised reward on the validation matrix
    `R_valid` (n_valid, M; full information; never the test split). Returns (policy, tried)."""
    tried, best, best_v = [], None, -math.inf
    for l2 in l2s:
        model = LinUCB(len(configs), np.asarray(X_logs).shape[1], l2=l2).fit(
            X_logs, arms, rewards, propensities)
        for beta in betas:
            pol = LinUCBPolicy(model, list(configs), beta)
            ch = pol.act(X_valid)
            v = float(np.asarray(R_valid)[np.arange(ch.size), ch].mean())
            tried.append({"l2": l2, "beta": beta, "valid_reward": v})
            if v > best_v + 1e-12:
                best, best_v = pol, v
    assert best is not None
    return best, tried


# --------------------------------------------------------------------------- drifting world


@dataclass
class DiscountedUCB:
    """Discounted UCB over `n_arms` configs: after every step all counts and reward sums are
    multiplied by `gamma` (in (0, 1]; 1 = plain UCB1), so data `1/(1 − gamma)` steps old
    weighs about 1/e. `select` returns an untried arm first (lowest index), else the argmax of
    mean + c·sqrt(log(total) / count). Rewards in [0, 1]."""

    n_arms: int
    gamma: float = 0.99
    c: float = 0.5
    counts: np.ndarray = field(init=False)
    sums: np.ndarray = field(init=False)

    def __post_init__(self):
        if self.n_arms < 1:
            raise ConfigError("n_arms", f"must be >= 1, got {self.n_arms}")
        if not 0.0 < self.gamma <= 1.0:
            raise ConfigError("gamma", f"must be in (0, 1], got {self.gamma}")
        self.counts = np.zeros(self.n_arms)
        self.sums = np.zeros(self.n_arms)

    def select(self) -> int:
        untried = np.flatnonzero(self.counts <= 1e-12)
        if untried.size:
            return int(untried[0])
        total = float(self.counts.sum())
        ucb = self.sums / self.counts + self.c * np.sqrt(max(math.log(total), 0.0) / self.counts)
        return int(np.argmax(ucb))

    def update(self, arm: int, reward: float) -> None:
        self.counts *= self.gamma
        self.sums *= self.gamma
        self.counts[arm] += 1.0
        self.sums[arm] += float(reward)

    def means(self) -> np.ndarray:
        """Discounted mean reward per arm (NaN for an arm with no weight left)."""
        with np.errstate(invalid="ignore", divide="ignore"):
            return np.where(self.counts > 1e-12, self.sums / self.counts, np.nan)


class SlidingWindowUCB:
    """UCB over the last `window` pulls only (Garivier & Moulines 2011), rewards in [0, 1].

    `select()` returns an arm not pulled within the window first (drawn uniformly among them
    from `np.random.default_rng(seed)`), else the argmax of
    mean + c·sqrt(log(min(t, window)) / count) over the window's pulls. `update(arm, reward)`
    records one pull in O(1). The same `select` / `update` interface as `DiscountedUCB`.
    Raises `ConfigError` for `n_arms < 1` or `window < 1`."""

    def __init__(self, n_arms: int, window: int = 500, c: float = 0.5, seed: int = 0):
        if n_arms < 1 or window < 1:
            raise ConfigError("window", f"needs n_arms >= 1 and window >= 1, got "
                                        f"{n_arms}, {window}")
        self.n_arms, self.window, self.c = int(n_arms), int(window), c
        self.rng = np.random.default_rng(seed)
        self.hist: deque[tuple[int, float]] = deque()
        self.counts = np.zeros(self.n_arms)
        self.sums = np.zeros(self.n_arms)

    def select(self) -> int:
        untried = np.flatnonzero(self.counts == 0)
        if untried.size:
            return int(self.rng.choice(untried))
        ucb = self.sums / self.counts + self.c * np.sqrt(math.log(len(self.hist))
                                                         / self.counts)
        return int(np.argmax(ucb))

    def update(self, arm: int, reward: float) -> None:
        self.hist.append((int(arm), float(reward)))
        self.counts[arm] += 1
        self.sums[arm] += reward
        if len(self.hist) > self.window:
            a, r = self.hist.popleft()
            self.counts[a] -= 1
            self.sums[a] -= r
