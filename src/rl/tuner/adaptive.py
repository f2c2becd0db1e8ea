"""Per-query adaptive policy: query features → one of M configs, trained with PPO as a
contextual bandit (one-step episodes), with logged propensities for off-policy evaluation.

Arms are the M best static configs of the tuning split (by full-split reward), so the policy
chooses among strong configs per query rather than exploring the whole space per query. The
reward of a (query, arm) pair is the per-query reward (`TunerEvaluator.per_query_reward`:
αF + βR − latency and cost terms of that query; the batch gates do not apply to one query).

Query features (all cached through the memoised retrievers, no extra model calls):
    category one-hot, question length, top-1 BM25 score (log), top-1 dense cosine,
    BM25/dense top-5 agreement (Jaccard), top-1 minus top-5 score gaps for both retrievers.

Decision log for off-policy evaluation (`write_decision_log`, `DecisionLog`): the policy serves
each query of a split *stochastically*, drawing the arm from its own action probabilities, and
one JSONL line per query records the query id, its features, the chosen arm and config hash,
the propensity of that choice and the reward it got. `DecisionLog.read(path).estimate(pi)` runs
`rl.stats.ope` (IPS, SNIPS, DM, DR) for any target policy `pi` over the same arms. (A greedy log, the
argmax with propensity 1, could only ever evaluate itself.)

Where PPO samples: in the driver by default; with `num_env_runners` >= 1 in that many remote
RLlib env runners on any node, each building its ContextualEnv from the env config alone (the
features X and rewards R travel in it by value: `bandit_spec`).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import gymnasium as gym
import numpy as np

from rag.config import RAGConfig
from rag.types import Example
from rl.kernel.evaluator import TunerEvaluator

_REGISTRY: dict[str, QueryBandit] = {}


class QueryFeatures:
    def __init__(self, ev: TunerEvaluator):
        self.ev = ev
        self.categories = sorted({e.category for e in ev.data.dataset.examples})[:8]
        base = ev.policy.base_config()
        self.bm25 = ev.memo.bm25(base.bm25_backend)
        self.dense = ev.memo.dense(base.dense_index)

    @property
    def dim(self) -> int:
        return len(self.categories) + 7

    def __call__(self, e: Example) -> np.ndarray:
        cat = np.zeros(len(self.categories), dtype=np.float32)
        if e.category in self.categories:
            cat[self.categories.index(e.category)] = 1
        b = self.bm25.search(e.question, 5)
        d = self.dense.search(e.question, 5)
        sb = [h.score for h in b] or [0.0]
        sd = [h.score for h in d] or [0.0]
        agree = len({h.id for h in b} & {h.id for h in d}) / max(len({h.id for h in b}
                                                                    | {h.id for h in d}), 1)
        num = np.array([len(e.question.split()) / 20.0, np.log1p(sb[0]) / 3.0, sd[0],
                        agree, (sb[0] - sb[-1]) / max(sb[0], 1e-6), sd[0] - sd[-1],
                        float(bool(e.history))], dtype=np.float32)
        return np.concatenate([cat, num])


@dataclass
class QueryBandit:
    """Per-query rewards of M arms on a split, and the features of its queries."""

    arms: list[RAGConfig]
    X: np.ndarray          # n × d features
    R: np.ndarray          # n × M per-query rewards
    ids: list[str] | None = None
    """Query ids, one per row (None: the row numbers)."""

    @classmethod
    def build(cls, ev: TunerEvaluator, arms: list[RAGConfig], split: str,
              features: QueryFeatures) -> QueryBandit:
        ex = ev.data.examples(split)
        X = np.stack([features(e) for e in ex])
        R = np.stack([ev.per_query_reward(ev.table(a, split)) for a in arms], axis=1)
        return cls(arms, X, R, [e.id for e in ex])

    @property
    def arm_ids(self) -> list[str]:
        """The arms' config hashes (`arm<k>` for an arm that is not a RAGConfig)."""
        return [getattr(a, "config_hash", None) or f"arm{k}" for k, a in enumerate(self.arms)]


