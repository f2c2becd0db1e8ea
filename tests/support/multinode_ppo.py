"""The tuner's PPO on a real two-node Ray cluster: the pieces tests/support/multinode.py (the
test's cluster session) and bench/cluster.py run.

- `policy(**ppo)`: a 24-config space, PPO with 2 remote env runners of 1 CPU each;
- `warm(cache)`: every config of that space evaluated once into `cache`, so every later step
  reads a stored table (rewards then do not depend on which process or node computed them);
- `run(ev, policy)`: `ITERATIONS` of training, then the greedy read-out: the best config, the
  incumbent, the greedy config and every step's (runner, node_id, config_hash, reward, seq).
  With 1 CPU per runner Ray must put one runner on each node ("2-nodes"); with both holding
  the head's custom resource, both run on the head ("1-node").
"""


from __future__ import annotations

import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path[:0] = [str(REPO / "src"), str(REPO)]

SEED = 7
ITERATIONS = 2


def policy(**ppo):
    from rl.kernel.settings import TunerSettings

    s = TunerSettings.defaults().with_overrides(
        k_grid=[3, 5, 8], fusion_grid=0.5, fusion_step=0.5,
        discrete={"variant": ["bm25", "hybrid"], "rerank": ["off", "on"],
                  "prompt_id": ["cite_concise"]},
        episode={"length": 4, "batch_size": 40},
        ppo={"train_batch_size": 8, "minibatch_size": 4, "num_epochs": 2, "hidden": [16],
             "num_env_runners": 2, **ppo})
    # the heads issue 18 added (where this tree has them) pinned to the base config: the
    # space stays the 24 configs above, all warmed
    return s.with_legacy_space() if hasattr(s, "with_legacy_space") else s


def warm(cache: Path):
    """Every config of the space evaluated once: its table stored under `cache`."""
    from rl.common.data import TuningData
    from rl.kernel.evaluator import TunerEvaluator
    from rl.kernel.space import ConfigSpace

    p = policy()
    ev = TunerEvaluator(TuningData.open("synthetic"), p, cache_root=cache)
    grid = list(ConfigSpace(p).grid())
    for cfg in grid:
        ev.table(cfg, ev.slice.tune_split)
    return ev, len(grid)


def run(ev, p) -> dict:
    from rl.tuner.ppo import PPOTuner

    tuner = PPOTuner(ev, p, seed=SEED)
    t0 = time.perf_counter()
    try:
        res = tuner.train(ITERATIONS)
    finally:
        tuner.stop()
    return {"best": res.best_config.config_hash,
            "incumbent": res.extra["incumbent_hash"],
            "incumbent_reward": res.extra["incumbent_reward"],
            "greedy": res.extra["greedy_config"].config_hash,
            "evaluations": res.evaluations, "wall_s": time.perf_counter() - t0,
            "steps": [{k: h[k] for k in ("runner", "node_id", "config_hash", "reward", "seq")}
                      for h in tuner.history]}
