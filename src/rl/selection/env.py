"""SelectionEnv: build a query's context one passage at a time (LEADR-style episode).

    reset()  -> the next query's pool (a seeded random draw, or `options={"pool": i}`)
    action   Discrete(K + 1): candidate index 0..K-1, or K = stop; `obs["action_mask"]` marks
             the legal ones (remaining real candidates; stop once at least one passage is in)
    reward   step-wise MMR shaping per pick (if enabled) + the final reward at termination
             (rl.selection.rewards.SelectionReward)
    done     on stop, or after `max_steps` picks (the passage budget)
An illegal action (masked out) ends the episode as a stop would, so a sampled bad action can
never add a passage twice. `info["selected"]` lists the picks so far.

RLlib builds envs from a config dict: `env_config = {"pools": <key>}` names pools + reward
registered in this process with `register_pools` (num_env_runners=0, the default here).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import gymnasium as gym
import numpy as np

from rl.selection.config import EnvConfig
from rl.selection.features import CAND_DIM, Pool, glob_dim, observe
from rl.selection.rewards import SelectionReward

_REGISTRY: dict[str, tuple[list[Pool], SelectionReward, EnvConfig]] = {}


def register_pools(key: str, pools: list[Pool], reward: SelectionReward, env: EnvConfig) -> str:
    _REGISTRY[key] = (pools, reward, env)
    return key


class SelectionEnv(gym.Env):
    metadata = {"render_modes": []}

    def __init__(self, env_config: dict[str, Any] | None = None, *,
                 pools: Sequence[Pool] | None = None, reward: SelectionReward | None = None,
                 cfg: EnvConfig | None = None, emb_dim: int | None = None):
        env_config = dict(env_config or {})
        if pools is None:
            pools, reward, cfg = _REGISTRY[env_config["pools"]]
        if not pools:
            raise ValueError("pools: need at least one query pool")
        self.pools = list(pools)
        self.reward = reward
        self.cfg = cfg or EnvConfig()
        self.k = self.cfg.k
        self.max_steps = self.cfg.max_steps
        d = emb_dim or self.pools[0].emb.shape[1]
        self.observation_space = gym.spaces.Dict({
            "cand": gym.spaces.Box(-10.0, 10.0, shape=(self.k, CAND_DIM), dtype=np.float32),
            "glob": gym.spaces.Box(-10.0, 10.0, shape=(glob_dim(d),), dtype=np.float32),
            "action_mask": gym.spaces.Box(0.0, 1.0, shape=(self.k + 1,), dtype=np.float32),
        })
        self.action_space = gym.spaces.Discrete(self.k + 1)
        self._rng = np.random.default_rng(env_config.get("seed", 0))
        self.pool: Pool = self.pools[0]
        self.selected: list[int] = []
        self._obs: dict[str, np.ndarray] | None = None

    def _observe(self) -> dict[str, np.ndarray]:
        self._obs = observe(self.pool, self.selected, self.k, self.max_steps)
        return self._obs

    def reset(self, *, seed: int | None = None, options: dict | None = None):
        super().reset(seed=seed)
        if seed is not None:
            self._rng = np.random.default_rng(seed)
        i = (options or {}).get("pool")
        i = int(self._rng.integers(len(self.pools))) if i is None else int(i)
        self.pool = self.pools[i]
        self.selected = []
        return self._observe(), {"qid": self.pool.qid, "selected": []}

    def step(self, action):
        a = int(action)
        assert self._obs is not None, "call reset() first"
        legal = bool(self._obs["action_mask"][a]) if 0 <= a <= self.k else False
        r = 0.0
        stop = a == self.k or not legal
        if not stop:
            if self.reward is not None:
                r += self.reward.step(self.pool, self.selected, a)
            self.selected.append(a)
        done = stop or len(self.selected) >= self.max_steps
        if done and self.reward is not None:
            r += self.reward.final(self.pool, self.selected)[0] if self.selected else 0.0
        obs = self._observe()
        return obs, float(r), bool(done), False, {"qid": self.pool.qid,
                                                   "selected": list(self.selected)}
