"""The selection policy network and greedy/sampled rollouts.

`SelectionNet` scores each candidate with one small MLP over [candidate features, a projection
of the global state] (weights shared across candidates, so K can change between training and
use) and a stop logit from the global state and pooled candidate hidden states. A value head
(same inputs as the stop head) serves PPO. The same module is what behaviour cloning and RAFT
train and what the RLlib RLModule wraps, so BC weights load into PPO unchanged.

Logits of masked actions are set to -1e9 (as RLlib's FLOAT_MIN masking does).
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch
from torch import nn

from rl.selection.features import CAND_DIM, Pool, observe

MASK_VALUE = -1e9


class SelectionNet(nn.Module):
    def __init__(self, glob_dim: int, hidden: int = 64, glob_proj: int = 16):
        super().__init__()
        self.glob_dim, self.hidden, self.glob_proj_dim = glob_dim, hidden, glob_proj
        self.glob = nn.Sequential(nn.Linear(glob_dim, glob_proj), nn.Tanh())
        self.cand = nn.Sequential(nn.Linear(CAND_DIM + glob_proj, hidden), nn.ReLU(),
                                  nn.Linear(hidden, hidden), nn.ReLU())
        self.score = nn.Linear(hidden, 1)
        self.stop = nn.Sequential(nn.Linear(glob_proj + 2 * hidden + 1, hidden), nn.ReLU(),
                                  nn.Linear(hidden, 1))
        self.value = nn.Sequential(nn.Linear(glob_proj + 2 * hidden + 1, hidden), nn.ReLU(),
                                   nn.Linear(hidden, 1))

    def _trunk(self, cand: torch.Tensor, glob: torch.Tensor, mask: torch.Tensor):
        g = self.glob(glob)                                         # (B, P)
        k = cand.shape[1]
        h = self.cand(torch.cat([cand, g[:, None, :].expand(-1, k, -1)], dim=-1))  # (B, K, H)
        avail = mask[:, :k, None]
        n = avail.sum(dim=1).clamp(min=1.0)
        mean = (h * avail).sum(dim=1) / n
        mx = torch.where(avail > 0, h, torch.zeros_like(h)).max(dim=1).values
        pooled = torch.cat([g, mean, mx, (n / k)], dim=-1)
        return h, pooled

    def forward(self, cand: torch.Tensor, glob: torch.Tensor, mask: torch.Tensor
                ) -> tuple[torch.Tensor, torch.Tensor]:
        """(masked logits (B, K+1), values (B,))."""
        h, pooled = self._trunk(cand, glob, mask)
        logits = torch.cat([self.score(h).squeeze(-1), self.stop(pooled)], dim=-1)
        logits = torch.where(mask > 0, logits, torch.full_like(logits, MASK_VALUE))
        return logits, self.value(pooled).squeeze(-1)

    def config(self) -> dict[str, int]:
        return {"glob_dim": self.glob_dim, "hidden": self.hidden, "glob_proj": self.glob_proj_dim}


def to_batch(obs: Sequence[dict[str, np.ndarray]]) -> tuple[torch.Tensor, ...]:
    return tuple(torch.as_tensor(np.stack([o[key] for o in obs]))
                 for key in ("cand", "glob", "action_mask"))


@dataclass
class Rollout:
    selected: list[int]
    obs: list[dict[str, np.ndarray]]
    actions: list[int]
    ms: float  # policy wall time for the whole episode (features + forward passes)


@torch.no_grad()
def rollout(net: SelectionNet, pool: Pool, k: int, max_steps: int, greedy: bool = True,
            temperature: float = 1.0, rng: np.random.Generator | None = None) -> Rollout:
    """One episode on `pool`: argmax (greedy) or sampled actions from the masked softmax."""
    t0 = time.perf_counter()
    sel: list[int] = []
    obs_l, acts = [], []
    while True:
        o = observe(pool, sel, k, max_steps)
        logits, _ = net(*to_batch([o]))
        logits = logits[0]
        if greedy:
            a = int(torch.argmax(logits))
        else:
            p = torch.softmax(logits / temperature, dim=-1).numpy().astype(np.float64)
            p /= p.sum()
            a = int((rng or np.random.default_rng()).choice(len(p), p=p))
        obs_l.append(o)
        acts.append(a)
        if a == k or not o["action_mask"][a]:
            break
        sel.append(a)
        if len(sel) >= max_steps:
            break
    return Rollout(sel, obs_l, acts, (time.perf_counter() - t0) * 1000.0)


def expert_steps(pool: Pool, selected: Sequence[int], k: int, max_steps: int
                 ) -> tuple[list[dict[str, np.ndarray]], list[int]]:
    """(observations, actions) that reproduce `selected`, then stop (unless at the budget)."""
    obs, acts = [], []
    for t, j in enumerate(selected):
        obs.append(observe(pool, selected[:t], k, max_steps))
        acts.append(int(j))
    if len(selected) < max_steps:
        obs.append(observe(pool, list(selected), k, max_steps))
        acts.append(k)
    return obs, acts
