"""The interaction log's policy columns (policy_id, arm, features_hash): round trip, export,
and the migration of a log written before they existed (serving.store)."""

from __future__ import annotations

import json
import sqlite3

import pytest

from serving.store import Interaction, SQLAlchemyStore, SQLiteStore

OLD = [  # the interactions table with `error` but without the policy columns
    """CREATE TABLE interactions (
        id TEXT PRIMARY KEY, ts REAL NOT NULL, question TEXT NOT NULL, category TEXT NOT NULL,
        variant_id TEXT NOT NULL, route TEXT NOT NULL, propensity REAL NOT NULL,
        features TEXT NOT NULL, context_ids TEXT NOT NULL, citations TEXT NOT NULL,
        answer TEXT NOT NULL, latency_ms TEXT NOT NULL, tokens_in INTEGER NOT NULL,
        tokens_out INTEGER NOT NULL, shadow INTEGER NOT NULL, parent_id TEXT, scores TEXT,
        error INTEGER NOT NULL DEFAULT 0)""",
    """INSERT INTO interactions VALUES ('old', 1.0, 'q?', 'single', 'v1', 'stable', 1.0, '{}',
       '[]', '[]', 'a', '{}', 1, 1, 0, NULL, NULL, 0)""",
]


def _policy_row(i: int) -> Interaction:
    return Interaction(id=f"p{i}", question="q?", variant_id="abc", route="policy",
                       propensity=0.0333, answer="a", features={"policy_x": [0.5, 1.0]},
                       policy_id="0123456789ab", arm=3, features_hash="feedfacecafe")


@pytest.mark.parametrize("backend", ["sqlite3", "sqlalchemy"])
def test_old_log_gains_nullable_policy_columns(tmp_path, backend):
    path = tmp_path / "old.sqlite"
    with sqlite3.connect(path) as db:
        for stmt in OLD:
            db.execute(stmt)
    s = SQLiteStore(path) if backend == "sqlite3" else SQLAlchemyStore(f"sqlite:///{path}")
    try:
        old = s.get_interaction("old")
        assert old["policy_id"] is None and old["arm"] is None and old["features_hash"] is None
        s.log_interaction(_policy_row(1))
        got = s.get_interaction("p1")
        assert (got["policy_id"], got["arm"], got["features_hash"]) == (
            "0123456789ab", 3, "feedfacecafe")
        assert got["propensity"] == pytest.approx(0.0333)
        assert got["features"]["policy_x"] == [0.5, 1.0]
        s.export_jsonl(tmp_path / "e.jsonl")
    finally:
        s.close()
    rows = [json.loads(x) for x in (tmp_path / "e.jsonl").read_text().splitlines()]
    assert [r["arm"] for r in rows] == [None, 3]
    with sqlite3.connect(path) as db:
        cols = [r[1] for r in db.execute("PRAGMA table_info(interactions)")]
    assert [cols.count(c) for c in ("policy_id", "arm", "features_hash")] == [1, 1, 1]
    SQLiteStore(path).close()  # opening again adds nothing twice
