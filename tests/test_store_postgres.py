"""The interaction store on a real PostgreSQL server (Debian's postgresql, started here in a
temporary directory on 127.0.0.1 and thrown away): the same SQL layer the SQLite tests cover,
plus what only PostgreSQL can show (BIGSERIAL feedback order, the plpgsql append-only trigger,
two processes' writes). Skipped with the reason when no PostgreSQL binaries are installed;
with CI=true (.ci/run installs them) a missing server is a failure, not a skip."""

from __future__ import annotations

import glob
import os
import shutil
import socket
import subprocess
import tempfile
import time
from pathlib import Path

import pytest

from serving.store import Interaction, SQLAlchemyStore, StoreError, open_store


def _pg_bin() -> Path | None:
    found = sorted(glob.glob("/usr/lib/postgresql/*/bin/initdb"))
    return Path(found[-1]).parent if found else None


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def pg_url():
    bindir = _pg_bin()
    if bindir is None:
        if os.environ.get("CI") == "true":
            pytest.fail("CI=true but no PostgreSQL binaries under /usr/lib/postgresql (.ci/run "
                        "installs Debian's postgresql)")
        pytest.skip("PostgreSQL is not installed (apt-get install postgresql)")
    root = os.geteuid() == 0  # postgres refuses to run as root: run it as the postgres user
    as_pg = ["runuser", "-u", "postgres", "--"] if root else []
    tmp = Path(tempfile.mkdtemp(prefix="ragpilot-pg-"))
    data, sock = tmp / "data", tmp / "sock"
    sock.mkdir()
    if root:
        shutil.chown(tmp, "postgres")
        shutil.chown(sock, "postgres")
    port = _free_port()
    subprocess.run([*as_pg, str(bindir / "initdb"), "-D", str(data), "-U", "ragpilot",
                    "--auth=trust", "-E", "UTF8"], check=True, capture_output=True)
    proc = subprocess.Popen([*as_pg, str(bindir / "postgres"), "-D", str(data), "-p", str(port),
                             "-h", "127.0.0.1", "-k", str(sock), "-c", "fsync=on"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    url = f"postgresql+psycopg://ragpilot@127.0.0.1:{port}/postgres"
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                with socket.create_connection(("127.0.0.1", port), timeout=0.5):
                    break
            except OSError:
                if proc.poll() is not None or time.monotonic() > deadline:
                    err = proc.stderr.read().decode() if proc.stderr else ""
                    pytest.fail(f"postgres did not start: {err[-500:]}")
                time.sleep(0.2)
        yield url
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            proc.kill()
        shutil.rmtree(tmp, ignore_errors=True)


@pytest.fixture
def store(pg_url):
    s = open_store(pg_url)
    assert isinstance(s, SQLAlchemyStore) and s._engine.dialect.name == "postgresql"
    with s._engine.begin() as conn:  # a clean slate per test (triggers forbid DELETE)
        conn.exec_driver_sql("TRUNCATE feedback, signals, interactions")
    yield s
    s.close()


def _it(i: int, **kw) -> Interaction:
    base = dict(id=f"i{i}", question=f"q{i}?", variant_id="v1", route="stable", propensity=0.9,
                answer=f"a{i}", category="single", features={"words": 2},
                context_ids=["p1", "p2"], citations=[1], latency_ms={"retrieve": 1.5},
                tokens_in=10, tokens_out=2, scores={"f1": 0.5})
    base.update(kw)
    return Interaction(**base)


def test_round_trip_and_feedback_validation(store):
    store.log_interaction(_it(1))
    store.log_interaction(_it(2, shadow=True, parent_id="i1", route="shadow"))
    got = store.get_interaction("i1")
    assert got["features"] == {"words": 2} and got["context_ids"] == ["p1", "p2"]
    assert got["shadow"] is False and store.get_interaction("i2")["parent_id"] == "i1"
    ack = store.add_feedback("i1", 0.8)
    assert (ack.variant_id, ack.route) == ("v1", "stable")
    for iid, reward, status, field in [("i1", 0.5, 409, "interaction_id"),
                                       ("zzz", 0.5, 404, "interaction_id"),
                                       ("i2", 0.5, 422, "interaction_id"),
                                       ("i1", 1.5, 422, "reward")]:
        with pytest.raises(StoreError) as e:
            store.add_feedback(iid, reward)
        assert (e.value.status, e.value.field) == (status, field)
    assert store.counts() == {"interactions": 1, "shadow_interactions": 1, "feedback": 1}
    store.add_signals("i2", {"sig_combined": 0.5}, ms=4.0)  # appended after the row
    got = store.get_interaction("i2")
    assert got["scores"] == {"f1": 0.5, "sig_combined": 0.5} and got["latency_ms"]["signals"] == 4.0
    for iid, status in [("i2", 409), ("zzz", 404)]:
        with pytest.raises(StoreError) as e:
            store.add_signals(iid, {"sig_combined": 0.1}, ms=1.0)
        assert (e.value.status, e.value.field) == (status, "interaction_id")


def test_append_only_trigger_refuses_updates_and_deletes(store):
    import sqlalchemy as sa

    store.log_interaction(_it(1))
    store.add_feedback("i1", 1.0)
    for sql in ("UPDATE interactions SET answer = 'x'", "DELETE FROM interactions",
                "UPDATE feedback SET reward = 0", "DELETE FROM feedback"):
        with pytest.raises(sa.exc.DBAPIError, match="append-only"), store._engine.begin() as c:
            c.exec_driver_sql(sql)
    assert store.get_interaction("i1")["answer"] == "a1"
    assert store.counts()["feedback"] == 1
    store.save_routing("fp", "admin/traffic", {"stable": "a"})
    for sql in ("UPDATE routing SET action = 'x'", "DELETE FROM routing"):
        with pytest.raises(sa.exc.DBAPIError, match="append-only"), store._engine.begin() as c:
            c.exec_driver_sql(sql)
    assert store.last_routing()["state"] == {"stable": "a"}


def test_two_connections_see_each_others_writes_and_export(store, pg_url, tmp_path):
    other = open_store(pg_url)  # a second process/replica writing the same database
    try:
        for i in range(20):
            (store if i % 2 else other).log_interaction(_it(i))
        for i in range(0, 20, 3):
            other.add_feedback(f"i{i}", i / 20)
        assert store.counts()["interactions"] == 20 and store.counts()["feedback"] == 7
        out = tmp_path / "export.jsonl"
        n = store.export_jsonl(out)
        assert n == 20 and len(out.read_text().splitlines()) == 20
        reader = open_store(pg_url, create=False)  # export-interactions: existing stores only
        try:
            assert reader.counts()["interactions"] == 20
        finally:
            reader.close()
    finally:
        other.close()


def test_a_reader_refuses_a_database_without_the_store_and_creates_nothing(pg_url):
    import sqlalchemy as sa

    from rag.errors import ConfigError

    empty = pg_url.rsplit("/", 1)[0] + "/template1"  # exists, holds no interactions table
    with pytest.raises(ConfigError, match="holds no interactions table"):
        open_store(empty, create=False)
    engine = sa.create_engine(empty)
    try:
        with engine.connect() as conn:
            assert not sa.inspect(conn).has_table("interactions")
    finally:
        engine.dispose()
