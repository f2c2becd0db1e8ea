"""PPO (RLlib, new API stack) on SelectionEnv, initialised from the BC/RAFT policy.

The RLModule (`SelectionRLModule`) wraps the very `SelectionNet` that BC and RAFT train: its
`model_config` carries the net's shape and the path of a saved state dict, which `setup()` loads,
so the learner's and the env runner's modules both start from the cloned weights (no
re-implementation, no distillation step). Masked actions get -1e9 logits inside the net (the
observation is a Dict with `action_mask`, as in RLlib's action-masking example).
The critic of a cloned policy is untrained; `warm_value` first regresses the value head on
Monte-Carlo returns of the policy's own sampled episodes so PPO's first advantages are not noise.

Sized for one CPU by `rl.common.rllib.ppo_config` (num_env_runners=0, num_learners=0, small
batches from `selection.ppo`) on local Ray (rl.common.runtime.init_ray). Training queries only.
"""

from __future__ import annotations

import copy
import tempfile
import uuid
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch

from rl.selection.config import SelectionConfig
from rl.selection.env import SelectionEnv, register_pools
from rl.selection.features import Pool
from rl.selection.policy import SelectionNet, rollout, to_batch
from rl.selection.rewards import SelectionReward

try:  # RLlib is a heavy import: keep the module importable for type checks without it
    from ray.rllib.core.columns import Columns
    from ray.rllib.core.rl_module.apis.value_function_api import ValueFunctionAPI
    from ray.rllib.core.rl_module.torch import TorchRLModule
except ImportError:  # pragma: no cover - ray is a core dependency of this project
    TorchRLModule = object  # type: ignore[misc,assignment]
    ValueFunctionAPI = object  # type: ignore[misc,assignment]
    Columns = None  # type: ignore[assignment]


class SelectionRLModule(TorchRLModule, ValueFunctionAPI):
    """RLlib wrapper of SelectionNet (module docstring)."""

    def setup(self):
        mc = self.model_config
        self.net = SelectionNet(int(mc["glob_dim"]), hidden=int(mc["hidden"]),
                                glob_proj=int(mc["glob_proj"]))
        if mc.get("init_path"):
            self.net.load_state_dict(torch.load(mc["init_path"], weights_only=True))

    def _forward(self, batch: dict[str, Any], **kwargs) -> dict[str, Any]:
        obs = batch[Columns.OBS]
        logits, _ = self.net(obs["cand"], obs["glob"], obs["action_mask"])
        return {Columns.ACTION_DIST_INPUTS: logits}

    def compute_values(self, batch: dict[str, Any], embeddings=None):
        obs = batch[Columns.OBS]
        _, v = self.net(obs["cand"], obs["glob"], obs["action_mask"])
        return v


def warm_value(net: SelectionNet, pools: Sequence[Pool], reward: SelectionReward, k: int,
               max_steps: int, episodes_per_pool: int = 2, epochs: int = 30, seed: int = 0
               ) -> float:
    """Fit the value head (only) to returns-to-go of sampled episodes; returns the final MSE."""
    rng = np.random.default_rng(seed)
    obs, targets = [], []
    for pool in pools:
        for _ in range(episodes_per_pool):
            ro = rollout(net, pool, k, max_steps, greedy=False, rng=rng)
            sel = ro.selected
            steps = [reward.step(pool, sel[:t], j) for t, j in enumerate(sel)]
            final = reward.final(pool, sel)[0] if sel else 0.0
            rewards = steps + [0.0] * (len(ro.obs) - len(steps))
            rewards[-1] += final
            togo = np.cumsum(rewards[::-1])[::-1]
            obs += ro.obs
            targets += togo.tolist()
    opt = torch.optim.Adam(net.value.parameters(), lr=3e-3)
    y = torch.as_tensor(targets, dtype=torch.float32)
    batch = to_batch(obs)
    mse = float("nan")
    for _ in range(epochs):
        _, v = net(*batch)
        loss = torch.mean((v - y) ** 2)
        opt.zero_grad()
        loss.backward()
        opt.step()
        mse = float(loss.detach())
    return mse


