"""Per-query adaptive policy: query features → one of M configs, trained with PPO as a
contextual bandit (one-step episodes), with logged propensities for off-policy evaluation.

Arms are the M best static configs of the tuning split (by full-split reward), so the policy
chooses among strong configs per query rather than exploring the whole space per query. The
reward of a (query, arm) pair is the per-query reward (`TunerEvaluator.per_query_reward`:
αF + βR − latency and cost terms of that query; the batch gates do not apply to one query).

Query features (all cached through the memoised retrievers, no extra model calls):
    category one-hot, question length, top-1 BM25 score (log), top-1 dense cosine,
    BM25/dense top-5 agreement (Jaccard), top-1 minus top-5 score gaps for both retrievers.
"""

from __future__ import annotations

from dataclasses import dataclass

import gymnasium as gym
import numpy as np

from rag.config import RAGConfig
from rag.types import Example
from rl.evaluation import TunerEvaluator

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

    @classmethod
    def build(cls, ev: TunerEvaluator, arms: list[RAGConfig], split: str,
              features: QueryFeatures) -> QueryBandit:
        ex = ev.data.examples(split)
        X = np.stack([features(e) for e in ex])
        R = np.stack([ev.per_query_reward(ev.table(a, split)) for a in arms], axis=1)
        return cls(arms, X, R)


class ContextualEnv(gym.Env):
    """One-step episodes: observe a random query's features, pick an arm, get its reward."""

    def __init__(self, env_config: dict | None = None):
        cfg = dict(env_config or {})
        self.data: QueryBandit = _REGISTRY[cfg["bandit"]]
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


class AdaptivePolicy:
    """PPO over ContextualEnv; `probabilities(X)` are the logged propensities."""

    def __init__(self, train: QueryBandit, seed: int = 0, lr: float = 3e-3,
                 batch: int = 256, hidden: tuple[int, ...] = (32, 32)):
        self.train_data = train
        self.key = f"qb-{id(train)}"
        _REGISTRY[self.key] = train
        self.seed = seed
        self.lr, self.batch, self.hidden = lr, batch, hidden
        self.algo = None

    def fit(self, iterations: int = 30) -> list[float]:
        from ray.rllib.algorithms.ppo import PPOConfig
        from ray.rllib.core.rl_module.default_model_config import DefaultModelConfig

        from rl.ppo import init_ray

        init_ray()
        cfg = (PPOConfig().environment(ContextualEnv, env_config={"bandit": self.key,
                                                                  "seed": self.seed})
               .framework("torch")
               .env_runners(num_env_runners=0, rollout_fragment_length=self.batch)
               .learners(num_learners=0)
               .training(lr=self.lr, gamma=0.0, lambda_=0.0, train_batch_size_per_learner=
                         self.batch, minibatch_size=64, num_epochs=6, entropy_coeff=0.003)
               .rl_module(model_config=DefaultModelConfig(fcnet_hiddens=list(self.hidden)))
               .debugging(seed=self.seed, log_level="ERROR"))
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

    def stop(self) -> None:
        if self.algo is not None:
            self.algo.stop()
            self.algo = None
        _REGISTRY.pop(self.key, None)


def top_arms(ev: TunerEvaluator, configs: list[RAGConfig], m: int) -> list[RAGConfig]:
    """The m configs with the best full tuning-split reward."""
    return sorted(configs, key=lambda c: -ev.evaluate(c).reward)[:m]
