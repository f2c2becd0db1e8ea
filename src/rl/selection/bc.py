"""Behaviour cloning from expert selections.

Expert = oracle picks of the gold supporting passages that are among the candidates (HotpotQA
supporting paragraphs, MTRAG gold passages), in the baseline's rerank order, then stop. A query
whose candidates hold no gold passage gets a greedy expert instead: repeatedly add the candidate
(among the first `greedy_pool` in rerank order) that most raises the final reward, and stop when
nothing raises it. The training queries are split into train/val (seeded); training stops when
the validation loss has not improved for `patience` epochs and the best epoch's weights are kept.
"""

from __future__ import annotations

import copy
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np
import torch
from torch import nn

from rl.selection.config import BCConfig
from rl.selection.features import Pool, glob_dim
from rl.selection.policy import SelectionNet, expert_steps, to_batch
from rl.selection.rewards import SelectionReward


def oracle_selection(pool: Pool, max_steps: int) -> list[int]:
    """Gold candidates in rerank order (at most `max_steps`)."""
    return [i for i in pool.rerank_order if i in pool.gold][:max_steps]


def greedy_selection(pool: Pool, reward: SelectionReward, max_steps: int,
                     greedy_pool: int = 10) -> list[int]:
    """Greedy maximisation of the episode return over the first `greedy_pool` candidates."""
    sel: list[int] = []
    best = -np.inf
    cands = pool.rerank_order[:greedy_pool]
    while len(sel) < max_steps:
        scored = [(reward.episode_return(pool, sel + [c]), c) for c in cands if c not in sel]
        if not scored:
            break
        val, c = max(scored, key=lambda t: (t[0], -cands.index(t[1])))
        if val <= best:
            break
        sel.append(c)
        best = val
    return sel or cands[:1]


def expert_selection(pool: Pool, reward: SelectionReward, max_steps: int) -> tuple[list[int], str]:
    """(selection, "oracle" | "greedy")."""
    sel = oracle_selection(pool, max_steps)
    if sel:
        return sel, "oracle"
    return greedy_selection(pool, reward, max_steps), "greedy"


@dataclass
class Demos:
    """Flattened (observation, action) pairs with the query each came from."""

    obs: list[dict[str, np.ndarray]] = field(default_factory=list)
    actions: list[int] = field(default_factory=list)
    query: list[int] = field(default_factory=list)

    def add(self, obs, actions, q: int) -> None:
        self.obs += obs
        self.actions += actions
        self.query += [q] * len(actions)

    def subset(self, queries: set[int]) -> Demos:
        keep = [i for i, q in enumerate(self.query) if q in queries]
        return Demos([self.obs[i] for i in keep], [self.actions[i] for i in keep],
                     [self.query[i] for i in keep])

    def __len__(self) -> int:
        return len(self.actions)


def expert_demos(pools: Sequence[Pool], reward: SelectionReward, k: int, max_steps: int
                 ) -> tuple[Demos, dict[str, int]]:
    demos, kinds = Demos(), {"oracle": 0, "greedy": 0}
    for q, pool in enumerate(pools):
        sel, kind = expert_selection(pool, reward, max_steps)
        kinds[kind] += 1
        demos.add(*expert_steps(pool, sel, k, max_steps), q)
    return demos, kinds


def new_net(pools: Sequence[Pool], hidden: int, seed: int) -> SelectionNet:
    torch.manual_seed(seed)
    return SelectionNet(glob_dim(pools[0].emb.shape[1]), hidden=hidden)


def nll(net: SelectionNet, demos: Demos, weights: np.ndarray | None = None) -> torch.Tensor:
    logits, _ = net(*to_batch(demos.obs))
    loss = nn.functional.cross_entropy(logits, torch.as_tensor(demos.actions), reduction="none")
    if weights is not None:
        loss = loss * torch.as_tensor(weights, dtype=loss.dtype)
    return loss.mean()


def fit(net: SelectionNet, train: Demos, val: Demos | None, epochs: int, lr: float,
        batch_size: int, weight_decay: float = 0.0, patience: int | None = None,
        seed: int = 0) -> dict[str, list[float]]:
    """Minibatch Adam on the cross-entropy of the demonstrated actions; with `val` and
    `patience`, early stopping that restores the best validation epoch."""
    opt = torch.optim.Adam(net.parameters(), lr=lr, weight_decay=weight_decay)
    rng = np.random.default_rng(seed)
    hist: dict[str, list[float]] = {"train": [], "val": []}
    best, best_state, bad = np.inf, None, 0
    n = len(train)
    for _ in range(epochs):
        net.train()
        order = rng.permutation(n)
        tot = 0.0
        for s in range(0, n, batch_size):
            idx = order[s:s + batch_size]
            batch = Demos([train.obs[i] for i in idx], [train.actions[i] for i in idx])
            loss = nll(net, batch)
            opt.zero_grad()
            loss.backward()
            opt.step()
            tot += float(loss.detach()) * len(idx)
        hist["train"].append(tot / max(n, 1))
        if val is not None and len(val):
            net.eval()
            with torch.no_grad():
                v = float(nll(net, val))
            hist["val"].append(v)
            if v < best - 1e-5:
                best, best_state, bad = v, copy.deepcopy(net.state_dict()), 0
            else:
                bad += 1
                if patience is not None and bad >= patience:
                    break
    if best_state is not None:
        net.load_state_dict(best_state)
    net.eval()
    return hist


def split_queries(n: int, val_fraction: float, seed: int) -> tuple[set[int], set[int]]:
    order = np.random.default_rng(seed).permutation(n)
    n_val = max(1, int(round(n * val_fraction))) if n > 1 else 0
    return set(order[n_val:].tolist()), set(order[:n_val].tolist())


def train_bc(pools: Sequence[Pool], reward: SelectionReward, cfg: BCConfig, k: int,
             max_steps: int, seed: int = 0, val_pools: Sequence[Pool] | None = None
             ) -> tuple[SelectionNet, dict]:
    """Behaviour cloning on expert selections of `pools` (training queries only). Early
    stopping on `val_pools`' expert demonstrations when given (e.g. the valid split), else on a
    seeded `val_fraction` of `pools`."""
    demos, kinds = expert_demos(pools, reward, k, max_steps)
    if val_pools is not None:
        train_d, val_d = demos, expert_demos(val_pools, reward, k, max_steps)[0]
        tr, va = set(range(len(pools))), set(range(len(val_pools)))
    else:
        tr, va = split_queries(len(pools), cfg.val_fraction, seed)
        train_d, val_d = demos.subset(tr), demos.subset(va)
    net = new_net(pools, cfg.hidden, seed)
    hist = fit(net, train_d, val_d, cfg.epochs, cfg.lr, cfg.batch_size,
               cfg.weight_decay, cfg.patience, seed)
    info = {"experts": kinds, "demos": len(demos), "train_queries": len(tr),
            "val_queries": len(va), "epochs_run": len(hist["train"]),
            "best_val_loss": float(min(hist["val"])) if hist["val"] else None,
            "history": hist}
    return net, info
