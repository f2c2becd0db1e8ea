"""The real Serve application, deployed once for this module on the session's shared
in-process Ray + Serve runtime (tests/conftest.py `serve_app`), talked to over HTTP on 127.0.0.1.

The runtime runs in a private network namespace (`serving.netns`): Serve replicas open gRPC
ports on every interface, and inside the namespace only loopback exists. Where that is not
permitted (no CAP_SYS_ADMIN) the test runs normally, HTTP still bound to 127.0.0.1.
Variants: stable = the default hybrid config, canary = bm25, shadow = bm25 with k=3.
"""

from __future__ import annotations

import json
import sqlite3
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import pytest
from tests.support.rollout_reports import clean_batch

from rag.config import RAGConfig

pytestmark = pytest.mark.ray

BASE = {"generator": "extractive"}
CANARY = {"variant": "bm25"}
SHADOW = {"variant": "bm25", "k": 3}
STABLE_ID = RAGConfig(**BASE).config_hash
CANARY_ID = RAGConfig(**BASE, **CANARY).config_hash
SHADOW_ID = RAGConfig(**BASE, **SHADOW).config_hash


def serve_args(store: Path) -> dict:
    return {"store_url": str(store), "auth": {"keys_file": str(store.parent / "keys.json")},
            "base": BASE, "canary": CANARY, "shadow": SHADOW,
            "traffic": {"canary_percent": 25.0, "shadow_percent": 0.0},
            # every request here comes from 127.0.0.1 (one rate-limit client per address/key):
            # the token bucket is tested in-process (test_serving_auth.py), the queue here
            "limits": {"max_inflight": 8, "rate_per_s": 1000.0, "burst": 1000.0},
            "pipelines": {"num_replicas": 1, "autoscaling": None, "num_cpus": 0.1},
            "max_variants": 4, "rollout_dir": str(store.parent / "rollout"),
            "eval_datasets": ["synthetic", str(store.parent / "datasets")]}


@pytest.fixture(scope="module")
def served(serve_app, tmp_path_factory):
    from serving.auth import KeyFile

    store = tmp_path_factory.mktemp("serve") / "interactions.sqlite"
    (store.parent / "datasets").mkdir()  # serve.eval_datasets lists it
    token, _ = KeyFile(store.parent / "keys.json").create("admin", name="test")
    url = serve_app.deploy(serve_args(store))
    with httpx.Client(base_url=url, timeout=60.0, headers={"X-API-Key": token}) as client:
        yield client, Path(store)


def _rows(store: Path, sql: str, params: tuple = ()) -> list[tuple]:
    with sqlite3.connect(store) as db:
        return db.execute(sql, params).fetchall()


def _ask(client: httpx.Client, question: str, **extra) -> httpx.Response:
    return client.post("/query", json={"question": question, **extra})


def test_healthz_and_docs(served):
    client, _ = served
    assert client.get("/healthz").json()["status"] == "alive"
    r = client.get("/readyz")
    assert r.status_code == 200 and r.json()["status"] == "ok"
    assert set(r.json()["variants"]) == {STABLE_ID, CANARY_ID, SHADOW_ID}
    assert client.get("/docs").status_code == 200
    paths = client.get("/openapi.json").json()["paths"]
    assert {"/query", "/feedback", "/rl/stats", "/tuner/evaluate"} <= set(paths)


def test_admin_routes_refuse_requests_without_a_valid_key(served):
    """Every admin operation of the live app's OpenAPI spec answers 401 without a key (and
    with a wrong one) before its handler runs; the open routes stay open."""
    from serving.auth import required_role

    client, _ = served
    spec = client.get("/openapi.json").json()["paths"]
    ops = [(m.upper(), p) for p, methods in spec.items() for m in methods]
    admin = [(m, p) for m, p in ops if required_role(p, False) == "admin"]
    assert len(admin) >= 8
    with httpx.Client(base_url=str(client.base_url), timeout=60.0) as anon:
        for m, p in admin:
            for headers in ({}, {"Authorization": "Bearer rpk_deadbeef_wrong"}):
                r = anon.request(m, p.replace("{job_id}", "x"), headers=headers,
                                 json={} if m == "POST" else None)
                assert r.status_code == 401 and r.json()["field"] == "authorization", (m, p)
        assert anon.get("/healthz").status_code == 200
        assert anon.get("/metrics").status_code == 200
        assert anon.get("/rl/stats").status_code == 200  # reads open by default
        big = anon.post("/query", content=b"x" * (2 * 2**20),
                        headers={"content-type": "application/json"})
        assert big.status_code == 413 and big.json()["field"] == "body"