class ContextualEnv(gym.Env):
    """One-step episodes: observe a random query's features, pick an arm, get its reward."""

    def __init__(self, env_config: dict | None = None):
        """`env_config`: {"bandit": key of a QueryBandit registered in this process} or
        `bandit_spec`'s {"X", "R"} (what a remote env runner gets), plus "seed"."""
        cfg = dict(env_config or {})
        key = cfg.get("bandit")
        if key in _REGISTRY:
            self.data: QueryBandit = _REGISTRY[key]
        elif "X" in cfg and "R" in cfg:
            R = np.asarray(cfg["R"], dtype=np.float64)
            self.data = QueryBandit([None] * R.shape[1], np.asarray(cfg["X"], np.float32), R)
        else:
            raise KeyError(f"bandit {key!r} is not registered in this process and the env "
                           "config carries no X/R (rl.tuner.adaptive.bandit_spec)")
        self.observation_space = gym.spaces.Box(-10, 10, shape=(self.data.X.shape[1],),
                                                dtype=np.float32)
        self.action_space = gym.spaces.Discrete(len(self.data.arms))
        self._rng = np.random.default_rng(cfg.get("seed", 0))
        self._i = 0

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        if seed is not None:
            self._rng = np.random.default_rng(seed)
        self._i = int(self._rng.integers(len(self.data.X)))
        return np.clip(self.data.X[self._i], -10, 10).astype(np.float32), {}

    def step(self, action):
        r = float(self.data.R[self._i, int(action)])
        return np.clip(self.data.X[self._i], -10, 10).astype(np.float32), r, True, False, {}


def bandit_spec(data: QueryBandit) -> dict[str, Any]:
    """What a ContextualEnv needs on any node: the features X (n × d) and per-query rewards
    R (n × M), by value."""
    return {"X": np.asarray(data.X, dtype=np.float32), "R": np.asarray(data.R, np.float64)}


class AdaptivePolicy:
    """PPO over ContextualEnv; `probabilities(X)` are the logged propensities.
    `num_env_runners`: remote env runners (0: the env steps in the driver)."""

    def __init__(self, train: QueryBandit, seed: int = 0, lr: float = 3e-3,
                 batch: int = 256, hidden: tuple[int, ...] = (32, 32),
                 num_env_runners: int = 0):
        self.train_data = train
        self.key = f"qb-{id(train)}"
        _REGISTRY[self.key] = train
        self.seed = seed
        self.lr, self.batch, self.hidden = lr, batch, hidden
        self.num_env_runners = num_env_runners
        self.algo = None

    def fit(self, iterations: int = 30) -> list[float]:
        from rl.common.rllib import ppo_config
        from rl.common.runtime import init_ray

        init_ray()
        # one-step episodes: no discounting, no bootstrapping (gamma = GAE lambda = 0)
        env_config = {"bandit": self.key, "seed": self.seed}
        if self.num_env_runners:
            env_config.update(bandit_spec(self.train_data))
        cfg = ppo_config(ContextualEnv, env_config, num_env_runners=self.num_env_runners,
                         seed=self.seed, train_batch_size=self.batch, hidden=self.hidden,
                         lr=self.lr, gamma=0.0, lambda_=0.0, minibatch_size=64, num_epochs=6,
                         entropy_coeff=0.003)
        self.algo = cfg.build_algo()
        means = []
        for _ in range(iterations):
            res = self.algo.train()
            means.append(float(res.get("env_runners", {}).get("episode_return_mean",
                                                              np.nan)))
        return means

    def probabilities(self, X: np.ndarray) -> np.ndarray:
        import torch

        module = self.algo.get_module()
        with torch.no_grad():
            logits = module.forward_inference({"obs": torch.as_tensor(
                np.clip(X, -10, 10).astype(np.float32))})["action_dist_inputs"]
        return torch.softmax(logits, dim=-1).numpy()

    def act(self, X: np.ndarray) -> np.ndarray:
        return self.probabilities(X).argmax(axis=1)

    def log_decisions(self, data: QueryBandit, path: str | Path, seed: int = 0,
                      policy: str = "adaptive-ppo") -> DecisionLog:
        """Serve every query of `data` by sampling from this policy's probabilities and write
        the decision log (`write_decision_log`)."""
        return write_decision_log(path, data, self.probabilities(data.X), seed=seed,
                                  policy=policy)

    def stop(self) -> None:
        if self.algo is not None:
            self.algo.stop()
            self.algo = None
        _REGISTRY.pop(self.key, None)


