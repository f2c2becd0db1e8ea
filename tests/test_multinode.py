"""Tuning, training, evaluation and indexing on a real two-node Ray cluster on this machine
(issue 23): a head and a second node started with `ray start` (1 CPU each, custom resources
`head` / `worker_node`, own temp dirs) in a private network namespace, the driver connected
with `ray.init(address=...)`. tests/support/multinode.py runs every part in one cluster session
and reports JSON; each test below checks its part from the results.

PPO (the tuner's, 2 remote env runners, over 8 configs):
- env steps ran on both nodes: each of the 2 env runners (1 CPU each) on its own node, every
  step tagged with the node that took it;
- the run is the one-node run: the same seed with both runners pinned to the head gives the
  same steps (config hash and reward, in order), incumbent, greedy config and best config.
  Exact equality holds because every config's per-query table is stored before training (a
  step's reward is then a numpy reduction over stored rows with the env's seeded batch), each
  env runner seeds its env and its module's sampling by its index, not by its node, and the
  step records are ordered by (runner, step) whichever runner reports first.

Ray Tune (a grid search of 4 of those configs through `tune.Tuner`):
- trials ran on both nodes: 2 trials at once, 1 CPU each, one process per trial, every result
  tagged with its node;
- the search is the one-node search (every trial also holding the head's resource, run in one
  reused process: the placement, not the process count, is the baseline): the same
  configs with the same rung rewards, the same best config and reward. The order in which
  results arrive is not compared: with two trials at once it depends on timing (the best
  config does not: ties go to the earliest-created trial).

`ragpilot eval` and dense index encoding as Ray tasks (issue 23 item 2): the synthetic world's
240 questions evaluated as 2 tasks and its 300 passages encoded as 2 tasks, one per node,
compared with the same work in one process: eval's per-query outputs, metric rows and means
are the in-process ones; the vectors are allclose 1e-6 with the same top-10 for every passage.

The cluster is always stopped: by the script, and here again by process group should the
script be killed (never `ray stop`, which would stop every Ray runtime on the machine).
"""

from __future__ import annotations

from pathlib import Path

import pytest
from tests.support.ray_cluster import netns_command, netns_script_report

pytestmark = pytest.mark.ray

REPO = Path(__file__).resolve().parents[1]
TIMEOUT_S = 600  # ~4-5 min on this shared 2-core machine under load


@pytest.fixture(scope="module")
def report():
    """tests/support/multinode.py ROOT OUT.json in a private network namespace, once for the
    module; its JSON report. The cluster it recorded is always stopped."""
    if netns_command(["true"]) is None:
        pytest.skip("no private network namespace here (unshare -n / ip link): the two "
                    "nodes would have to bind a non-loopback address")
    with netns_script_report(REPO / "tests" / "support" / "multinode.py", "rp-", TIMEOUT_S,
                             logs_key="ray_start_logs", cluster_subdir="c") as data:
        yield data


def _part(report: dict, name: str) -> dict:
    part = report[name]
    assert "error" not in part, f"{name}: {part.get('error')}\n{part.get('traceback', '')}"
    return part


def _head(report: dict) -> str:
    nodes = report["nodes"]
    assert sorted(nodes.values()) == [["head"], ["worker_node"]]
    return next(n for n, r in nodes.items() if r == ["head"])


def test_ppo_env_runners_on_two_nodes_match_the_one_node_run(report):
    head = _head(report)
    ppo = _part(report, "ppo")
    two, one = ppo["2-nodes"], ppo["1-node"]
    # 2 iterations x 8 steps from the results, then the 4-step greedy read-out
    for run in (two, one):
        assert len(run["steps"]) == 16 and run["evaluations"] == 20
        assert {s["runner"] for s in run["steps"]} == {1, 2}
    by_runner = {}
    for s in two["steps"]:
        by_runner.setdefault(s["runner"], set()).add(s["node_id"])
    # one runner per node: each runner stayed on one node, and the two nodes differ
    assert all(len(v) == 1 for v in by_runner.values())
    assert set.union(*by_runner.values()) == set(report["nodes"])
    assert {s["node_id"] for s in one["steps"]} == {head}

    def trace(run):
        return [(s["runner"], s["seq"], s["config_hash"], round(s["reward"], 12))
                for s in run["steps"]]

    assert trace(two) == trace(one)
    assert (two["incumbent"], two["greedy"], two["best"]) == \
        (one["incumbent"], one["greedy"], one["best"])


def test_tune_trials_on_two_nodes_match_the_one_node_search(report):
    head = _head(report)
    tune = _part(report, "tune")
    two, one = tune["2-nodes"], tune["1-node"]
    n_grid = report["tune_grid"]
    # 4 trials: the first two start at once, 1 CPU each, so one runs on each node
    assert n_grid == 4 and report["grid"] == 8
    for run in (two, one):
        # the grid: every config once, each scored on the whole split in one rung (grid is not
        # a multi-fidelity searcher: rl.tuner.searchers.MULTI_FIDELITY)
        assert len(run["trials"]) == len({t["config_hash"] for t in run["trials"]}) == n_grid
        assert all(len(t["rung_rewards"]) == 1 for t in run["trials"])
        full = run["trials"][0]["query_evals"]
        assert all(t["query_evals"] == full for t in run["trials"])
        assert run["query_evals"] == n_grid * full
        assert run["best_reward"] == max(t["rung_rewards"][-1] for t in run["trials"])
    # trials ran on both nodes; pinned by the head's resource, all on the head
    assert {t["node_id"] for t in two["trials"]} == set(report["nodes"])
    assert {t["node_id"] for t in one["trials"]} == {head}

    def rewards(run):
        return {t["config_hash"]: t["rung_rewards"] for t in run["trials"]}

    assert rewards(two) == rewards(one)
    assert (two["best"], two["best_reward"]) == (one["best"], one["best_reward"])


def test_eval_and_index_fan_out_over_both_nodes(report):
    nodes = set(report["nodes"])
    assert len(nodes) == 2
    e, x = _part(report, "eval"), _part(report, "index")
    assert e["n"] == 240 and x["n"] == 300
    assert set(e["nodes"]) == nodes and set(x["nodes"]) == nodes  # one task per node
    assert [(s["start"], s["stop"]) for s in e["shards"]] == [(0, 120), (120, 240)]
    assert e["same_answers"] and e["same_rows"] and e["same_means"]
    assert x["vectors_allclose_1e-6"] and x["same_top10"] and x["max_abs_diff"] <= 1e-6