def test_query_then_feedback_is_stored(served):
    from rag.corpus.synthetic import make_synthetic_world

    client, store = served
    ex = make_synthetic_world().examples[0]
    r = _ask(client, ex.question, user_id="alice", category=ex.category)
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["variant_id"] in {STABLE_ID, CANARY_ID} and body["answer"]
    assert body["context_ids"] and 0 < body["propensity"] <= 1
    assert {"retrieve", "generate", "pipeline", "store", "total"} <= set(body["latency_ms"])
    iid = body["interaction_id"]
    (row,) = _rows(store, "SELECT variant_id, propensity, category, scores FROM interactions "
                          "WHERE id = ?", (iid,))  # committed before the response was sent
    assert row[0] == body["variant_id"] and row[2] == ex.category and '"f1"' in row[3]
    f = client.post("/feedback", json={"interaction_id": iid, "reward": 0.75})
    assert f.status_code == 200 and f.json()["stored"] is True
    assert _rows(store, "SELECT reward FROM feedback WHERE interaction_id = ?", (iid,)) == \
        [(0.75,)]
    again = client.post("/feedback", json={"interaction_id": iid, "reward": 0.1})
    assert again.status_code == 409 and again.json()["field"] == "interaction_id"


def test_bad_input_is_4xx_naming_the_field(served):
    client, store = served
    before = _rows(store, "SELECT COUNT(*) FROM feedback")
    cases = [("/query", {"question": ""}, 422, "question"),
             ("/query", {"question": "   "}, 422, "question"),
             ("/query", {"question": "x", "colour": "red"}, 422, "colour"),
             ("/feedback", {"interaction_id": "nope", "reward": 0.5}, 404, "interaction_id"),
             ("/feedback", {"interaction_id": "nope", "reward": 1.5}, 422, "reward"),
             ("/tuner/evaluate", {"config": {"k": 0}}, 422, "config.k"),
             ("/admin/traffic", {"canary_percent": 120}, 422, "canary_percent"),
             ("/admin/traffic", {"canary_config": "deadbeef0000"}, 422, "canary_config")]
    for path, payload, status, field in cases:
        r = client.post(path, json=payload)
        assert r.status_code == status, (path, payload, r.text)
        assert r.json()["field"] == field and field in r.json()["error"]
    assert client.get("/tuner/jobs/unknown").status_code == 404
    assert _rows(store, "SELECT COUNT(*) FROM feedback") == before


def test_canary_share_is_sticky_and_near_configured(served):
    client, _ = served
    n = 400

    def one(i: int) -> tuple[str, str, float]:
        r = _ask(client, f"Where was person {i} born?", user_id=f"user-{i}")
        assert r.status_code == 200, r.text
        b = r.json()
        return b["variant_id"], b["route"], b["propensity"]

    with ThreadPoolExecutor(4) as pool:
        got = list(pool.map(one, range(n)))
    share = sum(v == CANARY_ID for v, _, _ in got) / n
    assert abs(share - 0.25) < 0.07, share  # binomial sd 2.2 pp at n=400
    assert {p for v, _, p in got if v == CANARY_ID} == {0.25}
    assert {p for v, _, p in got if v == STABLE_ID} == {0.75}
    again = [_ask(client, "Where was person 1 born?", user_id=f"user-{i}").json()["variant_id"]
             for i in range(10)]
    assert again == [v for v, _, _ in got[:10]]  # sticky per user


