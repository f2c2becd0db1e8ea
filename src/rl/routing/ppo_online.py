"""Online adaptation of a trained per-query PPO policy from the requests it serves (the
drift benchmark's `ppo-policy-online`, `bench/drift.py`).

A stream of requests is served in order. Each request's config is *sampled* from the current
policy (PPO is on-policy: its updates need its own samples, so the exploration is served and
its reward counts); only the served config's reward is observed (bandit feedback: nothing but
what was served is ever evaluated); after every `batch` requests PPO runs its clipped-surrogate
epochs on the batch just served (gamma = 0, one step per request, as in training), and the
Lagrange multiplier of the cost bound takes one step (`lagrange_update`). There is no valid
split and no model selection: a live stream has no hold-out to choose on.

    served = adapt_online(policy, world, X, budget, batch=64, seed=0)

returns the served reward, cost and config hash of every request, in stream order. The
policy's module is not changed (the adapted copy lives in the RLlib algorithm, stopped at the
end).
"""

from __future__ import annotations

import tempfile
from collections.abc import Sequence
from dataclasses import dataclass

import gymnasium as gym
import numpy as np

from rag.config import RAGConfig
from rl.routing.ppo_policy import (
    OBS_CLIP,
    PerQueryPPO,
    _pop_costs,
    _set_lambda,
    lagrange_update,
)
from rl.routing.worlds import QueryWorld

_STREAMS: dict[str, dict] = {}


@dataclass
class Served:
    """Per request, in stream order: reward, cost (tokens / C_ref) and the config's hash."""

    reward: np.ndarray
    cost: np.ndarray
    config_hash: list[str]
    lambdas: list[float]
    """The Lagrange multiplier after each update."""


class StreamEnv(gym.Env):
    """One-step episodes over a stream's requests in order (`env_config["stream"]`: {"world",
    "layout", "X", "base"}); request t's reward is the world's outcome of the sampled config on
    request t, minus lambda times its cost. "base": the base policy's config per request, for
    a residual policy (a `defer` head hands the request to it), else None. Every served step
    is logged; steps past the end of the stream (the last batch's padding) are served but not
    logged."""

    def __init__(self, env_config: dict | None = None):
        cfg = dict(env_config or {})
        b = _STREAMS[cfg["stream"]]
        self.world: QueryWorld = b["world"]
        self.layout = b["layout"]
        self.X = np.asarray(b["X"], dtype=np.float32)
        self.log: list[tuple[float, float, str]] = b["log"]
        self.base = b.get("base")
        self.lam = float(cfg.get("lam", 0.0))
        self.costs: list[float] = []
        self.observation_space = gym.spaces.Box(-OBS_CLIP, OBS_CLIP, shape=(self.X.shape[1],),
                                                dtype=np.float32)
        self.action_space = self.layout.action_space()
        self._t = 0
        """The next request to serve: it advances only when one is served, so an extra reset
        (RLlib resets when it likes) skips nothing."""

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        return self.X[min(self._t, len(self.X) - 1)], {}

    def step(self, action):
        i = min(self._t, len(self.X) - 1)
        config = self.layout.decode(action, None if self.base is None else self.base[i])
        o = self.world.outcome(i, config)
        if self._t < len(self.X):
            self.log.append((o.reward, o.cost, config.config_hash))
        self._t += 1
        self.costs.append(o.cost)
        return self.X[i], o.reward - self.lam * o.cost, True, False, {"cost": o.cost}


def adapt_online(policy: PerQueryPPO, world: QueryWorld, X: np.ndarray, budget: float,
                 batch: int = 64, seed: int = 0,
                 base: Sequence[RAGConfig] | None = None) -> Served:
    """Serve `world`'s requests 0..n-1 (raw features `X`, one row per request) in order,
    updating a copy of `policy` every `batch` requests (module docstring); `budget`: the mean
    cost bound in C_ref units; `base`: the base policy's config per request (needed by a
    policy with a `defer` head, as in `PerQueryPPO.act`)."""
    from rl.common.rllib import ppo_config
    from rl.common.runtime import init_ray
    from rl.routing.warm_start import MODULE_COMPONENT

    if policy.module is None:
        raise ValueError("adapt_online needs a trained policy (its module is None)")
    if len(X) != world.n:
        raise ValueError(f"{len(X)} feature rows for a stream of {world.n} requests")
    policy.layout.check_base(base, world.n, "base")
    init_ray()
    t, lg = policy.settings.train, policy.settings.lagrange
    key = f"ppo-online-{id(policy)}-{seed}-{id(world)}"
    log: list[tuple[float, float, str]] = []
    _STREAMS[key] = {"world": world, "layout": policy.layout, "X": policy.standardise(X),
                     "log": log, "base": None if base is None else list(base)}
    cfg = ppo_config(StreamEnv, {"stream": key, "lam": policy.lam}, seed=seed,
                     train_batch_size=batch, module_spec=policy.spec(),
                     disable_env_checking=True, lr=t.lr, gamma=0.0, lambda_=0.0,
                     minibatch_size=min(t.minibatch, batch), num_epochs=t.epochs,
                     entropy_coeff=t.entropy_coeff, use_kl_loss=False)
    algo = cfg.build_algo()
    lam, lams = policy.lam, []
    try:
        with tempfile.TemporaryDirectory() as d:
            policy.module.save_to_path(d)
            algo.restore_from_path(d, component=MODULE_COMPONENT)
        while len(log) < world.n:
            algo.train()
            costs = [c for cs in algo.env_runner_group.foreach_env_runner(_pop_costs)
                     for c in cs]
            if costs:
                lam = lagrange_update(lam, float(np.mean(costs)), budget, lg.lr, lg.max)
            algo.env_runner_group.foreach_env_runner(_set_lambda(lam))
            lams.append(lam)
    finally:
        algo.stop()
        _STREAMS.pop(key, None)
    r, c, h = zip(*log[:world.n], strict=True)
    return Served(np.array(r), np.array(c), list(h), lams)
