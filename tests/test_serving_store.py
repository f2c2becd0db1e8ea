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
