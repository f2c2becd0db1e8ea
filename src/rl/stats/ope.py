"""Off-policy evaluation of a target policy from logged contextual-bandit data.

Logged data (n rounds, one `BanditLog`): actions `a` (n,) in {0..K-1} (the configs served),
propensities `p` (n,) = pi0(a_i | x_i) in (0, 1], rewards `r` (n,) (metric units, typically
[0, 1]) and contexts `x` (n, d). The target policy is the (n, K) matrix `pi` of its action probabilities pi(. | x_i).
Every estimator returns an `OPEEstimate` of V(pi) = E_x[sum_k pi(k|x) q(x, k)], the target's
expected reward per round, in reward units.

- `ips`: mean of w_i r_i with importance weights w_i = pi(a_i|x_i) / p_i.
- `snips`: sum w_i r_i / sum w_i (self-normalised; biased, lower variance).
- `direct_method`: mean of sum_k pi(k|x_i) q_hat(x_i, k) from a reward model q_hat.
- `doubly_robust`: DM plus the IPS-weighted residual w_i (r_i - q_hat(x_i, a_i)); unbiased if
  either the propensities or q_hat are right. Without a given q_hat it is cross-fitted.

Confidence intervals are normal approximations, value +/- z_{(1+ci)/2} * se, with se the
standard error of the mean of per-round contributions (SNIPS: of its delta-method influence
terms). `clip` caps the importance weights at `clip` (trading bias for variance); the default
None leaves them exact. Bad input raises `ConfigError` naming the argument (a log's field by
its own name: `a`, `p`, `r`, `x`).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
from numpy.typing import ArrayLike
from scipy.special import ndtri

from rag.errors import ConfigError

RewardModel = Callable[[np.ndarray], np.ndarray]


@dataclass(frozen=True)
class BanditLog:
    """Logged contextual-bandit data of n rounds (module docstring): actions `a` (n,),
    propensities `p` (n,) of the logging policy (None: only `direct_method` reads such a log),
    rewards `r` (n,) and contexts `x` (n, d) (None: the reward model must be given as q_hat).
    Each estimator validates what it reads against the target policy's (n, K) matrix: a
    ConfigError naming `a`, `p`, `r` or `x`."""

    a: ArrayLike
    p: ArrayLike | None
    r: ArrayLike
    x: ArrayLike | None = None


@dataclass(frozen=True)
class OPEEstimate:
    """`value` (estimated V(pi), reward units) with its normal-approximation interval
    [`ci_low`, `ci_high`] at level `ci`, standard error `se`, `n` logged rounds, estimator
    `name`, and `ess` = (sum w)^2 / sum w^2, the effective sample size of the importance weights
    (None for the direct method, which uses no weights)."""

    value: float
    ci_low: float
    ci_high: float
    se: float
    n: int
    name: str
    ci: float = 0.95
    ess: float | None = None


# --------------------------------------------------------------------------- validation


def _array(name: str, v: ArrayLike, ndim: int) -> np.ndarray:
    arr = np.asarray(v, dtype=np.float64)
    if arr.ndim != ndim:
        raise ConfigError(name, f"must be {ndim}-dimensional, got shape {arr.shape}")
    if arr.size == 0:
        raise ConfigError(name, "is empty")
    if not np.all(np.isfinite(arr)):
        raise ConfigError(name, "contains NaN or infinite values")
    return arr


def _policy(pi: ArrayLike) -> np.ndarray:
    pm = _array("pi", pi, 2)
    if pm.shape[0] < 2 or pm.shape[1] < 1:
        raise ConfigError("pi", f"needs at least 2 rounds and 1 action, got shape {pm.shape}")
    if np.any(pm < -1e-12) or not np.allclose(pm.sum(axis=1), 1.0, rtol=0, atol=1e-6):
        raise ConfigError("pi", "each row must be a probability distribution over the actions")
    return pm


def _actions(a: ArrayLike, n: int, n_actions: int) -> np.ndarray:
    av = _array("a", a, 1)
    if av.size != n:
        raise ConfigError("a", f"has {av.size} entries, expected {n} (one per round)")
    if np.any(av != np.round(av)) or np.any(av < 0) or np.any(av >= n_actions):
        raise ConfigError("a", f"actions must be integers in [0, {n_actions})")
    return av.astype(np.int64)


def _vector(name: str, v: ArrayLike, n: int) -> np.ndarray:
    arr = _array(name, v, 1)
    if arr.size != n:
        raise ConfigError(name, f"has {arr.size} entries, expected {n} (one per round)")
    return arr


def _logged(log: BanditLog,
            pi: ArrayLike) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Validated (a, p, r) of `log` and `pi`; n and K are taken from `pi`."""
    pm = _policy(pi)
    n, k = pm.shape
    av = _actions(log.a, n, k)
    if log.p is None:
        raise ConfigError("p", "the log has no propensities: this estimator weighs by them")
    pv = _vector("p", log.p, n)
    if np.any(pv <= 0) or np.any(pv > 1 + 1e-12):
        raise ConfigError("p", "logged propensities must lie in (0, 1]")
    return av, pv, _vector("r", log.r, n), pm


