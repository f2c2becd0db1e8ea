"""Per-decision logs of an ε-greedy logging policy, and how far off-policy estimates from
them land from the truth.

The logging policy serves arm `greedy[i]` of a base policy (e.g. the best static config) with
probability 1 − ε + ε/M and every other arm with ε/M (ε >= `rl.routing.base.MIN_EPSILON`, so the
minimum propensity is ε/M and importance weights stay bounded by M/ε). One record per decision:

    {"query_id", "features": [...], "arm": j, "config_hash", "propensity", "reward"}

With a candidate policy (`candidate_probs`, share δ; `rl.routing.base.explore_mix`), the
logging policy is candidate-aware: (1 − ε − δ) on `greedy[i]`, δ on the candidate's choice,
ε/M uniform; the candidate's arms are then logged with propensity >= δ.

`log_epsilon_greedy` simulates such a log from a full-information reward matrix R (queries ×
arms; `bench/policy.py`'s matrices): each query once (`n_rounds=None`, in order), or a stream of
`n_rounds` requests drawn uniformly with replacement from the queries (a production log is far
longer than a test split). `ope_error(target_probs, logs, true_value)` runs IPS, SNIPS and DR
(`rl.stats.ope`) for a target policy and reports each estimate's absolute error against the
target's true value (computed from R), and whether the 95% CI covers it.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from rag.errors import ConfigError
from rl.routing.base import MIN_EPSILON, explore_mix, one_hot, sample_arms

ESTIMATORS = ("ips", "snips", "dr")


@dataclass(frozen=True)
class DecisionLog:
    """A decision log as arrays: `query_ids` (n,), `qidx` (n,) index of the query in the
    matrix the log was drawn from (-1 when read from a file), `x` (n, d) features, `arm` (n,),
    `config_hash` (n,), `propensity` (n,) in (0, 1], `reward` (n,)."""

    query_ids: list[str]
    qidx: np.ndarray
    x: np.ndarray
    arm: np.ndarray
    config_hash: list[str]
    propensity: np.ndarray
    reward: np.ndarray

    def __len__(self) -> int:
        return int(self.arm.size)

    def write_jsonl(self, path: str | Path) -> Path:
        """One JSON line per decision (module docstring); returns the path."""
        p = Path(path)
        p.parent.mkdir(parents=True, exist_ok=True)
        with p.open("w", encoding="utf-8") as f:
            for i in range(len(self)):
                f.write(json.dumps({
                    "query_id": self.query_ids[i], "features": [float(v) for v in self.x[i]],
                    "arm": int(self.arm[i]), "config_hash": self.config_hash[i],
                    "propensity": float(self.propensity[i]),
                    "reward": float(self.reward[i])}) + "\n")
        return p

    @classmethod
    def read_jsonl(cls, path: str | Path) -> DecisionLog:
        recs = [json.loads(line) for line in Path(path).read_text().splitlines()
                if line.strip()]
        if not recs:
            raise ConfigError("logs", f"{path}: empty decision log")
        return cls([str(r["query_id"]) for r in recs], np.full(len(recs), -1),
                   np.array([r["features"] for r in recs], dtype=np.float64),
                   np.array([r["arm"] for r in recs], dtype=np.int64),
                   [str(r["config_hash"]) for r in recs],
                   np.array([r["propensity"] for r in recs], dtype=np.float64),
                   np.array([r["reward"] for r in recs], dtype=np.float64))


def epsilon_greedy_probs(greedy: np.ndarray, n_arms: int, epsilon: float,
                         candidate_probs: np.ndarray | None = None,
                         candidate_share: float = 0.0) -> np.ndarray:
    """(n, n_arms) probabilities of ε-greedy around the arms `greedy` (n,); with
    `candidate_probs` (n, n_arms) and `candidate_share` δ > 0, candidate-aware (module
    docstring)."""
    if not MIN_EPSILON <= epsilon <= 1.0:
        raise ConfigError("epsilon", f"the logging policy needs epsilon in [{MIN_EPSILON}, 1] "
                                     f"(min propensity epsilon/M), got {epsilon}")
    return explore_mix(one_hot(greedy, n_arms), epsilon, candidate_probs, candidate_share)


def log_epsilon_greedy(X: np.ndarray, R: np.ndarray, greedy: np.ndarray, epsilon: float,
                       rng: np.random.Generator, n_rounds: int | None = None,
                       query_ids: Sequence[str] | None = None,
                       config_hashes: Sequence[str] | None = None,
                       candidate_probs: np.ndarray | None = None,
                       candidate_share: float = 0.0) -> DecisionLog:
    """Simulate the ε-greedy logging policy over queries with features `X` (n, d) and
    full-information rewards `R` (n, M) (module docstring). `greedy` (n,): the base policy's
    arm per query; `candidate_probs` (n, M): a candidate policy's probabilities per query,
    given `candidate_share` of the rounds. Returns the log (rewards read from R)."""
    X, R = np.asarray(X, dtype=np.float64), np.asarray(R, dtype=np.float64)
    n, m = R.shape
    if X.shape[0] != n or np.asarray(greedy).shape != (n,):
        raise ConfigError("X", f"X {X.shape}, R {R.shape} and greedy must agree on n")
    if candidate_probs is not None and np.shape(candidate_probs) != (n, m):
        raise ConfigError("candidate_probs", f"{np.shape(candidate_probs)}, expected {(n, m)}")
    qidx = np.arange(n) if n_rounds is None else rng.integers(0, n, size=int(n_rounds))
    cand = None if candidate_probs is None else np.asarray(candidate_probs)[qidx]
    P = epsilon_greedy_probs(np.asarray(greedy)[qidx], m, epsilon, cand, candidate_share)
    arms, prop = sample_arms(P, rng)
    ids = list(query_ids) if query_ids is not None else [str(i) for i in range(n)]
    hashes = list(config_hashes) if config_hashes is not None else [f"arm-{j}" for j in range(m)]
    return DecisionLog([ids[i] for i in qidx], qidx, X[qidx], arms,
                        [hashes[j] for j in arms], prop, R[qidx, arms])


def true_value(target_probs: np.ndarray, R: np.ndarray) -> float:
    """The target's on-policy value over the queries of R: mean_i sum_k pi(k|i) R[i, k]."""
    return float(np.mean(np.sum(np.asarray(target_probs) * np.asarray(R), axis=1)))


