"""TunerEnv: one step = evaluate a RAGConfig on a batch of the tuning split.

    action  Dict(variant, k, rerank, fusion_weight, prompt, + the space's extra heads)
            (rl.kernel.actions; absolute or delta)
    obs     rl.tuner.features.StateTracker: rolling quality, latency, cost, current config, category
            mix of the batch, corpus size, episode progress
    reward  rl.kernel.reward (αF + βR − γ·latency − δ·cost − λ·penalties) of that batch
An episode is `policy.episode.length` steps; each step samples a fresh batch (without
replacement within the step) with the env's seeded RNG. Steps are cheap because
`TunerEvaluator` caches per-query tables; `info["cached"]` says whether the step hit the cache.

RLlib builds envs from a config dict (`env_spec`), by the name `ENV_NAME` registered with
`ray.tune.registry.register_env` (`register_tuner_env`), so an env runner on any node can build
one: `{"dataset": name or path, "cache_root": dir, "policy": <TunerSettings dump>, "seed": s}`
opens the evaluator through `rl.kernel.evaluator.get_evaluator` in the runner's process (once
per process). An extra `"evaluator": <key>` names an evaluator registered in this process with
`register_evaluator`: used when the key is known here (`num_env_runners=0`: the env steps in
the driver and shares its evaluator, tables and `seen` configs), ignored elsewhere.

Every step is also kept as a *step record* (`drain_records`; `log_step_records` logs them into
RLlib's metrics from the env runner, `step_records` reads them back out of a training result),
so budgets and incumbents are computed from the algorithm's results wherever the env ran.
"""

from __future__ import annotations

import uuid
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import gymnasium as gym
import numpy as np

from rag.config import RAGConfig
from rl.kernel.evaluator import TunerEvaluator, get_evaluator
from rl.kernel.settings import TunerSettings
from rl.kernel.space import ConfigSpace, is_conversational
from rl.tuner.features import StateTracker

ENV_NAME = "ragpilot-tuner"
"""The name RLlib builds a TunerEnv by (`register_tuner_env`)."""

_REGISTRY: dict[str, TunerEvaluator] = {}


def register_evaluator(key: str, evaluator: TunerEvaluator) -> str:
    _REGISTRY[key] = evaluator
    return key


def env_spec(dataset: str, policy: TunerSettings, seed: int,
             cache_root: str | Path | None = None) -> dict[str, Any]:
    """The plain-dict env config a TunerEnv is built from on any node: `dataset` (a built-in
    name or a path every node reads), `policy` (dumped as JSON-able data), the env's `seed`
    and `cache_root` (the evaluator's table and memo directory; None: `<cache>/tuner` of the
    node). JSON-serialisable by construction."""
    return {"dataset": str(dataset), "policy": policy.model_dump(mode="json", by_alias=True),
            "seed": int(seed), "cache_root": None if cache_root is None else str(cache_root)}


def make_tuner_env(env_config: Mapping[str, Any]) -> TunerEnv:
    """The env creator registered as `ENV_NAME`: a TunerEnv from `env_spec`'s dict (plus an
    optional in-process `"evaluator"` key)."""
    return TunerEnv(dict(env_config))


def register_tuner_env() -> str:
    """Register `make_tuner_env` with Ray Tune's registry (shared with every worker of the
    running cluster); returns `ENV_NAME`."""
    from ray.tune.registry import register_env

    register_env(ENV_NAME, make_tuner_env)
    return ENV_NAME


def _evaluator_from(env_config: dict[str, Any]) -> TunerEvaluator:
    key = env_config.get("evaluator")
    if key is not None and key in _REGISTRY:
        return _REGISTRY[key]
    if "dataset" not in env_config:
        raise KeyError(f"evaluator {key!r} is not registered in this process and the env "
                       "config names no dataset to build one from (rl.tuner.env.env_spec)")
    policy = TunerSettings.from_dict(env_config["policy"]) if env_config.get("policy") \
        else None
    return get_evaluator(env_config["dataset"], policy, cache_root=env_config.get("cache_root"))


def log_step_records(*, env_runner: Any, metrics_logger: Any, **_: Any) -> None:
    """RLlib `on_sample_end` callback (runs in the env runner, local or remote): log every
    step its envs took since the last call as one item of the series `STEPS_KEY`, tagged with
    the runner's index and node id. Items are JSON-able dicts (`TunerEnv.drain_records`)."""
    import ray

    node = ray.get_runtime_context().get_node_id() if ray.is_initialized() else ""
    env = getattr(env_runner, "env", None)
    for sub in getattr(getattr(env, "unwrapped", None), "envs", None) or []:
        for rec in sub.unwrapped.drain_records():
            metrics_logger.log_value(STEPS_KEY, {**rec, "runner": int(env_runner.worker_index
                                                                    or 0), "node_id": node},
                                     reduce="item_series")


STEPS_KEY = ("ragpilot", "tuner_steps")
"""Where `log_step_records` puts the step records under a result's `env_runners` metrics."""


def step_records(result: Mapping[str, Any]) -> list[dict[str, Any]]:
    """The step records of one `Algorithm.train()` result, ordered by (env runner index, the
    env's step number): the same order for the same runs, whichever runner reported first."""
    node: Any = (result.get("env_runners") or {})
    for k in STEPS_KEY:
        node = node.get(k) if isinstance(node, Mapping) else None
    items = node if isinstance(node, list) else []
    return sorted((dict(r) for r in items if isinstance(r, Mapping)),
                  key=lambda r: (r["runner"], r["env_id"], r["seq"]))


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
        self._drained = 0
        self._env_id = uuid.uuid4().hex[:8]  # tells apart two envs of one runner

    def drain_records(self) -> list[dict[str, Any]]:
        """The steps taken since the last call, as JSON-able step records: `info`'s keys plus
        reward, cached, step_ms, `config` (the RAGConfig as a dict), `state` (the numeric
        feature vector the scaler is fitted on), `seq` (the step's index in this env) and
        `env_id`."""
        out = []
        for i in range(self._drained, len(self.history)):
            h = self.history[i]
            out.append({**{k: v for k, v in h.items() if k != "config"},
                        "config": h["config"].model_dump(mode="json"),
                        "state": [float(x) for x in self._states[i]],
                        "seq": i, "env_id": self._env_id})
        self._drained = len(self.history)
        return out

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
        # what PPO learns from: the reward, or its shaped-gate variant (history, incumbents and
        # reports keep the reward itself)
        signal = rep.shaped_reward if self.policy.gate_penalty == "shaped" else rep.reward
        return obs, float(signal), False, self.t >= self.length, info
