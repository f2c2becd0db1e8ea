"""bench/cluster.py's eval/index rows (issue 23) and `--only` merging: a partial re-run
replaces its parts' rows and keeps every other committed row and the old meta. No Ray here."""

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


def test_only_merges_into_the_committed_rows():
    old_rows = [cluster.plain_row("synthetic", "tune-2-nodes", "nodes_used", 2, 24),
                cluster.plain_row("synthetic", "eval-2-nodes", "nodes_used", 1, 240)]
    old = {"rows": old_rows, "meta": {"commit": "old", "created": "t0", "run": {"grid": 24}}}
    new_meta = {"commit": "new", "created": "t1", "run": {"fanout_prepare_s": 9.0}}
    rows, meta = cluster.merged(old, ("eval", "index"), cluster.rows_of(_report()), new_meta)
    assert rows[0] == old_rows[0]  # tune kept, first
    assert _value(rows, "eval-2-nodes", "nodes_used") == 2  # replaced, not duplicated
    assert meta["commit"] == "old"
    assert meta["run"] == {"grid": 24, "eval+index": {"fanout_prepare_s": 9.0}}
    assert meta["parts"]["tune"]["commit"] == "old" and meta["parts"]["eval"]["commit"] == "new"
    md = cluster.body(meta, rows)
    assert "| eval-2-nodes | 2 | 1 |" in md and "Parts measured at different commits" in md
