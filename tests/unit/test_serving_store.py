"""Interaction store: durable, append-only, validated feedback, JSONL export (no Ray)."""

from __future__ import annotations

import json
import sqlite3

import pytest

from rag.errors import ConfigError
from serving.store import Interaction, SQLAlchemyStore, SQLiteStore, StoreError, open_store


@pytest.fixture(params=["sqlite3", "sqlalchemy"])
def store(request, tmp_path):
    path = tmp_path / "log.sqlite"
    s = SQLiteStore(path) if request.param == "sqlite3" else SQLAlchemyStore(f"sqlite:///{path}")
    yield s
    s.close()


def _it(i: int, **kw) -> Interaction:
    base = dict(id=f"i{i}", question=f"q{i}?", variant_id="v1", route="stable", propensity=0.9,
                answer=f"a{i}", category="single", features={"words": 2},
                context_ids=["p1", "p2"], citations=[1], latency_ms={"retrieve": 1.5},
                tokens_in=10, tokens_out=2, scores={"f1": 0.5})
    base.update(kw)
    return Interaction(**base)


def test_logged_row_is_committed_and_round_trips(store, tmp_path):
    store.log_interaction(_it(1))
    with sqlite3.connect(tmp_path / "log.sqlite") as other:  # another connection sees it
        assert other.execute("SELECT answer FROM interactions").fetchall() == [("a1",)]
    got = store.get_interaction("i1")
    assert got["features"] == {"words": 2} and got["latency_ms"] == {"retrieve": 1.5}
    assert got["context_ids"] == ["p1", "p2"] and got["shadow"] is False
    assert store.get_interaction("nope") is None


def test_feedback_validation_names_the_field_and_keeps_rows(store):
    store.log_interaction(_it(1))
    store.log_interaction(_it(2, shadow=True, parent_id="i1", route="shadow"))
    ack = store.add_feedback("i1", 0.8)
    assert (ack.variant_id, ack.route, ack.category) == ("v1", "stable", "single")
    cases = [("i1", 0.5, 409, "interaction_id"), ("zzz", 0.5, 404, "interaction_id"),
             ("i2", 0.5, 422, "interaction_id"), ("i1", 1.5, 422, "reward"),
             ("i1", -0.1, 422, "reward"), ("i1", float("nan"), 422, "reward")]
    for iid, reward, status, field in cases:
        with pytest.raises(StoreError) as e:
            store.add_feedback(iid, reward)
        assert (e.value.status, e.value.field) == (status, field), (iid, reward)
    assert store.counts() == {"interactions": 1, "shadow_interactions": 1, "feedback": 1}


def test_tables_are_append_only(store, tmp_path):
    store.log_interaction(_it(1))
    store.add_feedback("i1", 1.0)
    with sqlite3.connect(tmp_path / "log.sqlite") as db:
        for sql in ("UPDATE interactions SET answer = 'x'", "DELETE FROM interactions",
                    "UPDATE feedback SET reward = 0", "DELETE FROM feedback"):
            with pytest.raises(sqlite3.DatabaseError, match="append-only"):
                db.execute(sql)
    with pytest.raises(Exception, match="UNIQUE|constraint"):
        store.log_interaction(_it(1))  # ids are never overwritten
    assert store.get_interaction("i1")["answer"] == "a1"


def test_routing_rows_round_trip_newest_first_and_are_append_only(store, tmp_path):
    assert store.last_routing() is None
    store.save_routing("fp1", "admin/traffic", {"stable": "a", "canary_percent": 10.0})
    store.save_routing("fp1", "rollout/advance", {"stable": "b", "canary_percent": 0.0})
    last = store.last_routing()
    assert (last["seq"], last["fingerprint"], last["action"]) == (2, "fp1", "rollout/advance")
    assert last["state"] == {"stable": "b", "canary_percent": 0.0}
    with sqlite3.connect(tmp_path / "log.sqlite") as db:
        for sql in ("UPDATE routing SET action = 'x'", "DELETE FROM routing"):
            with pytest.raises(sqlite3.DatabaseError, match="append-only"):
                db.execute(sql)
    assert store.last_routing()["state"]["stable"] == "b"