def _contexts(x: ArrayLike, n: int) -> np.ndarray:
    xm = _array("x", x, 2)
    if xm.shape[0] != n:
        raise ConfigError("x", f"has {xm.shape[0]} rows, expected {n} (one per round)")
    return xm


def _weights(a: np.ndarray, p: np.ndarray, pm: np.ndarray, clip: float | None) -> np.ndarray:
    w = pm[np.arange(a.size), a] / p
    if clip is None:
        return w
    if not clip > 0:
        raise ConfigError("clip", f"must be > 0 or None, got {clip}")
    return np.minimum(w, clip)


def _estimate(name: str, value: float, terms: np.ndarray, ci: float,
              ess: float | None) -> OPEEstimate:
    """Normal CI from the per-round terms whose mean has the estimator's sampling error."""
    if not 0.0 < ci < 1.0:
        raise ConfigError("ci", f"must be in (0, 1), got {ci}")
    se = float(terms.std(ddof=1) / math.sqrt(terms.size))
    half = float(ndtri(0.5 + ci / 2.0)) * se
    return OPEEstimate(float(value), float(value - half), float(value + half), se,
                       int(terms.size), name, ci, ess)


def _ess(w: np.ndarray) -> float:
    sq = float(np.sum(w * w))
    return float(w.sum() ** 2 / sq) if sq > 0 else 0.0


# --------------------------------------------------------------------------- reward model


@dataclass(frozen=True)
class RidgeRewardModel:
    """q_hat(x, k) = clip(x . coef[k] + intercept[k], lo, hi), shape (n, K) from x (n, d)."""

    coef: np.ndarray
    intercept: np.ndarray
    lo: float
    hi: float

    def __call__(self, x: ArrayLike) -> np.ndarray:
        xm = _array("x", x, 2)
        if xm.shape[1] != self.coef.shape[1]:
            raise ConfigError("x", f"has {xm.shape[1]} features, the model {self.coef.shape[1]}")
        return np.clip(xm @ self.coef.T + self.intercept, self.lo, self.hi)


def fit_reward_model(x: ArrayLike, a: ArrayLike, r: ArrayLike, n_actions: int,
                     l2: float = 1.0) -> RidgeRewardModel:
    """One ridge regression of r on x per action (closed form; the intercept is not
    penalised). An action never logged predicts the overall mean reward. Predictions are clipped
    to the observed reward range. Returns a callable q_hat: (m, d) contexts -> (m, K)."""
    if int(n_actions) != n_actions or n_actions < 1:
        raise ConfigError("n_actions", f"must be a positive integer, got {n_actions}")
    if not l2 >= 0:
        raise ConfigError("l2", f"must be >= 0, got {l2}")
    rv = _array("r", r, 1)
    xm, av = _contexts(x, rv.size), _actions(a, rv.size, int(n_actions))
    d = xm.shape[1]
    coef, intercept = np.zeros((int(n_actions), d)), np.full(int(n_actions), rv.mean())
    for k in range(int(n_actions)):
        mask = av == k
        if not mask.any():
            continue
        xk, yk = xm[mask], rv[mask]
        mu, ybar = xk.mean(axis=0), yk.mean()
        xc = xk - mu
        coef[k] = np.linalg.lstsq(xc.T @ xc + l2 * np.eye(d), xc.T @ (yk - ybar), rcond=None)[0]
        intercept[k] = ybar - mu @ coef[k]
    return RidgeRewardModel(coef, intercept, float(rv.min()), float(rv.max()))