class SelectionPPO:
    """`SelectionPPO(cfg, pools, reward, init=net).train()` -> (trained SelectionNet, info)."""

    def __init__(self, cfg: SelectionConfig, pools: Sequence[Pool], reward: SelectionReward,
                 init: SelectionNet | None = None):
        self.cfg = cfg
        self.pools = list(pools)
        self.reward = reward
        self.key = register_pools(f"selection-{uuid.uuid4().hex[:8]}", self.pools, reward,
                                  cfg.env)
        env = SelectionEnv(pools=self.pools, reward=reward, cfg=cfg.env)
        self.glob_dim = int(env.observation_space["glob"].shape[0])
        self.init = copy.deepcopy(init) if init is not None else None
        self.algo = None
        self._tmp = tempfile.TemporaryDirectory(prefix="selection-ppo-")

    def algo_config(self):
        from ray.rllib.core.rl_module.rl_module import RLModuleSpec

        from rl.common.rllib import ppo_config

        p = self.cfg.ppo
        gamma, gae_lambda = p.discount(1.0, 0.95)
        mc: dict[str, Any] = {"glob_dim": self.glob_dim, "hidden": self.cfg.bc.hidden,
                              "glob_proj": 16}
        if self.init is not None:
            path = Path(self._tmp.name) / "init.pt"
            torch.save(self.init.state_dict(), path)
            mc.update(self.init.config())
            mc["init_path"] = str(path)
        return ppo_config(SelectionEnv, {"pools": self.key, "seed": self.cfg.seed},
                          seed=self.cfg.seed, train_batch_size=p.train_batch_size,
                          module=RLModuleSpec(module_class=SelectionRLModule,
                                              model_config=mc),
                          smoothing_episodes=20, disable_env_checking=True, lr=p.lr,
                          clip_param=p.clip_param, lambda_=gae_lambda, gamma=gamma,
                          entropy_coeff=p.entropy_coeff, use_kl_loss=p.use_kl_loss,
                          kl_target=p.kl_target,
                          minibatch_size=p.minibatch_size, num_epochs=p.num_epochs,
                          vf_loss_coeff=0.5)

    def build(self) -> None:
        from rl.common.runtime import init_ray

        init_ray()
        if self.algo is None:
            self.algo = self.algo_config().build_algo()

    def net(self) -> SelectionNet:
        """The learner's current weights as a plain SelectionNet."""
        weights = self.algo.learner_group.get_weights()["default_policy"]
        net = SelectionNet(self.glob_dim, hidden=self.cfg.bc.hidden)
        net.load_state_dict({k.removeprefix("net."): torch.as_tensor(np.asarray(v))
                             for k, v in weights.items() if k.startswith("net.")})
        net.eval()
        return net

    def train(self, iterations: int | None = None) -> tuple[SelectionNet, dict]:
        self.build()
        curve = []
        for _ in range(self.cfg.ppo.iterations if iterations is None else iterations):
            res = self.algo.train()
            er = res.get("env_runners", {})
            learner = (res.get("learners") or {}).get("default_policy") or {}
            curve.append({"episode_return_mean": float(er.get("episode_return_mean",
                                                              float("nan"))),
                          "episode_len_mean": float(er.get("episode_len_mean", float("nan"))),
                          **{k: float(learner[k]) for k in ("policy_loss", "vf_loss", "entropy")
                             if k in learner}})
        return self.net(), {"iterations": len(curve), "curve": curve,
                            "initialised_from": "bc+raft" if self.init is not None else "scratch"}

    def stop(self) -> None:
        if self.algo is not None:
            self.algo.stop()
            self.algo = None
        self._tmp.cleanup()
