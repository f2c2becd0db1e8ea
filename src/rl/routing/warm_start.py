"""Behaviour-cloning warm start of the per-query PPO policy: before PPO samples anything, the
RLModule's action heads are fitted (supervised, plain torch) to a known-good choice per
training query, so iteration 0 already acts like a baseline and PPO only moves on evidence.

A `WarmStart` names the target config of each training query: one config for all (the best
static config) or one per query (e.g. the supervised router's picks). `HeadLayout.encode`
turns each into an action; a `defer` warm start (a layout with the defer head) also sets
defer = 1 (hand every query to the base policy; the other heads still learn the targets, so a
later defer = 0 starts from them); `clone` fits the module to them:

    loss = sum_{categorical h} CE_smooth(logits_h, a_h; keep)          (label smoothing)
         + sum_{box h} [(mu_h - (2 u_h - 1))^2 + (log sigma_h - log sigma_0)^2]
         + (V(s) - r(s, a_target))^2                                     (value head)

`keep` is the probability the cloned module puts on each categorical head's target value (the
rest spread evenly: PPO's exploration starts from there), `sigma_0` the raw Gaussian std of
the box heads (actions are u = (clip(x, -1, 1) + 1) / 2 of x ~ N(mu, sigma)). The value head
learns the target's per-query reward, so PPO's first advantages are r - E[r | s] of the warm
start, not r - 0. With `keep` > 1/2 the greedy action (argmax, mean) is the target: a test
checks that the cloned module's greedy configs equal the targets on a toy world.

The module is then handed to RLlib the documented way (`RLModule.save_to_path`, then
`Algorithm.restore_from_path(..., component=MODULE_COMPONENT)`, which also syncs the env
runners): `rl.routing.ppo_policy.PerQueryPPO.train`.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from rag.config import RAGConfig
from rl.routing.heads import HeadLayout
from rl.routing.selection import better_on_valid
from rl.routing.settings import WarmStartSettings
from rl.routing.worlds import RoleData

MODULE_COMPONENT = "learner_group/learner/rl_module/default_policy"
"""Where `Algorithm.restore_from_path` puts a single-agent module's state."""


@dataclass(frozen=True)
class WarmStart:
    """`name` (e.g. "best-static"); `configs`: one target per training query, or a single
    config for every query."""

    name: str
    configs: Sequence[RAGConfig]
    defer: bool = False
    """Clone defer = 1 (the layout needs a `defer` head): act as the base policy."""

    def targets(self, n: int) -> list[RAGConfig]:
        cs = list(self.configs)
        if len(cs) == 1:
            return cs * n
        if len(cs) != n:
            raise ValueError(f"warm start {self.name!r}: {len(cs)} targets for {n} queries")
        return cs


def _columns(layout: HeadLayout) -> dict[str, slice]:
    """The `action_dist_inputs` columns of each head (sorted head order, as RLlib flattens:
    n logits for a Discrete head, (mean, log std) for a Box head)."""
    out, j = {}, 0
    for h in layout.names:
        n = layout.discrete.get(h, 2)
        out[h] = slice(j, j + n)
        j += n
    return out


