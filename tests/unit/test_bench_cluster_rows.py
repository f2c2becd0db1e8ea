"""bench/cluster.py's eval/index rows from an inner report. No Ray here."""

from __future__ import annotations

from bench import cluster


def _report():
    shard = {"start": 0, "stop": 120, "node_id": "a", "wall_s": 1.0}
    return {"nodes": {"a": ["head"], "b": ["worker_node"]},
            "eval": {"n": 240, "nodes": ["a", "b"], "shards": [shard], "same_answers": True,
                     "same_rows": True, "same_means": True, "wall_s": 3.0,
                     "in_process_wall_s": 5.0},
            "index": {"n": 300, "nodes": ["a", "b"], "shards": [shard],
                      "vectors_allclose_1e-6": True, "same_top10": True,
                      "max_abs_diff": 1.2e-7, "vectors_bytes_identical": False,
                      "wall_s": 2.0, "in_process_wall_s": 4.0}}


def _value(rows, system, metric):
    (r,) = [r for r in rows if (r["system"], r["metric"]) == (system, metric)]
    return r["value"]


def test_eval_and_index_rows():
    rows = cluster.rows_of(_report())
    for system in ("eval-2-nodes", "index-2-nodes"):
        assert _value(rows, system, "nodes_used") == 2
        assert _value(rows, system, "matches_1_node") == 1
    assert _value(rows, "index-2-nodes", "bytes_identical") == 0
    rep = _report()
    rep["eval"]["same_rows"] = False
    assert _value(cluster.rows_of(rep), "eval-2-nodes", "matches_1_node") == 0

