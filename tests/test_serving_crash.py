"""Crash safety of the interaction log: SIGKILL the server in the middle of a stream of
/feedback writes, restart it on the same SQLite file, and check that every acknowledged (2xx)
record is there and the database is not corrupt.

The server is the real ingress (`serving.app.local_app`: same routes, middleware and
`SQLiteStore` write path as under Ray Serve, where the single Ingress replica owns the store
connection) run by uvicorn in a child process on 127.0.0.1. Only the pipeline is a stand-in:
/feedback never calls it.
"""

from __future__ import annotations

import os
import signal
import sqlite3
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx
import pytest

from rag.config import RAGConfig
from serving.netns import free_port
from serving.store import Interaction, SQLiteStore

BASE = {"generator": "extractive"}
STABLE = RAGConfig(**BASE).config_hash
N_ROWS = 4000

SERVER = """
import sys, uvicorn
from serving.app import local_app

class Stub:
    def answer(self, question, query_id="q"):
        raise RuntimeError("not used by /feedback")
    def info(self):
        return {}

store, keys, port, stable = sys.argv[1:5]
app = local_app({"store_url": store, "base": {"generator": "extractive"},
                 "auth": {"keys_file": keys},
                 # /feedback is rate-limited per client address: all 4 streams are 127.0.0.1
                 "limits": {"rate_per_s": 1e6, "burst": 1e6}}, services={stable: Stub()})
uvicorn.run(app, host="127.0.0.1", port=int(port), log_level="warning")
"""


def _start(store: Path, port: int) -> subprocess.Popen:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
    proc = subprocess.Popen([sys.executable, "-c", SERVER, str(store),
                             str(store.parent / "keys.json"), str(port), STABLE], env=env)
    deadline = time.time() + 120
    while time.time() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"server exited with {proc.returncode}")
        try:
            if httpx.get(f"http://127.0.0.1:{port}/readyz", timeout=2).status_code == 200:
                return proc
        except httpx.HTTPError:
            pass
        time.sleep(0.2)
    proc.kill()
    raise RuntimeError("server did not become ready")


def _seed(store: Path) -> None:
    s = SQLiteStore(store)
    s._write([(f"INSERT INTO interactions ({', '.join(r)}) VALUES "
               f"({', '.join(':' + c for c in r)})", r) for r in (
        Interaction(id=f"i{i:05d}", question=f"q{i}?", variant_id=STABLE, route="stable",
                    propensity=1.0, answer="a").to_row() for i in range(N_ROWS))])
    s.close()


def _stream(url: str, ids: list[str], acked: dict[str, float], failed: list[str],
            stop: threading.Event) -> None:
    with httpx.Client(base_url=url, timeout=10) as client:
        for iid in ids:
            if stop.is_set():
                return
            reward = (int(iid[1:]) % 100) / 100
            try:
                r = client.post("/feedback", json={"interaction_id": iid, "reward": reward})
            except httpx.HTTPError:
                failed.append(iid)
                continue
            if 200 <= r.status_code < 300:
                acked[iid] = reward
            else:
                failed.append(iid)


def test_sigkill_mid_stream_loses_no_acknowledged_feedback(tmp_path):
    store = tmp_path / "interactions.sqlite"
    _seed(store)
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    proc = _start(store, port)
    acked: dict[str, float] = {}
    failed: list[str] = []
    stop = threading.Event()
    ids = [f"i{i:05d}" for i in range(N_ROWS)]
    workers = [threading.Thread(target=_stream, args=(url, ids[w::4], acked, failed, stop))
               for w in range(4)]
    for t in workers:
        t.start()
    deadline = time.time() + 60
    while len(acked) < 400 and time.time() < deadline:
        time.sleep(0.01)
    acked_at_kill = len(acked)
    os.kill(proc.pid, signal.SIGKILL)  # mid-stream: 4 clients have requests in flight
    proc.wait(timeout=10)
    time.sleep(0.5)
    stop.set()
    for t in workers:
        t.join(timeout=30)
    assert acked_at_kill >= 400, "the stream was too slow to test anything"
    assert failed, "no request was cut off: the kill did not land mid-stream"
    assert len(acked) < N_ROWS

    with sqlite3.connect(store) as db:  # before restart: what the killed process left
        assert db.execute("PRAGMA integrity_check").fetchall() == [("ok",)]
    proc = _start(store, port)  # the restarted server recovers the WAL and serves again
    try:
        with sqlite3.connect(store) as db:
            assert db.execute("PRAGMA integrity_check").fetchall() == [("ok",)]
            assert db.execute("PRAGMA journal_mode").fetchone() == ("wal",)
            stored = dict(db.execute("SELECT interaction_id, reward FROM feedback"))
        missing = [i for i in acked if i not in stored]
        assert missing == [], f"{len(missing)} acknowledged rewards lost"
        assert all(stored[i] == pytest.approx(r) for i, r in acked.items())
        assert set(stored) - set(acked) <= set(failed)  # extra = committed, reply cut off
        again = httpx.post(f"{url}/feedback", json={"interaction_id": next(iter(acked)),
                                                    "reward": 0.5}, timeout=10)
        assert again.status_code == 409  # the API sees the pre-crash row too
        fresh = next(i for i in ids if i not in stored)
        ok = httpx.post(f"{url}/feedback", json={"interaction_id": fresh, "reward": 0.25},
                        timeout=10)
        assert ok.status_code == 200
        counts = httpx.get(f"{url}/rl/stats", timeout=10).json()["store"]
        assert counts["feedback"] == len(stored) + 1
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=30)
    print(f"acknowledged {len(acked)} before/at the kill, {len(failed)} cut off, "
          f"{len(stored)} in the store, 0 lost")