def cross_fit_q(x: ArrayLike, a: ArrayLike, r: ArrayLike, n_actions: int, n_folds: int = 5,
                seed: int = 0, l2: float = 1.0) -> np.ndarray:
    """Out-of-fold q_hat (n, K): rounds are split into `n_folds` seeded random folds and each
    fold is predicted by a ridge model fitted on the other folds, so no round's own reward
    enters its prediction (this keeps DR's correction term mean-zero and its CI honest)."""
    rv = _array("r", r, 1)
    xm = _contexts(x, rv.size)
    if int(n_folds) != n_folds or not 2 <= n_folds <= rv.size:
        raise ConfigError("n_folds", f"must be an integer in [2, n={rv.size}], got {n_folds}")
    av = _actions(a, rv.size, int(n_actions))
    q = np.empty((rv.size, int(n_actions)))
    folds = np.array_split(np.random.default_rng(seed).permutation(rv.size), int(n_folds))
    for fold in folds:
        train = np.ones(rv.size, dtype=bool)
        train[fold] = False
        model = fit_reward_model(xm[train], av[train], rv[train], n_actions, l2)
        q[fold] = model(xm[fold])
    return q


def _q_matrix(q_hat: ArrayLike, n: int, k: int) -> np.ndarray:
    qm = _array("q_hat", q_hat, 2)
    if qm.shape != (n, k):
        raise ConfigError("q_hat", f"must have shape {(n, k)} like pi, got {qm.shape}")
    return qm


# --------------------------------------------------------------------------- estimators


def ips(log: BanditLog, pi: ArrayLike, *, clip: float | None = None,
        ci: float = 0.95) -> OPEEstimate:
    """Inverse propensity scoring: mean_i w_i r_i, unbiased when propensities are right and
    clip is None; se from the per-round terms w_i r_i."""
    av, pv, rv, pm = _logged(log, pi)
    w = _weights(av, pv, pm, clip)
    terms = w * rv
    return _estimate("ips", terms.mean(), terms, ci, _ess(w))


def snips(log: BanditLog, pi: ArrayLike, *, clip: float | None = None,
          ci: float = 0.95) -> OPEEstimate:
    """Self-normalised IPS: V = sum w r / sum w. CI by the delta method: the influence terms
    w_i (r_i - V) / mean(w) have V's asymptotic sampling error as their mean's."""
    av, pv, rv, pm = _logged(log, pi)
    w = _weights(av, pv, pm, clip)
    if w.sum() <= 0:
        raise ConfigError("pi", "puts zero probability on every logged action; SNIPS undefined")
    value = float(w @ rv / w.sum())
    return _estimate("snips", value, w * (rv - value) / w.mean(), ci, _ess(w))


def direct_method(log: BanditLog, pi: ArrayLike, *, q_hat: ArrayLike | None = None,
                  l2: float = 1.0, ci: float = 0.95) -> OPEEstimate:
    """Direct method: mean_i sum_k pi(k|x_i) q_hat(x_i, k). `q_hat` (n, K) if given, else a ridge
    model fitted on all of the log's (x, a, r); its propensities are not read. Its CI reflects only the sampling of contexts, not the
    reward model's error or bias, so it under-covers when q_hat is misspecified."""
    pm = _policy(pi)
    n, k = pm.shape
    av, rv = _actions(log.a, n, k), _vector("r", log.r, n)
    if q_hat is None:
        if log.x is None:
            raise ConfigError("x", "contexts are needed to fit a reward model (or pass q_hat)")
        xm = _contexts(log.x, n)
        qm = fit_reward_model(xm, av, rv, k, l2)(xm)
    else:
        qm = _q_matrix(q_hat, n, k)
    terms = np.sum(pm * qm, axis=1)
    return _estimate("dm", terms.mean(), terms, ci, None)


