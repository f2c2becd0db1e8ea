"""The Serve topology on a real (one-node) Ray Serve: two ingress replicas in front of the one
shared pipeline deployment (serving.shared_pipelines). Checks that both replicas answer
(`X-Ragpilot-Replica`), route every user the same before and after a routing change made
through one of them, store every acknowledged feedback, serve a variant added at run time
without a deployment of its own, and take a changed variant declaration through Serve's own
config update from the driver (`serving.launch.update_app`).

Every test runs twice, once per proxy in front of the ingress replicas (`serving.launch.PROXIES`):
Serve's Python proxy and HAProxy (Serve's HAProxy mode, direct ingress). The HAProxy run is
skipped without the haproxy binary locally and fails under CI=true (.ci/run installs it).

Runs in a private network namespace when permitted (like test_serving_app.py). The Serve-proxy
run deploys on the session's shared Serve runtime (tests/conftest.py `serve_app`); the HAProxy
run gets a cluster of its own (the proxy is chosen when the cluster starts).
"""

from __future__ import annotations

import os
import sqlite3
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import pytest

from rag.config import RAGConfig
from serving.traffic import bucket

pytestmark = pytest.mark.ray

BASE = {"generator": "extractive"}
CANARY = {"variant": "bm25"}
CANARY_ID = RAGConfig(**BASE, **CANARY).config_hash


def args(store: Path, canary: dict = CANARY) -> dict:
    return {"store_url": str(store), "auth": {"keys_file": str(store.parent / "keys.json")},
            "base": BASE, "canary": canary, "traffic": {"canary_percent": 20.0},
            "limits": {"max_inflight": 64, "rate_per_s": 1e6, "burst": 1e6},
            "ingress": {"replicas": 2, "sync_interval_s": 0.1},
            "pipelines": {"num_replicas": 1, "autoscaling": None, "num_cpus": 0.1},
            "max_variants": 6, "rollout_dir": str(store.parent / "rollout")}


@pytest.fixture(scope="module", params=["serve", "haproxy"])
def served(request, serve_app, tmp_path_factory):
    from serving.auth import KeyFile
    from serving.launch import haproxy_binary

    proxy = request.param
    if proxy == "haproxy" and haproxy_binary() is None:
        if os.environ.get("CI") == "true":
            pytest.fail("haproxy not installed (CI): .ci/run installs Debian's haproxy")
        pytest.skip("haproxy not installed (apt-get install -y haproxy): HAProxy mode not run")
    store = tmp_path_factory.mktemp("scaleout") / "interactions.sqlite"
    token, _ = KeyFile(store.parent / "keys.json").create("admin", name="test")
    url = serve_app.deploy(args(store), proxy=proxy)  # haproxy: a cluster of its own
    with httpx.Client(base_url=url, timeout=60.0, headers={"X-API-Key": token}) as client:
        yield client, store


def _ask_all(client: httpx.Client, users: list[str]) -> list[httpx.Response]:
    def one(u: str) -> httpx.Response:
        return client.post("/query", json={"question": "Where was person 3 born?",
                                           "user_id": u})

    with ThreadPoolExecutor(8) as pool:
        return list(pool.map(one, users))


def _expected_canary(user: str, percent: float, salt: str = "ragpilot") -> bool:
    return bucket(f"u:{user}", salt) < percent


def test_both_replicas_route_every_user_the_same(served):
    client, _ = served
    users = [f"user-{i}" for i in range(160)]
    rs = _ask_all(client, users + users)
    assert all(r.status_code == 200 for r in rs), rs[0].text
    assert len({r.headers["x-ragpilot-replica"] for r in rs}) == 2  # both answered
    for u, r in zip(users + users, rs, strict=True):
        assert (r.json()["route"] == "canary") == _expected_canary(u, 20.0)
    # a change through one replica reaches the other within the sync interval
    assert client.post("/admin/traffic", json={"canary_percent": 60.0}).status_code == 200
    time.sleep(0.5)
    rs = _ask_all(client, users + users)
    assert len({r.headers["x-ragpilot-replica"] for r in rs}) == 2
    for u, r in zip(users + users, rs, strict=True):
        assert (r.json()["route"] == "canary") == _expected_canary(u, 60.0), r.headers


def test_no_feedback_is_lost_across_replicas(served):
    client, store = served
    rs = _ask_all(client, [f"fb-{i}" for i in range(80)])
    ids = [r.json()["interaction_id"] for r in rs]
    with ThreadPoolExecutor(8) as pool:
        fb = list(pool.map(lambda i: client.post("/feedback", json={
            "interaction_id": i, "reward": 0.5}), ids))
    assert all(r.status_code == 200 for r in fb)
    assert len({r.headers["x-ragpilot-replica"] for r in fb}) == 2
    with sqlite3.connect(store) as db:
        marks = ",".join("?" * len(ids))
        (n,), = db.execute(f"SELECT COUNT(*) FROM feedback WHERE interaction_id IN ({marks})",
                           ids).fetchall()
    assert n == len(ids)


def test_run_time_variant_and_declared_variant_update(served):
    from serving.launch import update_app

    client, store = served
    new = {"variant": "bm25", "k": 4}
    new_id = RAGConfig(**BASE, **new).config_hash
    r = client.post("/admin/traffic", json={"canary_config": new, "canary_percent": 100.0})
    assert r.status_code == 200, r.text
    time.sleep(0.5)
    rs = _ask_all(client, [f"rt-{i}" for i in range(40)])
    assert {r.json()["variant_id"] for r in rs} == {new_id}  # both replicas serve it
    assert all(len(r.json()["context_ids"]) == 4 for r in rs)
    # the declared canary changes through Serve's config update from the driver
    declared = {"variant": "dense", "k": 3}
    declared_id = RAGConfig(**BASE, **declared).config_hash
    update_app(args(store, canary=declared))
    t = client.get("/admin/traffic").json()
    assert t["canary"] == declared_id and t["canary_percent"] == 20.0, t
    rs = _ask_all(client, [f"dec-{i}" for i in range(60)])
    got = {r.json()["variant_id"] for r in rs if r.json()["route"] == "canary"}
    assert got == {declared_id}


def test_the_chosen_proxy_answers(served, request):
    """HAProxy mode: a haproxy process runs from this cluster's own config directory
    (serving.launch._haproxy_env) and answers on the app's port; Serve-proxy mode: none does."""
    import psutil

    client, _ = served
    assert client.get("/readyz").status_code == 200
    run_dir = os.path.dirname(os.environ.get("RAY_SERVE_HAPROXY_CONFIG_FILE_LOC", "/nonexistent"))
    ours = [p for p in psutil.process_iter(["name", "cmdline"])
            if p.info["name"] == "haproxy" and run_dir in " ".join(p.info["cmdline"] or [])]
    if request.node.callspec.params["served"] == "haproxy":
        assert ours, "no haproxy process serves this cluster"
        assert os.environ["RAY_SERVE_ENABLE_HA_PROXY"] == "1"
    else:
        assert os.environ["RAY_SERVE_ENABLE_HA_PROXY"] == "0"
        assert not ours