def test_summary_history_and_export(store, tmp_path):
    for i in range(6):
        store.log_interaction(_it(i, variant_id="v1" if i < 3 else "v2",
                                  route="bandit" if i % 2 else "stable"))
    for i, r in enumerate([0.2, 0.4, 0.6, 1.0, 0.9]):
        store.add_feedback(f"i{i}", r)
    rows = {(r["variant_id"], r["route"]): r for r in store.variant_summary()}
    assert rows[("v1", "stable")]["requests"] == 2 and rows[("v1", "stable")]["pulls"] == 2
    assert rows[("v1", "stable")]["mean_reward"] == pytest.approx(0.4)
    assert rows[("v1", "stable")]["ci_low"] < 0.4 < rows[("v1", "stable")]["ci_high"]
    assert store.bandit_history() == [("single", "v1", 0.4), ("single", "v2", 1.0)]
    n = store.export_jsonl(tmp_path / "out" / "train.jsonl")
    lines = [json.loads(x) for x in (tmp_path / "out" / "train.jsonl").read_text().splitlines()]
    assert n == 6 == len(lines)
    by_id = {x["id"]: x for x in lines}
    assert by_id["i3"]["reward"] == 1.0 and by_id["i5"]["reward"] is None
    assert by_id["i0"]["propensity"] == 0.9 and by_id["i0"]["scores"] == {"f1": 0.5}


def test_sqlite_is_wal_and_open_store_dispatches(tmp_path):
    s = open_store(tmp_path / "a.sqlite")
    assert isinstance(s, SQLiteStore)
    assert s._read("PRAGMA journal_mode")[0][0] == "wal"
    s.close()
    assert isinstance(open_store(f"sqlite:///{tmp_path / 'b.sqlite'}"), SQLAlchemyStore)
    with pytest.raises(ConfigError) as e:
        open_store("postgresql+nosuchdriver://u@localhost/db")
    assert e.value.field == "store_url"
    with pytest.raises(ConfigError, match="store_url"):
        open_store("")


def test_error_flag_round_trips_and_is_exported(store, tmp_path):
    store.log_interaction(_it(1))
    store.log_interaction(_it(2, answer="", error=True))
    assert store.get_interaction("i1")["error"] is False
    assert store.get_interaction("i2")["error"] is True
    store.export_jsonl(tmp_path / "e.jsonl")
    rows = [json.loads(x) for x in (tmp_path / "e.jsonl").read_text().splitlines()]
    assert [(r["id"], r["error"]) for r in rows] == [("i1", False), ("i2", True)]
    (summary,) = store.variant_summary()
    assert summary["errors"] == 1 and summary["requests"] == 2


OLD_SCHEMA = [  # the interactions table as written before the `error` column existed
    """CREATE TABLE interactions (
        id TEXT PRIMARY KEY, ts REAL NOT NULL, question TEXT NOT NULL, category TEXT NOT NULL,
        variant_id TEXT NOT NULL, route TEXT NOT NULL, propensity REAL NOT NULL,
        features TEXT NOT NULL, context_ids TEXT NOT NULL, citations TEXT NOT NULL,
        answer TEXT NOT NULL, latency_ms TEXT NOT NULL, tokens_in INTEGER NOT NULL,
        tokens_out INTEGER NOT NULL, shadow INTEGER NOT NULL, parent_id TEXT, scores TEXT)""",
    """CREATE TRIGGER interactions_no_update BEFORE UPDATE ON interactions
       BEGIN SELECT RAISE(ABORT, 'interactions is append-only'); END""",
    """INSERT INTO interactions VALUES ('old', 1.0, 'q?', 'single', 'v1', 'stable', 1.0, '{}',
       '[]', '[]', 'a', '{}', 1, 1, 0, NULL, NULL)""",
]


@pytest.mark.parametrize("backend", ["sqlite3", "sqlalchemy"])
def test_old_log_is_migrated_and_stays_append_only(tmp_path, backend):
    path = tmp_path / "old.sqlite"
    with sqlite3.connect(path) as db:
        for stmt in OLD_SCHEMA:
            db.execute(stmt)
    s = SQLiteStore(path) if backend == "sqlite3" else SQLAlchemyStore(f"sqlite:///{path}")
    try:
        assert s.get_interaction("old")["error"] is False  # existing rows read as 0
        s.log_interaction(_it(9, error=True))
        assert s.get_interaction("i9")["error"] is True
        s.add_feedback("old", 0.5)
    finally:
        s.close()
    with sqlite3.connect(path) as db:
        cols = [r[1] for r in db.execute("PRAGMA table_info(interactions)")]
        assert cols.count("error") == 1
        with pytest.raises(sqlite3.DatabaseError, match="append-only"):
            db.execute("UPDATE interactions SET error = 1")
        with pytest.raises(sqlite3.DatabaseError, match="append-only"):
            db.execute("DELETE FROM interactions")
    SQLiteStore(path).close()  # opening again does not add the column twice