def test_shadow_is_logged_never_returned(served):
    """Mirrored answers are logged, never returned. These questions have no gold: both rows of
    each pair carry the reference-free signals, and the rollout's shadow evidence from the
    store judges quality on sig_combined."""
    client, store = served
    t_start = time.time()
    r = client.post("/admin/traffic", json={"shadow_percent": 100.0, "canary_percent": 0.0})
    assert r.status_code == 200 and r.json()["shadow"] == SHADOW_ID
    from rag.corpus.loaders import load_dataset

    ids = []
    for i, ex in enumerate(load_dataset("synthetic").examples[:12]):  # reworded: no gold
        b = _ask(client, f"Tell me: {ex.question}", user_id=f"s-{i}").json()
        assert b["variant_id"] == STABLE_ID != SHADOW_ID
        ids.append(b["interaction_id"])
    client.post("/admin/traffic", json={"shadow_percent": 0.0, "canary_percent": 25.0})
    deadline = time.time() + 30
    rows: list[tuple] = []
    while time.time() < deadline:
        q = ",".join("?" * len(ids))
        rows = _rows(store, f"SELECT parent_id, variant_id, route FROM interactions WHERE "
                            f"shadow = 1 AND parent_id IN ({q})", tuple(ids))
        if len(rows) == len(ids):
            break
        time.sleep(0.2)
    assert sorted(r[0] for r in rows) == sorted(ids)
    assert {(r[1], r[2]) for r in rows} == {(SHADOW_ID, "shadow")}
    from serving.store import open_store

    log_store, stored = open_store(store, create=False), []  # signals land after the reply
    while time.time() < deadline + 30:
        got = [log_store.get_interaction(i) for i in ids + [r[0] for r in _rows(
            store, f"SELECT id FROM interactions WHERE parent_id IN ({q})", tuple(ids))]]
        stored = [(x["scores"], x["latency_ms"]) for x in got]
        if all("sig_combined" in sc for sc, _ in stored):
            break
        time.sleep(0.2)
    assert len(stored) == 2 * len(ids)
    for sc, lat in stored:
        assert 0.0 <= sc["sig_combined"] <= 1.0 and "f1" not in sc, sc
        assert 0.0 <= sc["sig_relevancy"] <= 1.0 and 0.0 <= sc["sig_faithfulness"] <= 1.0
        assert lat["signals"] > 0
    assert len({sc["sig_combined"] for sc, _ in stored}) > 1  # not a constant
    lats = [lat for _, lat in stored]
    sig_ms = sorted(x["signals"] for x in lats)
    stage_ms = sorted(sum(v for k, v in x.items() if k not in ("signals", "pipeline"))
                      for x in lats)
    print(f"signals stage: median {sig_ms[len(sig_ms) // 2]:.1f} ms, max {sig_ms[-1]:.1f} ms "
          f"over {len(sig_ms)} answers; pipeline stages median "
          f"{stage_ms[len(stage_ms) // 2]:.1f} ms")
    from rl.promotion.evidence import reports_from_store
    from rl.promotion.state_machine import PromotionSettings, PromotionStateMachine

    slow_ok = PromotionSettings.from_dict({"thresholds": {"faithfulness": 0.0, "relevancy": 0.0,
                                                          "p95_latency_ms": 60_000},
                                           "slo": {"latency_ms": 60_000}})  # a loaded CI box
    sm = PromotionStateMachine.start(None, SHADOW_ID, STABLE_ID, config=slow_ok,
                                     code_commit="test")
    sm.state.stage, sm.state.row_cursor = "shadow", t_start
    ev = reports_from_store(store, sm, open_store=open_store)
    assert len(ev.reports) == 1, ev.notes
    rep = ev.reports[0]
    assert rep.meta["quality_on"] == {"gold": 0, "sig_combined": len(ids), "none": 0}
    assert rep.metrics["quality"]["n"] == len(ids)
    assert sm.observe(rep).action == "hold"
    quality = next(j for j in sm.summary()["metrics"] if j["metric"] == "quality")
    assert f"judged on sig_combined ({len(ids)})" in quality["statistic"]
    shadow_id = _rows(store, "SELECT id FROM interactions WHERE shadow = 1 LIMIT 1")[0][0]
    r = client.post("/feedback", json={"interaction_id": shadow_id, "reward": 1.0})
    assert r.status_code == 422 and r.json()["field"] == "interaction_id"


def test_bounded_queue_answers_429(served):
    client, _ = served

    def burst(i: int) -> httpx.Response:
        return _ask(client, f"Where is company {i}?", user_id=f"burst-{i}")

    with ThreadPoolExecutor(48) as pool:
        rs = list(pool.map(burst, range(48)))
    busy = [r for r in rs if r.status_code == 429]
    assert busy and busy[0].json()["field"] == "server" and "busy" in busy[0].json()["error"]
    assert "Retry-After" in busy[0].headers
    assert all(r.status_code in (200, 429) for r in rs)