def grouped_cross_fit_q(x: np.ndarray, a: np.ndarray, r: np.ndarray, groups: np.ndarray,
                        n_actions: int, n_folds: int = 5, seed: int = 0,
                        l2: float = 1.0) -> np.ndarray:
    """Out-of-fold ridge q̂ (n, n_actions) like `rl.stats.ope.cross_fit_q`, but with folds
    made of whole groups (query ids): in a stream where one query is logged many times, a
    round-level split would let q̂ learn a query's reward from its other rounds, a luxury a
    log of fresh queries does not have. Each group's rounds are predicted by a model fitted
    on the other folds' groups."""
    from rl.stats.ope import fit_reward_model

    uniq = np.unique(groups)
    if uniq.size < n_folds:
        raise ConfigError("groups", f"{uniq.size} groups for {n_folds} folds")
    fold_of = dict(zip(np.random.default_rng(seed).permutation(uniq),
                       np.arange(uniq.size) % n_folds, strict=True))
    fold = np.array([fold_of[g] for g in groups])
    q = np.empty((len(r), n_actions))
    for f in range(n_folds):
        test = fold == f
        model = fit_reward_model(x[~test], a[~test], r[~test], n_actions, l2)
        q[test] = model(x[test])
    return q


def ope_error(target_probs: np.ndarray, logs: DecisionLog, true_value: float, *,
              q_hat: np.ndarray | None = None, n_folds: int = 5, seed: int = 0,
              l2: float = 1.0) -> dict[str, dict[str, Any]]:
    """IPS, SNIPS and DR estimates of the target's value from `logs`, each with its absolute
    error against `true_value` (reward units).

    `target_probs` (len(logs), M): the target's probabilities at each logged decision's
    context. `q_hat` (len(logs), M): a reward model's predictions for DR (fitted elsewhere,
    e.g. on a training split's full-information rows); None = a cross-fitted ridge on the
    logs themselves, folds by query (`grouped_cross_fit_q`) when the log knows its queries
    (`qidx` >= 0), else by round. Returns name -> {value, ci_low, ci_high, se, ess, abs_error, covered};
    SNIPS is undefined (every number NaN, `covered` False) when the target puts zero
    probability on every logged action."""
    from rl.stats.ope import doubly_robust, ips, snips

    a, p, r = logs.arm, logs.propensity, logs.reward
    if q_hat is None and np.all(logs.qidx >= 0) and np.unique(logs.qidx).size >= n_folds:
        q_hat = grouped_cross_fit_q(logs.x, a, r, logs.qidx, target_probs.shape[1], n_folds,
                                    seed, l2)
    est = {"ips": ips(a, p, r, target_probs),
           "dr": doubly_robust(a, p, r, target_probs, x=logs.x, q_hat=q_hat, n_folds=n_folds,
                               seed=seed, l2=l2)}
    try:
        est["snips"] = snips(a, p, r, target_probs)
    except ConfigError:  # no logged action the target would take: nothing to normalise by
        est["snips"] = None
    nan = float("nan")
    return {k: ({"value": e.value, "ci_low": e.ci_low, "ci_high": e.ci_high, "se": e.se,
                 "ess": e.ess, "abs_error": abs(e.value - true_value),
                 "covered": bool(e.ci_low <= true_value <= e.ci_high)} if e is not None else
                {"value": nan, "ci_low": nan, "ci_high": nan, "se": nan, "ess": 0.0,
                 "abs_error": nan, "covered": False})
            for k, e in est.items()}