def clone(module: Any, layout: HeadLayout, obs: np.ndarray, configs: Sequence[RAGConfig],
          values: np.ndarray | None, settings: WarmStartSettings, seed: int = 0,
          defer: bool = False, base: Sequence[RAGConfig] | None = None) -> dict[str, float]:
    """Fit `module` (a built RLModule of `layout`'s action space) to act `configs[i]` on
    `obs[i]` (standardised observations), and its value head to `values` (None: leave it);
    `defer`: the target's defer head says 1 (`base[i]`, the base policy's config, is then
    what the greedy action stands for). Returns the final loss, the share of targets `layout`
    can express exactly and the share of rows whose greedy config is the target."""
    import torch
    import torch.nn.functional as F

    if defer and not layout.defers:
        raise ValueError("a defer warm start needs a layout with the defer head")
    layout.check_base(base, len(configs), "base")
    torch.manual_seed(seed)
    enc = [layout.encode(c) for c in configs]
    acts = [{**a, "defer": 1} if defer else a for a, _ in enc]
    if defer:
        enc = [(a, True) for a, _ in enc]
    bases = [None] * len(configs) if base is None else list(base)
    x = torch.as_tensor(np.asarray(obs, np.float32))
    cols = _columns(layout)
    tgt: dict[str, torch.Tensor] = {}
    for h in layout.names:
        if h in layout.discrete:
            tgt[h] = torch.as_tensor([int(a[h]) for a in acts], dtype=torch.long)
        else:
            u = np.array([float(np.asarray(a[h]).reshape(-1)[0]) for a in acts], np.float32)
            tgt[h] = torch.as_tensor(2.0 * np.clip(u, 0.0, 1.0) - 1.0)
    v = None if values is None else torch.as_tensor(np.asarray(values, np.float32))
    log_s0 = float(np.log(settings.std))
    module.train()
    opt = torch.optim.Adam(module.parameters(), lr=settings.lr)
    loss = torch.zeros(())
    for _ in range(settings.steps):
        out = module.forward_train({"obs": x})
        z = out["action_dist_inputs"]
        loss = torch.zeros(())
        for h, sl in cols.items():
            zh = z[:, sl]
            n = zh.shape[1]
            if h in layout.discrete:
                if n > 1:
                    eps = (1.0 - settings.keep) * n / (n - 1)
                    loss = loss + F.cross_entropy(zh, tgt[h], label_smoothing=eps)
            else:
                loss = loss + F.mse_loss(zh[:, 0], tgt[h]) + F.mse_loss(
                    zh[:, 1], torch.full_like(zh[:, 1], log_s0))
        if v is not None:
            loss = loss + F.mse_loss(module.compute_values({"obs": x},
                                                           out.get("embeddings")), v)
        opt.zero_grad()
        loss.backward()
        opt.step()
    module.eval()
    with torch.no_grad():
        z = module.forward_inference({"obs": x})["action_dist_inputs"].numpy()
    greedy = [layout.decode({h: (int(z[i, cols[h]].argmax()) if h in layout.discrete
                                 else [(np.clip(z[i, cols[h]][0], -1, 1) + 1) / 2])
                             for h in layout.names}, bases[i]) for i in range(len(z))]
    same = np.mean([g.config_hash == layout.decode(a, b).config_hash
                    for g, a, b in zip(greedy, acts, bases, strict=True)])
    return {"loss": float(loss.detach()), "expressible": float(np.mean([e for _, e in enc])),
            "greedy_agreement": float(same)}


def choose_start(policy: Any, warm: Sequence[WarmStart], train: RoleData, valid: RoleData,
                 cap: float, seed: int = 0
                 ) -> tuple[list[dict[str, Any]], dict[str, Any], Any, list[float]]:
    """Clone a fresh module of `policy` (`PerQueryPPO`) to each warm start on the `train`
    role (value head: the target's reward on its world minus the policy's lambda times its
    cost), score its greedy policy on the `valid` role; returns the iteration-0 records, the
    best one by model selection's rule (`better_on_valid` with cost cap `cap`), its module and
    its per-query valid rewards (what a later checkpoint must beat under the evidence rule).
    Each role's `base`: the base policy's configs (a layout with the defer head).
    ValueError without a warm start."""
    world, base_train = train.world, train.base
    obs = policy.standardise(train.X)
    recs, best, best_module, best_rewards = [], None, None, []
    for w in warm:
        targets = w.targets(world.n)
        acted = list(base_train) if w.defer and base_train is not None else targets
        values = np.array([o.reward - policy.lam * o.cost for o in world.outcomes(acted)])
        module = policy.spec().build()
        fit = clone(module, policy.layout, obs, targets, values, policy.settings.warm_start,
                    seed, w.defer, base_train)
        policy.module = module
        outs = valid.world.outcomes(policy.act(valid.X, valid.base))
        rewards = [o.reward for o in outs]
        rec = {"iter": 0, "start": w.name, "lambda": policy.lam,
               "valid_reward": float(np.mean(rewards)),
               "valid_cost": float(np.mean([o.cost for o in outs])),
               **{k: round(v, 4) for k, v in fit.items()}}
        recs.append(rec)
        if better_on_valid(rec, best, cap):
            best, best_module, best_rewards = rec, module, rewards
    if best is None:
        raise ValueError("choose_start needs at least one warm start")
    return recs, best, best_module, best_rewards
