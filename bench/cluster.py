"""Cluster acceptance benchmark (issue 23): Ray Tune trials, RLlib PPO env runners, `ragpilot
eval` and dense index encoding on a real two-node Ray cluster on this machine, each compared with
the same seed on one node (tune, ppo) or in one process (eval, index).

    python bench/cluster.py                # full: 24-config space, PPO 2 iterations
    python bench/cluster.py --quick        # ~2 min: 8-config space, PPO 1 iteration

The benchmark re-runs itself (`--inner ROOT OUT`) inside a private network namespace and there
starts a head and a second node with `ray start` (1 CPU each, custom resources `head` /
`worker_node`: tests/support/ray_cluster.py; tests/test_multinode.py runs the same parts in
one session through tests/support/multinode.py) on the synthetic dataset, after evaluating
every config of the space once into a shared cache (so rewards do not depend on the node that
reads them):
  tune   grid on `tune_search`, `TuneOptions(max_concurrent=2, reuse_actors=False)`, 1 CPU
         per trial ("2 nodes"), then every trial also holding the head's resource ("1 node");
         tests/support/multinode_tune.py
  ppo    `PPOTuner` with 2 remote env runners of 1 CPU ("2 nodes"), then both pinned to the
         head ("1 node"); tests/support/multinode_ppo.py
  eval   `rl.common.fanout.evaluate_fanout`, 2 tasks of 1 CPU (one per node) over the 240
         questions, vs `rag.evaluate.evaluate` in the driver; tests/support/multinode_fanout.py
  index  `rl.common.fanout.RayDocumentEncoder`, 2 tasks encoding the 300 passages for the
         FAISS index, vs the driver's encoder; tests/support/multinode_fanout.py
Rows (dataset "synthetic"; system tune-2-nodes / ppo-2-nodes / eval-2-nodes / index-2-nodes,
and *-1-node for wall time):
  nodes_used                  distinct Ray nodes that ran trials (tune), env steps (ppo) or
                              tasks (eval, index)
  best_config_matches_1_node  1 when the best config (and its reward) equals the 1-node run's
  same_results_as_1_node      tune: every config's rung rewards equal; ppo: the step trace
                              (runner, step, config, reward), incumbent and greedy pick equal
  matches_1_node              eval: every answer, citation, context, candidate, token count,
                              metric row and mean equals the in-process run's; index: vectors
                              allclose 1e-6 and the same top-10 for every passage as a query
  max_abs_diff                index: largest |vector difference| (float32 rounding)
  bytes_identical             index: 1 when the vectors (so the FAISS file) are byte-identical
  wall_s                      seconds of the search / training / tasks (cluster start and
                              warm-up apart; the 1-node eval/index: in the driver process)
Both nodes share one 2-core machine, so this measures placement and determinism, not speed-up.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.common import REPO, make_meta, parser, plain_row, write_results  # noqa: E402

NAME = "cluster"
TITLE = "Tuning on a two-node Ray cluster (issue 23)"
DATASET = "synthetic"
INNER_TIMEOUT_S = 900
PARTS = ("tune", "ppo", "eval", "index")


# ---- inside the network namespace -------------------------------------------------------------
def inner(root: Path, out: Path, quick: bool) -> None:
    """Warm the cache, start the cluster, run every part (PPO and Tune on 2 nodes and on 1, eval
    and index encoding on 2 nodes against the driver): `out` (JSON)."""
    from tests.support import multinode_fanout, multinode_ppo, multinode_tune
    from tests.support.ray_cluster import HEAD_RESOURCE, cluster_session

    t0 = time.perf_counter()
    report: dict = {"quick": quick, "parts": list(PARTS)}
    ev, n_grid = multinode_tune.warm(root / "cache", full=not quick)
    report.update(warm_s=time.perf_counter() - t0, grid=n_grid)
    if quick:
        multinode_ppo.ITERATIONS = 1
    report["ppo_iterations"] = multinode_ppo.ITERATIONS
    t1 = time.perf_counter()
    prep = multinode_fanout.prepare(root / "fanout")
    report["fanout_prepare_s"] = time.perf_counter() - t1
    with cluster_session(root, out, report):
        multinode_tune.both_runs(ev, root, report)
        report["ppo"] = {
            "2-nodes": multinode_ppo.run(ev, ppo_policy(quick)),
            "1-node": multinode_ppo.run(ev, ppo_policy(
                quick, num_cpus_per_env_runner=0.0,
                env_runner_resources={HEAD_RESOURCE: 0.5}))}
        report["eval"] = multinode_fanout.run_eval(prep)
        report["index"] = multinode_fanout.run_index(prep)
    report["wall_s"] = time.perf_counter() - t0
    out.write_text(json.dumps(report, indent=1))


def ppo_policy(quick: bool, **ppo):
    """The PPO test's settings (`multinode_ppo.policy`, 2 env runners) with `ppo` overrides;
    `quick`: over the 8-config space of `multinode_tune.tune_policy` (less to warm up)."""
    from tests.support import multinode_ppo, multinode_tune

    if not quick:
        return multinode_ppo.policy(**ppo)
    p = multinode_tune.tune_policy()
    return p.with_overrides(ppo={**p.model_dump(mode="json", by_alias=True)["ppo"], **ppo})


def run_cluster(quick: bool) -> dict:
    """`inner` in a fresh private network namespace; its JSON report. The nodes are stopped
    by `inner`, and again here by their recorded process groups (never `ray stop`)."""
    from tests.support.ray_cluster import RUNTIME_ENV, netns_command, stop_recorded

    # short: Ray's unix socket paths under the temp dirs must stay below ~107 characters
    root = Path(tempfile.mkdtemp(prefix="rpb-", dir="/tmp"))
    out = root / "out.json"
    cmd = netns_command([sys.executable, str(Path(__file__).resolve()), "--inner", str(root),
                         str(out)]
                        + (["--quick"] if quick else []))
    if cmd is None:
        raise SystemExit("no private network namespace here (unshare -n / ip link)")
    env = {**os.environ, **RUNTIME_ENV, "PYTHONPATH": os.pathsep.join(
        [str(REPO / "src"), str(REPO)] + [p for p in [os.environ.get("PYTHONPATH")] if p])}
    try:
        proc = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True,
                              timeout=INNER_TIMEOUT_S)
        data = json.loads(out.read_text()) if out.exists() else {}
        if proc.returncode != 0 or "error" in data:
            raise SystemExit(f"cluster run failed (rc={proc.returncode}): {data.get('error')}"
                             f"\n{data.get('ray_start_logs', '')}\n{proc.stderr[-4000:]}")
        return data
    finally:
        stop_recorded(root / "c")
        shutil.rmtree(root, ignore_errors=True)


# ---- rows -------------------------------------------------------------------------------------
def _trace(run: dict) -> list:
    return [(s["runner"], s["seq"], s["config_hash"], round(s["reward"], 12))
            for s in run["steps"]]


def rows_of(rep: dict) -> list[dict]:
    """The acceptance rows of an `inner` report (of the parts it ran)."""
    rows = []
    if "2-nodes" in rep:
        rows += _tune_rows(rep)
    if "ppo" in rep:
        rows += _ppo_rows(rep)
    if "eval" in rep:
        e = rep["eval"]
        rows += [plain_row(DATASET, "eval-2-nodes", "nodes_used", len(e["nodes"]), e["n"]),
                 plain_row(DATASET, "eval-2-nodes", "matches_1_node",
                           int(e["same_answers"] and e["same_rows"] and e["same_means"]),
                           e["n"]),
                 plain_row(DATASET, "eval-2-nodes", "wall_s", e["wall_s"], e["n"]),
                 plain_row(DATASET, "eval-1-node", "wall_s", e["in_process_wall_s"], e["n"])]
    if "index" in rep:
        x = rep["index"]
        rows += [plain_row(DATASET, "index-2-nodes", "nodes_used", len(x["nodes"]), x["n"]),
                 plain_row(DATASET, "index-2-nodes", "matches_1_node",
                           int(x["vectors_allclose_1e-6"] and x["same_top10"]), x["n"]),
                 plain_row(DATASET, "index-2-nodes", "max_abs_diff", x["max_abs_diff"], x["n"]),
                 plain_row(DATASET, "index-2-nodes", "bytes_identical",
                           int(x["vectors_bytes_identical"]), x["n"]),
                 plain_row(DATASET, "index-2-nodes", "wall_s", x["wall_s"], x["n"]),
                 plain_row(DATASET, "index-1-node", "wall_s", x["in_process_wall_s"], x["n"])]
    return rows


def _tune_rows(rep: dict) -> list[dict]:
    rows = []
    t2, t1 = rep["2-nodes"], rep["1-node"]
    n = len(t2["trials"])

    def rewards(run):
        return {t["config_hash"]: t["rung_rewards"] for t in run["trials"]}

    rows += [plain_row(DATASET, "tune-2-nodes", "nodes_used",
                       len({t["node_id"] for t in t2["trials"]}), n),
             plain_row(DATASET, "tune-2-nodes", "best_config_matches_1_node",
                       int((t2["best"], t2["best_reward"]) == (t1["best"], t1["best_reward"])),
                       n),
             plain_row(DATASET, "tune-2-nodes", "same_results_as_1_node",
                       int(rewards(t2) == rewards(t1)), n),
             plain_row(DATASET, "tune-2-nodes", "wall_s", t2["wall_s"], n),
             plain_row(DATASET, "tune-1-node", "nodes_used",
                       len({t["node_id"] for t in t1["trials"]}), len(t1["trials"])),
             plain_row(DATASET, "tune-1-node", "wall_s", t1["wall_s"], len(t1["trials"]))]
    return rows


def _ppo_rows(rep: dict) -> list[dict]:
    rows = []
    p2, p1 = rep["ppo"]["2-nodes"], rep["ppo"]["1-node"]
    m = len(p2["steps"])
    same = _trace(p2) == _trace(p1) and (p2["incumbent"], p2["greedy"]) == \
        (p1["incumbent"], p1["greedy"])
    rows += [plain_row(DATASET, "ppo-2-nodes", "nodes_used",
                       len({s["node_id"] for s in p2["steps"]}), m),
             plain_row(DATASET, "ppo-2-nodes", "best_config_matches_1_node",
                       int(p2["best"] == p1["best"]), m),
             plain_row(DATASET, "ppo-2-nodes", "same_results_as_1_node", int(same), m),
             plain_row(DATASET, "ppo-2-nodes", "wall_s", p2["wall_s"], m),
             plain_row(DATASET, "ppo-1-node", "nodes_used",
                       len({s["node_id"] for s in p1["steps"]}), len(p1["steps"])),
             plain_row(DATASET, "ppo-1-node", "wall_s", p1["wall_s"], len(p1["steps"]))]
    return rows


def body(meta: dict, rows: list[dict]) -> str:
    """cluster.md below the title line."""
    sysw = {}
    for r in rows:
        sysw.setdefault(r["system"], {})[r["metric"]] = r
    lines = ["| system | nodes used | best config = 1-node's | same results as 1-node | "
             "wall s | n |", "|---|---|---|---|---|---|"]
    fan = ["| system | nodes used | matches 1-node | max abs diff | bytes identical | wall s "
           "| n |", "|---|---|---|---|---|---|---|"]
    for name, ms in sysw.items():
        def cell(k, ms=ms):
            r = ms.get(k)
            return "" if r is None else (f"{r['value']:.1f}" if k == "wall_s"
                                         else f"{r['value']:.2g}" if k == "max_abs_diff"
                                         else f"{r['value']:g}")
        n = next(iter(ms.values()))["n"]
        if name.startswith(("eval-", "index-")):
            fan.append(f"| {name} | {cell('nodes_used')} | {cell('matches_1_node')} | "
                       f"{cell('max_abs_diff')} | {cell('bytes_identical')} | "
                       f"{cell('wall_s')} | {n} |")
            continue
        lines.append(f"| {name} | {cell('nodes_used')} | "
                     f"{cell('best_config_matches_1_node')} | "
                     f"{cell('same_results_as_1_node')} | {cell('wall_s')} | {n} |")
    if len(fan) > 2:
        lines += ["", *fan]
    run = meta.get("run", {})
    nan = float("nan")
    notes = [
        f"n = trials (tune) or env steps read from the training results (ppo). Tune: a grid "
        f"search over {run.get('grid', '?')} configs of the synthetic dataset's space, rungs "
        f"25 → 75 → the whole tune split, 2 trials at once, each in its own process holding "
        f"1 CPU; \"1 node\" = every trial also holds the head's custom resource. PPO: the "
        f"tuner's RLlib PPO over the same space, {run.get('ppo_iterations', '?')} iteration(s) "
        f"with 2 remote env runners of 1 CPU (one per node); \"1 node\" = both runners pinned "
        f"to the head. Every config's rows were computed once before the runs (warm-up "
        f"{run.get('warm_s', nan):.0f} s), so a reward is a reduction over stored rows "
        f"whichever node reads it; with two trials at once the order of Tune's results "
        f"differs from the 1-node run's, and is not compared (ties for the best config go to "
        f"the earliest-created trial).",
        "**Both nodes run on one 2-core machine** (two `ray start` nodes in a private network "
        "namespace, shared with other work): these rows prove placement (work ran on both "
        "nodes) and determinism (the same best config and results as one node), not a "
        "speed-up. Per-trial processes (`reuse_actors=False`, needed so that two short trials "
        "hold both nodes at once) cost a process start per trial; the 1-node Tune run runs "
        "its trials one at a time on the head's CPU.",
        "Eval and index (second table; n = questions or passages): `ragpilot eval` / "
        "`ragpilot index` with `--workers 2` on the cluster (rl.common.fanout): 2 Ray tasks "
        "of 1 CPU, spread one per node, over shards aligned on the batch size, merged in "
        "order; \"1 node\" = the same work in the driver process (`rag.evaluate.evaluate`, "
        "the encoder in-process). Eval's answers, contexts, candidates, tokens and scores are "
        "identical; the dense vectors agree to float32 rounding (sentence-transformers orders "
        "each call's texts by length before batching, so a shard's batches pad differently "
        "from one process's), which leaves every passage's top-10 unchanged, and the index "
        "fingerprints (corpus, encoder) are the same. Wall times include loading the models "
        "(in the driver, or in each task on its node), not building the indexes.",
        f"The whole run took {run.get('wall_s', nan):.0f} s, of which "
        f"{run.get('cluster_wall_s', nan):.0f} s with the cluster up (start, the runs, "
        f"shut-down)."]
    return "\n".join(lines) + "\n\n" + "\n\n".join(textwrap.fill(p, 96) for p in notes)


def main() -> None:
    ap = parser(__doc__)  # --quick: ~2 min, 8 configs, 1 PPO iteration
    ap.add_argument("--inner", nargs=2, metavar=("ROOT", "OUT"), help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.inner:
        inner(Path(args.inner[0]), Path(args.inner[1]), args.quick)
        return
    rep = run_cluster(args.quick)
    keep = ("grid", "ppo_iterations", "warm_s", "fanout_prepare_s", "cluster_wall_s",
            "wall_s", "nodes")
    run = {k: rep[k] for k in keep if k in rep}
    if "2-nodes" in rep:
        run["tune_best"] = {k: [rep[k]["best"], rep[k]["best_reward"]]
                            for k in ("2-nodes", "1-node")}
    if "ppo" in rep:
        run["ppo_best"] = {k: rep["ppo"][k]["best"] for k in ("2-nodes", "1-node")}
    for part in ("eval", "index"):
        if part in rep:
            run[f"{part}_shards"] = [{k: v for k, v in sh.items() if k != "node_id"}
                                     | {"node": rep["nodes"].get(sh["node_id"])}
                                     for sh in rep[part]["shards"]]
    rows = rows_of(rep)
    from tests.support import multinode_ppo, multinode_tune

    meta = make_meta(multinode_tune.SEED, {}, {"quick": args.quick, "run": run,
                                               "ppo_seed": multinode_ppo.SEED})
    write_results(NAME, rows, meta, TITLE, body(meta, rows))


if __name__ == "__main__":
    main()