def test_group_commit_gives_each_queued_writer_its_own_outcome(tmp_path):
    """Writes queued behind the connection lock are committed together (one transaction);
    a failing write (duplicate id, second feedback) is undone alone and raised to its own
    caller, and every other caller returns only once its row is stored."""
    import threading
    import time

    s = SQLiteStore(tmp_path / "log.sqlite")
    s.log_interaction(_it(0))
    outcome: dict[str, object] = {}

    def write(name, fn):
        try:
            fn()
            outcome[name] = "ok"
        except Exception as exc:  # noqa: BLE001 - recorded for the asserts
            outcome[name] = exc

    jobs = [(f"log{i}", lambda i=i: s.log_interaction(_it(i))) for i in range(1, 9)]
    jobs += [("dup", lambda: s.log_interaction(_it(3, answer="again")))]
    jobs += [(f"fb{j}", lambda j=j: s.add_feedback("i0", 0.1 * j)) for j in range(3)]
    with s._lock:  # hold the connection: every write queues behind it
        threads = [threading.Thread(target=write, args=job) for job in jobs]
        for t in threads:
            t.start()
        deadline = time.time() + 10
        while len(s._queue) < len(jobs) - 3 and time.time() < deadline:  # feedback reads first
            time.sleep(0.01)
        assert len(s._queue) >= len(jobs) - 3
    for t in threads:
        t.join(10)
    assert all(outcome[f"log{i}"] == "ok" for i in range(1, 9))
    assert isinstance(outcome["dup"], sqlite3.IntegrityError)
    fb = [outcome[f"fb{j}"] for j in range(3)]
    assert fb.count("ok") == 1, fb
    assert all(isinstance(e, StoreError) and e.status == 409 for e in fb if e != "ok")
    assert s.get_interaction("i3")["answer"] == "a3"  # the duplicate changed nothing
    assert s.counts() == {"interactions": 9, "shadow_interactions": 0, "feedback": 1}
    s.close()


def test_signals_appended_after_the_row_are_merged_into_reads(store, tmp_path):
    """A gold-less row is stored first; its signals, appended later, appear in the row's
    `scores` and `latency_ms.signals` in get_interaction and the export; unknown ids (404)
    and a second scoring (409) are refused, and the signals table is append-only."""
    store.log_interaction(_it(1, scores={"pii_leaks": 0.0}))
    store.log_interaction(_it(2, scores=None))
    assert "sig_combined" not in store.get_interaction("i1")["scores"]
    store.add_signals("i1", {"sig_combined": 0.25, "sig_relevancy": 0.5}, ms=12.5)
    got = store.get_interaction("i1")
    assert got["scores"] == {"pii_leaks": 0.0, "sig_combined": 0.25, "sig_relevancy": 0.5}
    assert got["latency_ms"] == {"retrieve": 1.5, "signals": 12.5}
    store.add_signals("i2", {"sig_combined": 0.75}, ms=3.0)
    assert store.get_interaction("i2")["scores"] == {"sig_combined": 0.75}
    store.export_jsonl(tmp_path / "out.jsonl")
    rows = {r["id"]: r for r in map(json.loads, (tmp_path / "out.jsonl").read_text().splitlines())}
    assert rows["i1"]["scores"]["sig_combined"] == 0.25 and rows["i2"]["latency_ms"]["signals"] == 3.0
    with pytest.raises(StoreError) as e:
        store.add_signals("i1", {"sig_combined": 0.9}, ms=1.0)
    assert (e.value.field, e.value.status) == ("interaction_id", 409)
    assert store.get_interaction("i1")["scores"]["sig_combined"] == 0.25  # first one kept
    if isinstance(store, SQLiteStore):  # foreign keys are on: an unknown id is named
        with pytest.raises(StoreError) as e:
            store.add_signals("nope", {"sig_combined": 0.5}, ms=1.0)
        assert (e.value.field, e.value.status) == ("interaction_id", 404)
    with sqlite3.connect(tmp_path / "log.sqlite") as other, pytest.raises(
            sqlite3.DatabaseError, match="append-only"):
        other.execute("UPDATE signals SET scores = '{}' WHERE interaction_id = 'i1'")
