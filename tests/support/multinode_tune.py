"""Ray Tune config search on a real two-node Ray cluster: the pieces tests/support/multinode.py
(the test's cluster session) and bench/cluster.py run.

- `tune_policy(k_grid)`: `multinode_ppo.policy()` cut to 8 configs (4 with k 3 alone);
- `warm(cache, full)`: every config of that space (with `full` the 24 of
  `multinode_ppo.policy`) evaluated once into `cache`, so every trial only reads stored tables;
- `both_runs(ev, root, report)`: `tune_search(method="grid", max_concurrent=2,
  reuse_actors=False)`, each trial in its own process holding 1 CPU, so Ray must run the two
  trials at once on different nodes ("2-nodes"); then the same seed with every trial also
  holding the head's custom resource, so all run on the head, one at a time ("1-node"). Each
  run: the best config and reward, the query evaluations, the wall seconds and every trial's
  (config_hash, node_id, rung rewards).

What is deterministic with 2 trials at once: the grid fixes the set of configs (all of them,
each scored on the whole split in one rung: grid is not multi-fidelity; the budget covers them), the stored tables fix each one's rewards, and the
incumbent breaks ties by trial creation order, so the best config does not depend on which
trial reported first. The order of results does, and is not compared.
"""


from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
sys.path[:0] = [str(REPO / "src"), str(REPO)]

SEED = 7
MAX_CONCURRENT = 2
RUNGS = (25, 75, None)


def tune_policy(k_grid: tuple[int, ...] = (3, 5)):
    """`multinode_ppo.policy()` cut to the k of `k_grid`, no reranking: 8 configs with k 3 or 5,
    4 with k 3 alone. Each trial runs in a fresh process (~3-5 s here), so the tests search a
    smaller grid."""
    from tests.support.multinode_ppo import policy

    p = policy()
    discrete = p.model_dump(mode="json", by_alias=True)["discrete"]
    return p.with_overrides(k_grid=list(k_grid), discrete={**discrete, "rerank": ["off"]})


def warm(cache: Path, full: bool = False, k_grid: tuple[int, ...] = (3, 5)
         ) -> tuple[Any, int]:
    """(TunerEvaluator over `cache`, grid size) with every config of its space evaluated once:
    `multinode_ppo.warm` (24 configs) when `full`, else `tune_policy(k_grid)`'s."""
    from tests.support import multinode_ppo

    from rl.common.data import TuningData
    from rl.kernel.evaluator import TunerEvaluator
    from rl.kernel.space import ConfigSpace

    if full:
        return multinode_ppo.warm(cache)
    p = tune_policy(k_grid)
    ev = TunerEvaluator(TuningData.open("synthetic"), p, cache_root=cache)
    grid = list(ConfigSpace(p).grid())
    for cfg in grid:
        ev.table(cfg, ev.slice.tune_split)
    return ev, len(grid)


def search(ev: Any, storage: Path, resources: dict[str, float],
           reuse_actors: bool = False) -> dict:
    """The grid search of `ev`'s space (every config to the whole tune split, `MAX_CONCURRENT`
    trials at once, each holding `resources`; `reuse_actors` as `tune_search`), summarised
    JSON-safe."""
    from rl.kernel.space import ConfigSpace
    from rl.tuner.plan import SearchPlan
    from rl.tuner.tune_search import TuneOptions, tune_search

    space = ConfigSpace(ev.policy)
    n_grid = sum(1 for _ in space.grid())
    n = len(ev.data.examples(ev.slice.tune_split))
    res = tune_search(ev, space, SearchPlan("grid", budget=n_grid * n, seed=SEED), rungs=RUNGS,
                      options=TuneOptions(max_concurrent=MAX_CONCURRENT,
                                          resources_per_trial=resources,
                                          reuse_actors=reuse_actors, storage_path=storage))
    return {"best": res.best_config.config_hash, "best_reward": res.best_reward,
            "query_evals": res.query_evals, "wall_s": res.wall_s,
            "trials": [{"trial_id": t.trial_id, "config_hash": t.config.config_hash,
                        "node_id": t.node_id, "rung_rewards": [r["reward"] for r in t.rungs],
                        "query_evals": t.query_evals} for t in res.trials]}


def both_runs(ev: Any, root: Path, report: dict, reuse_one_node: bool = False) -> None:
    """`report["2-nodes"]`: the search with 1 CPU per trial, one process per trial (Ray spreads
    them over the nodes); `report["1-node"]`: each trial also holds the head's resource (all run
    on the head, one at a time), in one process per trial, or with `reuse_one_node` in the
    finished trial's process (the placement is the head's either way; it skips a process start
    per trial, but the 1-node wall is then no longer comparable with the 2-node one)."""
    from tests.support.ray_cluster import HEAD_RESOURCE

    report["2-nodes"] = search(ev, root / "tune-2", {"cpu": 1})
    report["1-node"] = search(ev, root / "tune-1", {"cpu": 1, HEAD_RESOURCE: 1},
                              reuse_actors=reuse_one_node)
