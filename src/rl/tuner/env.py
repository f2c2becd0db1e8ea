"""TunerEnv: one step = evaluate a RAGConfig on a batch of the tuning split.

    action  Dict(variant, k, rerank, fusion_weight, prompt, + the space's extra heads)
            (rl.tuner.actions; absolute or delta)
    obs     rl.tuner.features.StateTracker: rolling quality, latency, cost, current config, category
            mix of the batch, corpus size, episode progress
    reward  rl.tuner.reward (αF + βR − γ·latency − δ·cost − λ·penalties) of that batch
An episode is `policy.episode.length` steps; each step samples a fresh batch (without
replacement within the step) with the env's seeded RNG. Steps are cheap because
`TunerEvaluator` caches per-query tables; `info["cached"]` says whether the step hit the cache.

RLlib builds envs from a config dict: `env_config = {"evaluator": <key>}` names an evaluator
registered in this process with `register_evaluator` (the default local mode), or
`{"dataset": name, "policy": <policy dict>}` builds one (what a remote env runner does).
"""

from __future__ import annotations

from typing import Any

import gymnasium as gym
import numpy as np

from rag.config import RAGConfig
from rl.tuner.evaluator import TunerEvaluator, get_evaluator
from rl.tuner.features import StateTracker
from rl.tuner.settings import TunerSettings
from rl.tuner.space import ConfigSpace, is_conversational

_REGISTRY: dict[str, TunerEvaluator] = {}


def register_evaluator(key: str, evaluator: TunerEvaluator) -> str:
    _REGISTRY[key] = evaluator
    return key


def _evaluator_from(env_config: dict[str, Any]) -> TunerEvaluator:
    if "evaluator" in env_config:
        return _REGISTRY[env_config["evaluator"]]
    policy = TunerSettings.from_dict(env_config.get("policy") or {}) if env_config.get(
        "policy") else None
    return get_evaluator(env_config["dataset"], policy)


class TunerEnv(gym.Env):
    metadata = {"render_modes": []}

    def __init__(self, env_config: dict[str, Any] | None = None, *,
                 evaluator: TunerEvaluator | None = None):
        env_config = dict(env_config or {})
        self.ev = evaluator or _evaluator_from(env_config)
        self.policy = self.ev.policy
        # the query formulation head acts only where examples carry earlier turns
        self.space = ConfigSpace(self.policy, conversational=is_conversational(
            self.ev.data.dataset.examples))
        self.split = env_config.get("split") or self.ev.slice.tune_split
        self.examples = self.ev.data.examples(self.split)
        self.batch_size = min(self.policy.episode.batch_size, len(self.examples))
        self.length = int(env_config.get("episode_length") or self.policy.episode.length)
        cats = sorted({e.category for e in self.ev.data.dataset.examples})[:8]
        thr = self.ev.thresholds
        self.tracker = StateTracker(cats, len(self.space.one_hot(self.space.base)),
                                    len(self.ev.data.indexes.corpus), thr.p95_latency_ms,
                                    self.policy.cost_ref_tokens)
        self.action_space = self.space.action_space()
        self.observation_space = gym.spaces.Box(-10.0, 10.0, shape=(self.tracker.dim,),
                                                dtype=np.float32)
        self._rng = np.random.default_rng(env_config.get("seed", self.policy.seed))
        self.history: list[dict[str, Any]] = []  # every step ever taken (for budgets/curves)
        self.current: RAGConfig = self.space.base
        self.t = 0
        self._states: list[np.ndarray] = []

    def _refit_scaler(self) -> None:
        """Robust-scaling statistics from the numeric states seen so far (no extra evaluations;
        refitted at episode boundaries so the scale is fixed within an episode)."""
        if len(self._states) >= 8:
            self.tracker.scaler.fit(np.array(self._states[-500:]))

    def _obs(self, batch_categories: list[str]) -> np.ndarray:
        return self.tracker.observe(self.space.one_hot(self.current), batch_categories,
                                    self.t / self.length)

    def reset(self, *, seed: int | None = None, options: dict | None = None):
        super().reset(seed=seed)
        if seed is not None:
            self._rng = np.random.default_rng(seed)
        self._refit_scaler()
        self.tracker.reset()
        self.current = self.space.base
        self.t = 0
        return self._obs([]), {}

    def step(self, action: dict[str, Any]):
        cfg = self.space.to_config(action, self.current)
        idx = self._rng.choice(len(self.examples), size=self.batch_size, replace=False)
        rep = self.ev.evaluate(cfg, self.split, idx)
        self.current = cfg
        self.t += 1
        self.tracker.update(rep.faithfulness, rep.relevancy, rep.p50_latency_ms,
                            rep.p95_latency_ms, rep.cost, rep.reward)
        self._states.append(self.tracker.numeric())
        info = {"config_hash": rep.config_hash, "faithfulness": rep.faithfulness,
                "relevancy": rep.relevancy, "p95_latency_ms": rep.p95_latency_ms,
                "cost": rep.cost, "gates_passed": rep.gates["passed"]}
        # wall-clock facts stay out of `info` (gymnasium checks that info is deterministic)
        self.history.append({**info, "reward": rep.reward, "config": cfg, "cached": rep.cached,
                             "step_ms": rep.elapsed_ms})
        obs = self._obs([self.examples[int(i)].category for i in idx])
        return obs, float(rep.reward), False, self.t >= self.length, info
