"""Every two-node check in one cluster session (tests/test_multinode.py runs this script inside
a private network namespace: tests/support/ray_cluster.py says why).

    python tests/support/multinode.py ROOT OUT.json

1. before the cluster: every config of PPO's space evaluated once into ROOT/cache (8,
   `multinode_tune.warm`: k 3 or 5, no reranking; the PPO settings of `multinode_ppo.policy`,
   2 remote env runners, over that space: bench/cluster.py `--quick`'s); the Tune grid's 4
   configs (k 3) are among them, so its evaluator over the same cache only reads; the
   fan-out's in-process references (`multinode_fanout.prepare`: indexes, the evaluation, the
   corpus vectors);
2. one head and one second node (1 CPU each), the driver connected (`cluster_session`);
3. the parts, in order: "tune" (`multinode_tune.both_runs`: 2 nodes with one process per
   trial, then pinned to the head, in one reused process: the head's placement is what the
   1-node run checks), "ppo" (`multinode_ppo.run`: 2 remote env runners, then both on the
   head), "eval" and "index" (`multinode_fanout.run_eval` / `run_index`). A part that raises
   is recorded as `report[part] = {"error", "traceback"}` and the next part still runs, so
   each test names its own failure;
4. writes OUT.json (the cluster's node ids, one entry per part, seconds per stage); stops the
   cluster.

One session instead of one per part: the cluster start, the imports and the warm-up are paid
once per test run (bench/cluster.py runs the same parts the same way, at its own sizes).
"""

from __future__ import annotations

import json
import sys
import time
import traceback
from collections.abc import Callable
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path[:0] = [str(REPO / "src"), str(REPO)]

PARTS = ("tune", "ppo", "eval", "index")


def run_parts(parts: dict[str, Callable[[], dict]], report: dict) -> None:
    """Run each part, its result (or its error and traceback) as `report[name]`, with the
    part's wall seconds as `part_wall_s`."""
    for name, fn in parts.items():
        t0 = time.perf_counter()
        try:
            report[name] = fn()
        except Exception as exc:  # recorded for the test of this part; the next part runs
            report[name] = {"error": f"{type(exc).__name__}: {exc}",
                            "traceback": traceback.format_exc()[-4000:]}
        report[name]["part_wall_s"] = time.perf_counter() - t0


def main(root: Path, out: Path) -> None:
    from bench.cluster import ppo_policy
    from tests.support import multinode_fanout, multinode_ppo, multinode_tune
    from tests.support.ray_cluster import HEAD_RESOURCE, cluster_session

    t0 = time.perf_counter()
    ev, n_grid = multinode_tune.warm(root / "cache")
    tune_ev, n_tune = multinode_tune.warm(root / "cache", k_grid=(3,))
    report: dict = {"grid": n_grid, "tune_grid": n_tune, "warm_s": time.perf_counter() - t0}
    t1 = time.perf_counter()
    prep = multinode_fanout.prepare(root / "fanout")
    report["fanout_prepare_s"] = time.perf_counter() - t1

    def tune() -> dict:
        runs: dict = {}
        multinode_tune.both_runs(tune_ev, root, runs, reuse_one_node=True)
        return runs

    def ppo() -> dict:
        return {"2-nodes": multinode_ppo.run(ev, ppo_policy(quick=True)),
                "1-node": multinode_ppo.run(ev, ppo_policy(
                    quick=True, num_cpus_per_env_runner=0.0,
                    env_runner_resources={HEAD_RESOURCE: 0.5}))}

    with cluster_session(root, out, report):
        run_parts({"tune": tune, "ppo": ppo,
                   "eval": lambda: multinode_fanout.run_eval(prep),
                   "index": lambda: multinode_fanout.run_index(prep)}, report)
    report["wall_s"] = time.perf_counter() - t0
    out.write_text(json.dumps(report, indent=1))


if __name__ == "__main__":
    main(Path(sys.argv[1]), Path(sys.argv[2]))