def test_bandit_mode_learns_from_feedback(served):
    client, _ = served
    r = client.post("/admin/traffic", json={"mode": "bandit"})
    assert r.status_code == 200 and r.json()["mode"] == "bandit"
    for i in range(30):
        b = _ask(client, f"In which year was company {i} founded?", user_id=f"b-{i}",
                 category="single").json()
        assert b["route"] == "bandit" and 0 < b["propensity"] <= 1
        reward = 1.0 if b["variant_id"] == CANARY_ID else 0.0
        assert client.post("/feedback", json={"interaction_id": b["interaction_id"],
                                              "reward": reward}).status_code == 200
    board = client.get("/rl/leaderboard", params={"category": "single"}).json()
    rows = {row["arm"]: row for row in board["bandit"]["single"]}
    assert sum(row["pulls"] for row in rows.values()) == 30
    assert rows[CANARY_ID]["mean_reward"] == 1.0
    assert rows[CANARY_ID]["pulls"] >= max(rows[STABLE_ID]["pulls"], rows[SHADOW_ID]["pulls"])
    client.post("/admin/traffic", json={"mode": "split"})


def test_new_canary_config_is_deployed_at_run_time(served):
    client, _ = served
    r = client.post("/admin/traffic", json={"canary_config": {"variant": "bm25", "k": 4},
                                            "canary_percent": 100.0})
    assert r.status_code == 200, r.text
    new_id = RAGConfig(**BASE, variant="bm25", k=4).config_hash
    assert r.json()["canary"] == new_id
    b = _ask(client, "Which city is the capital?", user_id="dyn").json()
    assert b["variant_id"] == new_id and len(b["context_ids"]) == 4
    too_many = client.post("/admin/traffic", json={"canary_config": {"k": 6}})
    assert too_many.status_code == 409  # max_variants = 4
    client.post("/admin/traffic", json={"canary_config": CANARY_ID, "canary_percent": 25.0})


def test_tuner_evaluate_job_completes(served):
    client, store = served
    missing = store.parent / "datasets" / "missing.jsonl"  # allowed (under a listed folder)
    r = client.post("/tuner/evaluate", json={"config": {"variant": "bm25"}, "dataset":
                                             "synthetic", "split": "valid", "batch_size": 20})
    assert r.status_code == 202
    job_id = r.json()["job_id"]
    # a dataset outside serve.eval_datasets is refused before a job starts (the server would
    # otherwise read any path it is sent); an allowed one that fails to load fails as a job
    refused = client.post("/tuner/evaluate", json={"config": {}, "dataset": "/etc/passwd"})
    assert refused.status_code == 403 and refused.json()["field"] == "dataset", refused.text
    assert "serve.eval_datasets" in refused.json()["error"]
    bad = client.post("/tuner/evaluate", json={"config": {}, "dataset": str(missing)})

    def wait(jid: str) -> dict:
        deadline = time.time() + 240
        while time.time() < deadline:
            job = client.get(f"/tuner/jobs/{jid}").json()
            if job["status"] != "running":
                return job
            time.sleep(0.5)
        raise AssertionError(f"job {jid} still running")

    job = wait(job_id)
    assert job["status"] == "done", job
    res = job["result"]
    assert res["n"] == 20 and res["config_hash"] == CANARY_ID and "passed" in res["gates"]
    assert res["warnings"] == []  # the synthetic world's gold is all in its corpus
    failed = wait(bad.json()["job_id"])
    assert failed["status"] == "failed" and missing.name in failed["error"], failed


def test_stats_leaderboard_and_metrics(served):
    client, _ = served
    stats = client.get("/rl/stats").json()
    assert stats["store"]["interactions"] > 0 and stats["store"]["feedback"] > 0
    assert stats["traffic"]["stable"] == STABLE_ID
    board = client.get("/rl/leaderboard").json()
    assert any(row["pulls"] > 0 for row in board["variants"])
    text = client.get("/metrics").text
    for name in ("ragpilot_requests_total", "ragpilot_errors_total", "ragpilot_rejected_total",
                 "ragpilot_stage_latency_seconds_bucket", "ragpilot_request_latency_seconds",
                 "ragpilot_tokens_total", "ragpilot_feedback_reward", "ragpilot_canary_delta",
                 "ragpilot_shadow_delta", "ragpilot_gate_status", "ragpilot_traffic_percent"):
        assert name in text, name
    assert f'variant="{STABLE_ID}"' in text


OFFLINE_WIN = clean_batch("offline", 500, 500)  # per-metric paired statistics: better


