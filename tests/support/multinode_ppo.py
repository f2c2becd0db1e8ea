"""The tuner's PPO on a real two-node Ray cluster (tests/test_ray_multinode.py runs this script
inside a private network namespace: tests/support/ray_cluster.py says why).

    python tests/support/multinode_ppo.py ROOT OUT.json

1. opens the synthetic dataset and evaluates every config of a small space once into a cache
   under ROOT (so every later step reads a stored table: rewards then do not depend on which
   process or node computed them);
2. starts a head and a second node (1 CPU each), connects;
3. trains PPO with 2 remote env runners, 1 CPU each, so Ray must put one on each node
   ("2-nodes"); then the same seed with both runners pinned to the head by its custom
   resource ("1-node");
4. writes OUT.json: the cluster's node ids and, per run, the best config, the incumbent, the
   greedy config and every training step's (runner, node_id, config_hash, reward); stops the
   cluster.
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
    from rl.tuner.settings import TunerSettings

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
    from rl.tuner.evaluator import TunerEvaluator
    from rl.tuner.space import ConfigSpace

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


def main(root: Path, out: Path) -> None:
    from tests.support.ray_cluster import HEAD_RESOURCE, cluster_session

    t0 = time.perf_counter()
    ev, n_grid = warm(root / "cache")
    report: dict = {"grid": n_grid, "warm_s": time.perf_counter() - t0}
    with cluster_session(root, out, report, started=t0, wall_key="wall_s"):
        report["2-nodes"] = run(ev, policy())
        report["1-node"] = run(ev, policy(num_cpus_per_env_runner=0.0,
                                          env_runner_resources={HEAD_RESOURCE: 0.5}))


if __name__ == "__main__":
    main(Path(sys.argv[1]), Path(sys.argv[2]))