def top_arms(ev: TunerEvaluator, configs: list[RAGConfig], m: int) -> list[RAGConfig]:
    """The m configs with the best full tuning-split reward."""
    return sorted(configs, key=lambda c: -ev.evaluate(c).reward)[:m]


# ---- decision log for off-policy evaluation ----------------------------------------------------
def write_decision_log(path: str | Path, data: QueryBandit, probs: np.ndarray, seed: int = 0,
                       policy: str = "adaptive-ppo") -> DecisionLog:
    """Serve each query i of `data` with an arm drawn from `probs[i]` (the policy's action
    probabilities, n × M; seeded) and write one JSONL line per query:
    {"query_id", "features": [...], "arm": index, "config_hash", "n_arms", "propensity":
    probs[i, arm] (the logging probability), "reward": data.R[i, arm], "policy", "seed"}.
    Returns the log as read back."""
    P = np.asarray(probs, dtype=np.float64)
    if P.shape != data.R.shape:
        raise ValueError(f"probs must be n × M = {data.R.shape}, got {P.shape}")
    P = P / P.sum(axis=1, keepdims=True)
    rng = np.random.default_rng(seed)
    arms = data.arm_ids
    ids = data.ids or [str(i) for i in range(len(P))]
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w") as f:
        for i, row in enumerate(P):
            a = int(rng.choice(len(row), p=row))
            f.write(json.dumps({"query_id": ids[i], "features": [float(v) for v in data.X[i]],
                                "arm": a, "config_hash": arms[a], "n_arms": len(arms),
                                "propensity": float(row[a]), "reward": float(data.R[i, a]),
                                "policy": policy, "seed": seed}) + "\n")
    return DecisionLog.read(path, arms)


@dataclass(frozen=True)
class DecisionLog:
    """A decision log as arrays for `rl.stats.ope`: ids (n), contexts `x` (n × d), actions `a` (n,
    indices into `arms`), propensities `p`, rewards `r`, and `arms` (config hashes)."""

    ids: list[str]
    x: np.ndarray
    a: np.ndarray
    p: np.ndarray
    r: np.ndarray
    arms: list[str]

    @classmethod
    def read(cls, path: str | Path, arms: Sequence[str] | None = None) -> DecisionLog:
        """Read a JSONL log. With `arms` (config hashes in action order) each line's
        `config_hash` is mapped onto it; otherwise the logged `arm` indices are kept."""
        recs: list[dict[str, Any]] = [json.loads(line) for line in
                                      Path(path).read_text().splitlines() if line.strip()]
        if not recs:
            raise ValueError(f"{path}: empty decision log")
        if arms is None:
            k = max(max(int(r["n_arms"]) for r in recs), 1 + max(int(r["arm"]) for r in recs))
            names = [f"arm{j}" for j in range(k)]
            for r in recs:
                names[int(r["arm"])] = r["config_hash"]
            a = [int(r["arm"]) for r in recs]
        else:
            names = list(arms)
            pos = {h: j for j, h in enumerate(names)}
            unknown = sorted({r["config_hash"] for r in recs} - set(pos))
            if unknown:
                raise ValueError(f"{path}: config hashes not among the arms: {unknown}")
            a = [pos[r["config_hash"]] for r in recs]
        return cls([str(r["query_id"]) for r in recs],
                   np.array([r["features"] for r in recs], dtype=np.float64),
                   np.array(a, dtype=np.int64),
                   np.array([r["propensity"] for r in recs], dtype=np.float64),
                   np.array([r["reward"] for r in recs], dtype=np.float64), names)

    def estimate(self, pi: np.ndarray, **kw: Any) -> dict[str, Any]:
        """IPS, SNIPS, DM and DR estimates (`rl.stats.ope.estimate_all`, each an `OPEEstimate` with
        a CI) of the target policy `pi` (n × len(arms) action probabilities per logged query)."""
        from rl.stats.ope import estimate_all

        return estimate_all(self.x, self.a, self.p, self.r, pi, **kw)
