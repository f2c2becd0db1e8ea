"""RAFT (reward-ranked fine-tuning) of a selection policy.

Each round: for every training query sample `samples` selections from the current policy
(softmax at `temperature`), score each by the episode return (rl.selection.rewards: answer F1
of the reader, supporting-passage F1, faithfulness and the distilled reward model when their
weights are on and the model exists, MMR shaping), keep the best one, and fine-tune on those
best selections (plus the expert demonstrations when `keep_expert`). The policy after each round
is scored on held-out *training* queries (greedy return); the best round's weights are kept, so
a round that hurts is not shipped. Holdout/test queries are never used.
"""

from __future__ import annotations

import copy
from collections.abc import Sequence

import numpy as np

from rl.selection.bc import Demos, expert_demos, fit, split_queries
from rl.selection.config import RaftConfig
from rl.selection.features import Pool
from rl.selection.policy import SelectionNet, expert_steps, rollout
from rl.selection.rewards import SelectionReward


def greedy_return(net: SelectionNet, pools: Sequence[Pool], reward: SelectionReward, k: int,
                  max_steps: int) -> float:
    if not pools:
        return float("nan")
    return float(np.mean([reward.episode_return(p, rollout(net, p, k, max_steps).selected)
                          for p in pools]))


def best_of_n(net: SelectionNet, pool: Pool, reward: SelectionReward, k: int, max_steps: int,
              n: int, temperature: float, rng: np.random.Generator) -> tuple[list[int], float]:
    """The highest-return selection among `n` samples and the greedy one."""
    cands = [rollout(net, pool, k, max_steps).selected]
    cands += [rollout(net, pool, k, max_steps, greedy=False, temperature=temperature,
                      rng=rng).selected for _ in range(n)]
    scored = [(reward.episode_return(pool, s), -len(s), s) for s in cands if s]
    if not scored:
        return [], 0.0
    ret, _, sel = max(scored, key=lambda t: (t[0], t[1]))
    return sel, float(ret)


def train_raft(net: SelectionNet, pools: Sequence[Pool], reward: SelectionReward,
               cfg: RaftConfig, k: int, max_steps: int, val_fraction: float = 0.15,
               batch_size: int = 64, seed: int = 0,
               val_pools: Sequence[Pool] | None = None) -> tuple[SelectionNet, dict]:
    """RAFT rounds from `net` (module docstring). Model selection on `val_pools` (e.g. the
    valid split) when given, else on a seeded `val_fraction` of `pools`."""
    net = copy.deepcopy(net)
    if val_pools is not None:
        tr_pools, va_pools = list(pools), list(val_pools)
    else:
        tr, va = split_queries(len(pools), val_fraction, seed)
        tr_pools = [pools[i] for i in sorted(tr)]
        va_pools = [pools[i] for i in sorted(va)]
    expert = expert_demos(tr_pools, reward, k, max_steps)[0] if cfg.keep_expert else Demos()
    rng = np.random.default_rng(seed + 1)
    best_val = greedy_return(net, va_pools, reward, k, max_steps)
    best_state, best_round = copy.deepcopy(net.state_dict()), 0
    rounds = []
    for r in range(1, cfg.rounds + 1):
        demos = Demos(list(expert.obs), list(expert.actions), list(expert.query))
        rets = []
        for q, pool in enumerate(tr_pools):
            sel, ret = best_of_n(net, pool, reward, k, max_steps, cfg.samples,
                                 cfg.temperature, rng)
            if sel:
                demos.add(*expert_steps(pool, sel, k, max_steps), q)
                rets.append(ret)
        fit(net, demos, None, cfg.epochs, cfg.lr, batch_size, seed=seed + r)
        val = greedy_return(net, va_pools, reward, k, max_steps)
        rounds.append({"round": r, "best_of_n_return": float(np.mean(rets)) if rets else None,
                       "val_greedy_return": val, "demos": len(demos)})
        if val > best_val:
            best_val, best_state, best_round = val, copy.deepcopy(net.state_dict()), r
    net.load_state_dict(best_state)
    net.eval()
    return net, {"rounds": rounds, "best_round": best_round, "best_val_return": best_val,
                 "ranked_by": "episode return" + (" incl. reward model"
                                                   if reward.has_reward_model
                                                   and reward.cfg.reward_model > 0 else "")}