def doubly_robust(log: BanditLog, pi: ArrayLike, *, q_hat: ArrayLike | None = None,
                  n_folds: int = 5, seed: int = 0, l2: float = 1.0, clip: float | None = None,
                  ci: float = 0.95) -> OPEEstimate:
    """Doubly robust: mean_i [sum_k pi(k|x_i) q_hat(x_i, k) + w_i (r_i - q_hat(x_i, a_i))].

    `q_hat` (n, K) if given (it should not have been fitted on these rounds), else cross-fitted
    ridge predictions on the log (`cross_fit_q` with `n_folds` seeded folds). se from the per-round terms.
    The better q_hat, the smaller the residuals the weights multiply, and the smaller the
    variance compared with IPS."""
    av, pv, rv, pm = _logged(log, pi)
    qm = _dr_reward_model(log.x, q_hat, av, rv, pm.shape, n_folds, seed, l2)
    terms, w = _dr_terms(av, pv, rv, pm, qm, clip)
    return _estimate("dr", terms.mean(), terms, ci, _ess(w))


def _dr_reward_model(x: ArrayLike | None, q_hat: ArrayLike | None, a: np.ndarray,
                     r: np.ndarray, shape: tuple[int, int], n_folds: int, seed: int,
                     l2: float) -> np.ndarray:
    """DR's q̂ (n, K): `q_hat` as given, else cross-fitted ridge predictions on the log."""
    n, k = shape
    if q_hat is not None:
        return _q_matrix(q_hat, n, k)
    if x is None:
        raise ConfigError("x", "contexts are needed to fit a reward model (or pass q_hat)")
    return cross_fit_q(x, a, r, k, n_folds=n_folds, seed=seed, l2=l2)


def _dr_terms(a: np.ndarray, p: np.ndarray, r: np.ndarray, pm: np.ndarray, qm: np.ndarray,
              clip: float | None) -> tuple[np.ndarray, np.ndarray]:
    """Per-round DR terms sum_k pi(k|x_i) q̂(x_i, k) + w_i (r_i − q̂(x_i, a_i)), and the w."""
    w = _weights(a, p, pm, clip)
    return np.sum(pm * qm, axis=1) + w * (r - qm[np.arange(a.size), a]), w


def doubly_robust_difference(log: BanditLog, pi_a: ArrayLike, pi_b: ArrayLike, *,
                             q_hat: ArrayLike | None = None, n_folds: int = 5, seed: int = 0,
                             l2: float = 1.0, clip: float | None = None,
                             ci: float = 0.95) -> tuple[OPEEstimate, OPEEstimate, OPEEstimate]:
    """DR estimates of V(pi_a), V(pi_b) and of V(pi_a) − V(pi_b) from one log, with one reward
    model (cross-fitted once, or `q_hat`). The difference's CI comes from the per-round
    differences of the two DR terms (paired: both policies are judged on the same rounds, so
    the shared noise cancels), not from either estimate alone. Returns (a, b, a − b); the
    difference's `ess` is pi_a's."""
    av, pv, rv, pa = _logged(log, pi_a)
    pb = _policy(pi_b)
    if pb.shape != pa.shape:
        raise ConfigError("pi_b", f"shape {pb.shape}, expected {pa.shape}")
    qm = _dr_reward_model(log.x, q_hat, av, rv, pa.shape, n_folds, seed, l2)
    ta, wa = _dr_terms(av, pv, rv, pa, qm, clip)
    tb, wb = _dr_terms(av, pv, rv, pb, qm, clip)
    return (_estimate("dr", ta.mean(), ta, ci, _ess(wa)),
            _estimate("dr", tb.mean(), tb, ci, _ess(wb)),
            _estimate("dr-difference", (ta - tb).mean(), ta - tb, ci, _ess(wa)))


def estimate_all(log: BanditLog, pi: ArrayLike, *, clip: float | None = None,
                 n_folds: int = 5, seed: int = 0, l2: float = 1.0,
                 ci: float = 0.95) -> dict[str, OPEEstimate]:
    """IPS, SNIPS, DM (reward model fitted on all rounds) and DR (cross-fitted) of `log` (with
    its contexts), by name."""
    return {
        "ips": ips(log, pi, clip=clip, ci=ci),
        "snips": snips(log, pi, clip=clip, ci=ci),
        "dm": direct_method(log, pi, l2=l2, ci=ci),
        "dr": doubly_robust(log, pi, n_folds=n_folds, seed=seed, l2=l2, clip=clip, ci=ci),
    }