def test_rollout_admin_api_drives_the_router(served):
    """start -> offline evidence -> shadow (router mirrors the candidate) -> rollback (router
    back to stable only), with every transition in the audit log; then a rollout to `full` and
    a rollback from there (the old stable serves again). Runs last: it moves traffic."""
    client, store = served
    assert client.get("/admin/rollout").status_code == 404
    bad = client.post("/admin/rollout/start", json={"candidate": "nope"})
    assert bad.status_code == 404 and "candidate" in bad.text
    r = client.post("/admin/rollout/start", json={"candidate": CANARY_ID, "manifest_id": "t"})
    assert r.status_code == 200, r.text
    assert r.json()["stage"] == "candidate" and r.json()["traffic"]["canary_percent"] == 0
    junk = client.post("/admin/rollout/advance", json={"reports": [{"kind": "offline"}]})
    assert junk.status_code == 422 and "reports.0" in junk.text
    adv = client.post("/admin/rollout/advance", json={"reports": [OFFLINE_WIN]}).json()
    assert adv["decision"]["action"] == "advance" and adv["stage"] == "shadow"
    assert adv["traffic"]["shadow"] == CANARY_ID and adv["traffic"]["shadow_percent"] > 0
    assert client.get("/admin/traffic").json()["shadow"] == CANARY_ID
    st = client.get("/admin/rollout").json()
    assert st["stage"] == "shadow" and st["candidate"] == CANARY_ID
    rb = client.post("/admin/rollout/rollback", json={"reason": "test"}).json()
    assert rb["stage"] == "rolled_back"
    t = client.get("/admin/traffic").json()
    assert t["shadow"] is None and t["canary"] is None and t["canary_percent"] == 0
    audit = (store.parent / "rollout" / "audit.jsonl").read_text().splitlines()
    assert [json.loads(x)["to"] for x in audit][-2:] == ["shadow", "rolled_back"]
    assert client.post("/admin/rollout/advance", json={}).status_code == 409
    # again up to full (the candidate becomes the router's stable), then back: the old stable
    # serves again
    r = client.post("/admin/rollout/start", json={"candidate": CANARY_ID, "force": True})
    assert r.status_code == 200 and r.json()["traffic"]["stable"] == STABLE_ID, r.text
    steps = [[OFFLINE_WIN], [clean_batch("shadow", 1500, 1500, b) for b in range(3)],
             [clean_batch("canary", 1600, 30_000, b) for b in range(3)],
             [clean_batch("canary", 2000, 6000, b) for b in range(3)]]
    for reports, to in zip(steps,
                           ["shadow", "canary_5", "canary_25", "full"], strict=True):
        adv = client.post("/admin/rollout/advance", json={"reports": reports})
        assert adv.status_code == 200 and adv.json()["stage"] == to, adv.text
    assert client.get("/admin/traffic").json()["stable"] == CANARY_ID
    assert _ask(client, "Where was person 3 born?").json()["variant_id"] == CANARY_ID
    rb = client.post("/admin/rollout/rollback", json={"reason": "regression at full"}).json()
    assert rb["stage"] == "rolled_back" and rb["traffic"]["stable"] == STABLE_ID
    assert client.get("/admin/traffic").json()["stable"] == STABLE_ID
    assert _ask(client, "Where was person 3 born?").json()["variant_id"] == STABLE_ID
    client.post("/admin/traffic", json={"canary_config": CANARY_ID, "canary_percent": 25.0})


def test_a_restarted_app_serves_the_last_split(served, serve_app):
    """Last in this file: it restarts Ray and Serve. A stable deployed at run time (its own
    app) is deployed again from the stored routing and serves after the restart."""
    client, store = served
    new = RAGConfig(**BASE, variant="bm25", k=4).config_hash
    r = client.post("/admin/traffic", json={"stable": {"variant": "bm25", "k": 4},
                                            "canary_percent": 0.0})
    assert r.status_code == 200 and r.json()["stable"] == new, r.text
    url = serve_app.restart(serve_args(store))
    with httpx.Client(base_url=url, timeout=60.0, headers=dict(client.headers)) as c2:
        t = c2.get("/admin/traffic").json()
        assert (t["stable"], t["canary_percent"]) == (new, 0.0), t
        assert t["restored"]["action"] == "admin/traffic"
        assert _ask(c2, "Where was person 3 born?").json()["variant_id"] == new
        assert new in c2.get("/readyz").json()["variants"]


