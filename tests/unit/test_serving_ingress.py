"""The Serve ingress in-process (`serving.app.local_app`, no Ray): per-client rate limits on
/query and /feedback, /readyz on failures, rollback from `full` restoring the old stable,
routing that survives a restart, PII leaks feeding the reward the bandit learns, and the load
benchmark's admin key.

Pipelines are stand-ins (the real replica is exercised over HTTP in test_serving_app.py).
"""

from __future__ import annotations

import json
from concurrent.futures import Future

import pytest
from fastapi.testclient import TestClient
from tests.support.rollout_reports import clean_batch

from rag.config import RAGConfig
from serving.api import REPLICA_ID
from serving.auth import KeyFile

BASE = {"generator": "extractive"}
CANDIDATE = {"variant": "bm25"}
STABLE_ID = RAGConfig(**BASE).config_hash
CAND_ID = RAGConfig(**BASE, **CANDIDATE).config_hash


class Stub:
    """Answers with a fixed text; `info` can be made to fail like a dead replica."""

    def __init__(self, variant: str, answer: str = "Paris [1]"):
        self.variant, self.text, self.dead = variant, answer, False

    def answer(self, question: str, query_id: str = "q") -> dict:
        return {"answer": self.text, "citations": [1], "cited_ids": ["p1"],
                "context_ids": ["p1", "p2"], "latency_ms": {"retrieve": 1.0, "generate": 0.5},
                "tokens_in": 10, "tokens_out": 2, "variant_id": self.variant,
                "scores": {"f1": 1.0}, "gold_category": None}

    def info(self) -> dict:
        if self.dead:
            raise RuntimeError("ActorDiedError: the replica's worker process died")
        return {"variant_id": self.variant}


def _no_jobs(request: dict) -> Future:
    fut: Future = Future()
    fut.set_exception(RuntimeError("tuner jobs are not run in this test"))
    return fut


def make_app(tmp_path, answer: str = "Paris [1]", more_ids: tuple[str, ...] = (), **extra):
    """(TestClient, admin headers, read headers, stubs by variant id, the Ingress object).
    A config deployed at run time gets a stub too (its id lands in `stubs`); `more_ids` get
    stubs up front (variants a restarted app deploys from the stored routing)."""
    from serving.app import LocalHandle, _servable_dependency, api, local_app

    kf = KeyFile(tmp_path / "keys.json")
    admin, read = (kf.create(role, name=f"test-{role}")[0] for role in ("admin", "read"))
    stubs = {v: Stub(v, answer) for v in (STABLE_ID, CAND_ID, *more_ids)}
    args = {"store_url": str(tmp_path / "log.sqlite"), "base": BASE, "canary": CANDIDATE,
            "auth": {"keys_file": str(kf.path)}, "rollout_dir": str(tmp_path / "rollout"),
            **extra}

    def deploy(cfg: RAGConfig) -> LocalHandle:
        stubs[cfg.config_hash] = Stub(cfg.config_hash, answer)
        return LocalHandle(stubs[cfg.config_hash])

    app = local_app(args, services=dict(stubs), submit=_no_jobs, deploy=deploy)
    inst = api.dependency_overrides[_servable_dependency()]()
    return (TestClient(app), {"X-API-Key": admin}, {"Authorization": f"Bearer {read}"}, stubs,
            inst)


# --------------------------------------------------------------------------- rate limits


def test_changing_user_id_does_not_escape_the_rate_limit(tmp_path):
    c, _, read, _, _ = make_app(tmp_path, limits={"rate_per_s": 0.01, "burst": 3})
    with c:
        codes = [c.post("/query", json={"question": "Who?", "user_id": f"u{i}",
                                        "session_id": f"s{i}"}).status_code for i in range(3)]
        assert codes == [200, 200, 200]
        r = c.post("/query", json={"question": "Who?", "user_id": "brand-new-user"})
        assert r.status_code == 429 and r.json()["field"] == "client"
        assert "rate limit" in r.json()["error"]
        assert int(r.headers["Retry-After"]) >= 1
        # a made-up API key is not an identity: still the address's (empty) bucket
        fake = c.post("/query", json={"question": "Who?"},
                      headers={"Authorization": "Bearer rpk_00000000_made-up"})
        assert fake.status_code == 429
        # a valid key is its own client (its own bucket), whatever the address
        assert c.post("/query", json={"question": "Who?"}, headers=read).status_code == 200
        text = c.get("/metrics").text
        assert f'ragpilot_rejected_total{{reason="rate_limit",replica="{REPLICA_ID}"}} 2.0' in text


def test_feedback_is_rate_limited_with_retry_after(tmp_path):
    c, _, _, _, _ = make_app(tmp_path, limits={"rate_per_s": 0.01, "burst": 3})
    with c:
        ids = [c.post("/query", json={"question": f"Who {i}?"}).json()["interaction_id"]
               for i in range(2)]
        assert c.post("/feedback", json={"interaction_id": ids[0], "reward": 1.0}
                      ).status_code == 200
        r = c.post("/feedback", json={"interaction_id": ids[1], "reward": 0.5})
        assert r.status_code == 429, r.text
        assert int(r.headers["Retry-After"]) >= 1 and "rate limit" in r.json()["error"]
        assert c.get("/rl/stats").json()["store"]["feedback"] == 1  # refused before the write


# --------------------------------------------------------------------------- health


def test_readyz_answers_503_json_when_a_replica_or_the_store_fails(tmp_path):
    """/readyz is readiness (503 JSON naming what failed); /healthz is liveness and stays 200
    through all of it (a failed pipeline is no reason to restart the ingress)."""
    c, _, _, stubs, inst = make_app(tmp_path)
    with c:
        assert c.get("/readyz").json()["status"] == "ok"
        stubs[CAND_ID].dead = True
        assert c.get("/healthz").json()["status"] == "alive"
        r = c.get("/readyz")
        assert r.status_code == 503, r.text
        body = r.json()
        assert body["status"] == "unavailable" and list(body["failed"]) == [CAND_ID]
        assert "ActorDiedError" in body["failed"][CAND_ID] and CAND_ID in body["error"]
        stubs[CAND_ID].dead = False

        def broken() -> dict:
            raise OSError("disk I/O error")

        inst.store.counts = broken
        r = c.get("/readyz")
        assert r.status_code == 503 and r.json()["status"] == "unavailable"
        assert r.json()["error"].startswith("store: OSError")
        assert c.get("/healthz").status_code == 200


# --------------------------------------------------------------------------- rollback


def drive_to_full(c: TestClient, admin: dict) -> None:
    r = c.post("/admin/rollout/start", json={"candidate": CAND_ID, "stable": STABLE_ID,
                                             "force": True}, headers=admin)
    assert r.status_code == 200, r.text
    steps = [[clean_batch("offline", 500, 500)],
             [clean_batch("shadow", 1500, 1500, b) for b in range(3)],
             [clean_batch("canary", 1600, 30_000, b) for b in range(3)],
             [clean_batch("canary", 2000, 6000, b) for b in range(3)]]
    for reports, to in zip(steps, ["shadow", "canary_5", "canary_25", "full"], strict=True):
        r = c.post("/admin/rollout/advance", json={"reports": reports}, headers=admin)
        assert r.status_code == 200 and r.json()["stage"] == to, r.text
    assert c.get("/admin/traffic", headers=admin).json()["stable"] == CAND_ID
    assert c.post("/query", json={"question": "Who?"}).json()["variant_id"] == CAND_ID


def test_rollback_from_full_restores_the_old_stable(tmp_path):
    c, admin, _, _, _ = make_app(tmp_path)
    with c:
        drive_to_full(c, admin)
        # evidence is refused at full (runbooks/canary_promotion.md says so)
        assert c.post("/admin/rollout/advance", json={}, headers=admin).status_code == 409
        rb = c.post("/admin/rollout/rollback", json={"reason": "p95 at full"}, headers=admin)
        assert rb.status_code == 200 and rb.json()["stage"] == "rolled_back"
        t = rb.json()["traffic"]
        assert t["stable"] == STABLE_ID and t["canary"] is None and t["canary_percent"] == 0
        assert c.get("/admin/traffic", headers=admin).json()["stable"] == STABLE_ID
        assert c.post("/query", json={"question": "Who?"}).json()["variant_id"] == STABLE_ID
        audit = [json.loads(x) for x in
                 (tmp_path / "rollout" / "audit.jsonl").read_text().splitlines()]
        assert (audit[-1]["from"], audit[-1]["to"], audit[-1]["stable_hash"]) == (
            "full", "rolled_back", STABLE_ID)


def test_cli_rollback_from_full_prints_the_traffic_body_that_restores_stable(tmp_path, capsys):
    from serving.cli import main as cli_main

    c, admin, _, _, _ = make_app(tmp_path)
    with c:
        drive_to_full(c, admin)
        assert cli_main(["rollout", "rollback", "--state-dir", str(tmp_path / "rollout"),
                                 "--reason", "incident at full"]) == 0
        out = capsys.readouterr().out
        body = json.loads(out.split("-d '")[1].split("'")[0])
        assert body == {"mode": "split", "canary_percent": 0.0, "shadow_percent": 0.0,
                        "canary_config": None, "shadow_config": None, "stable": STABLE_ID}
        assert c.post("/admin/traffic", json=body).status_code == 401  # admin key required
        r = c.post("/admin/traffic", json=body, headers=admin)
        assert r.status_code == 200 and r.json()["stable"] == STABLE_ID, r.text
        assert c.post("/query", json={"question": "Who?"}).json()["variant_id"] == STABLE_ID


def test_traffic_stable_field_is_validated(tmp_path):
    c, admin, _, stubs, _ = make_app(tmp_path, limits={"max_k": 10})
    with c:
        cases = [({"stable": None}, "stable"), ({"stable": "deadbeef0000"}, "stable"),
                 ({"stable": {"k": 11}}, "stable.k"), ({"stable": {"nope": 1}}, "stable.nope")]
        for body, field in cases:
            r = c.post("/admin/traffic", json=body, headers=admin)
            assert r.status_code == 422 and r.json()["field"] == field, (body, r.text)
        r = c.post("/admin/traffic", json={"stable": CAND_ID}, headers=admin)
        assert r.status_code == 200 and r.json()["stable"] == CAND_ID
        r = c.post("/admin/traffic", json={"stable": {"k": 4}}, headers=admin)  # deployed
        new = RAGConfig(**BASE, k=4).config_hash
        assert r.status_code == 200 and r.json()["stable"] == new and new in stubs
        assert c.post("/query", json={"question": "Who?"}).json()["variant_id"] == new


# --------------------------------------------------------------------------- restarts


def test_a_promotion_to_full_survives_a_restart(tmp_path):
    c, admin, _, _, _ = make_app(tmp_path)
    with c:
        drive_to_full(c, admin)
    c2, admin2, _, _, ing = make_app(tmp_path)  # same args, same store: a restarted app
    with c2:
        t = c2.get("/admin/traffic", headers=admin2).json()
        assert t["stable"] == CAND_ID and t["canary"] is None and t["canary_percent"] == 0
        assert t["restored"]["action"] == "rollout/advance"
        assert c2.post("/query", json={"question": "Who?"}).json()["variant_id"] == CAND_ID
        # and a rollback after the restart still puts the rollout's old stable back
        rb = c2.post("/admin/rollout/rollback", json={"reason": "after restart"},
                     headers=admin2)
        assert rb.status_code == 200 and rb.json()["traffic"]["stable"] == STABLE_ID
    c3, admin3, _, _, _ = make_app(tmp_path)
    with c3:
        assert c3.get("/admin/traffic", headers=admin3).json()["stable"] == STABLE_ID


def test_a_variant_deployed_at_run_time_is_deployed_again_after_a_restart(tmp_path):
    new, mirror = RAGConfig(**BASE, k=4).config_hash, RAGConfig(**BASE, k=3).config_hash
    c, admin, _, _, _ = make_app(tmp_path)
    with c:
        r = c.post("/admin/traffic", json={"canary_config": {"k": 4}, "canary_percent": 30,
                                           "shadow_config": {"k": 3}, "shadow_percent": 5},
                   headers=admin)
        assert r.status_code == 200 and r.json()["canary"] == new
    c2, admin2, _, stubs, ing = make_app(tmp_path, more_ids=(new, mirror))
    with c2:
        t = c2.get("/admin/traffic", headers=admin2).json()
        assert (t["stable"], t["canary"], t["shadow"], t["canary_percent"],
                t["shadow_percent"]) == (STABLE_ID, new, mirror, 30.0, 5.0)
        assert new in ing.handles and ing.configs[new]["k"] == 4
        seen = {c2.post("/query", json={"question": "Who?", "user_id": f"u{i}"}).json()[
            "variant_id"] for i in range(40)}
        assert seen == {STABLE_ID, new}


def test_changed_args_routing_wins_over_the_stored_split(tmp_path):
    c, admin, _, _, _ = make_app(tmp_path)
    with c:
        assert c.post("/admin/traffic", json={"stable": CAND_ID},
                      headers=admin).status_code == 200
    # the operator edits the YAML (another canary share): the YAML is the newer intent
    c2, admin2, _, _, _ = make_app(tmp_path, traffic={"canary_percent": 20})
    with c2:
        t = c2.get("/admin/traffic", headers=admin2).json()
        assert t["stable"] == STABLE_ID and t["canary_percent"] == 20 and t["restored"] is None
    # and with restoring off the args are served even when unchanged
    c3, admin3, _, _, _ = make_app(tmp_path, restore_routing=False)
    with c3:
        assert c3.get("/admin/traffic", headers=admin3).json()["stable"] == STABLE_ID


def test_a_routing_change_the_store_refuses_is_not_made(tmp_path):
    c, admin, _, _, ing = make_app(tmp_path)

    def refuse(*_a, **_k):
        raise RuntimeError("database is locked")

    with c:
        before = c.get("/admin/traffic", headers=admin).json()
        ing.store.save_routing = refuse
        r = c.post("/admin/traffic", json={"stable": CAND_ID, "canary_percent": 50},
                   headers=admin)
        assert r.status_code == 503 and r.json()["field"] == "store", r.text
        assert "database is locked" in r.json()["error"]
        assert c.get("/admin/traffic", headers=admin).json() == before
        assert before["stable"] == STABLE_ID
        assert c.post("/query", json={"question": "Who?", "user_id": "u1"}).status_code == 200


# --------------------------------------------------------------------------- PII -> reward


def test_pii_leaks_lower_the_reward_the_bandit_learns(tmp_path):
    leaky = "Mail jane.doe@corp.example [1]"  # an address the question does not contain
    c, admin, _, _, _ = make_app(tmp_path, leaky, pii={"leak_penalty": 0.25})
    with c:
        assert c.post("/admin/traffic", json={"mode": "bandit"}, headers=admin).status_code == 200
        b = c.post("/query", json={"question": "Who is the contact?", "category": "c"}).json()
        f = c.post("/feedback", json={"interaction_id": b["interaction_id"], "reward": 0.9})
        assert f.status_code == 200, f.text
        assert f.json()["pii_leaks"] == 1.0 and f.json()["reward"] == 0.9  # stored as given
        assert f.json()["policy_reward"] == pytest.approx(0.65)
        rows = {r["arm"]: r for r in c.get("/rl/leaderboard", params={"category": "c"}
                                           ).json()["bandit"]["c"]}
        assert rows[b["variant_id"]]["mean_reward"] == pytest.approx(0.65)
    # a restart replays the log into the bandits with the same penalty
    c2, _, _, _, _ = make_app(tmp_path, leaky, pii={"leak_penalty": 0.25})
    with c2:
        rows = {r["arm"]: r for r in c2.get("/rl/leaderboard", params={"category": "c"}
                                            ).json()["bandit"]["c"]}
        assert rows[b["variant_id"]]["pulls"] == 1
        assert rows[b["variant_id"]]["mean_reward"] == pytest.approx(0.65)


def test_no_leak_means_the_feedback_reward_is_learned_unchanged(tmp_path):
    c, admin, _, _, _ = make_app(tmp_path)
    with c:
        c.post("/admin/traffic", json={"mode": "bandit"}, headers=admin)
        b = c.post("/query", json={"question": "Who?", "category": "c"}).json()
        f = c.post("/feedback", json={"interaction_id": b["interaction_id"], "reward": 0.9})
        assert f.json()["pii_leaks"] == 0.0 and f.json()["policy_reward"] == 0.9


# --------------------------------------------------------------------------- the benchmark


def test_serve_load_benchmark_sends_an_admin_key(tmp_path, monkeypatch):
    """bench/serve_load.py creates an admin key in the app's key file and sends it, so its
    /admin/traffic phases pass with auth on (the default)."""
    import httpx
    from bench import serve_load

    headers = serve_load.admin_key(tmp_path / "keys.json")
    assert KeyFile(tmp_path / "keys.json").verify(
        headers["Authorization"].removeprefix("Bearer ")).role == "admin"
    from serving.app import local_app

    app = local_app({"store_url": str(tmp_path / "log.sqlite"), "base": BASE,
                     "canary": CANDIDATE, "auth": {"enabled": True,
                                                   "keys_file": str(tmp_path / "keys.json")},
                     "rollout_dir": str(tmp_path / "rollout")},
                    services={STABLE_ID: Stub(STABLE_ID), CAND_ID: Stub(CAND_ID)},
                    submit=_no_jobs)
    with TestClient(app) as c:
        sent = []

        def post(url: str, *, timeout: float, **kw):  # httpx.post, answered by the app
            sent.append(kw["headers"])
            return c.post(url, **kw)

        monkeypatch.setattr(httpx, "post", post)
        assert serve_load.set_traffic("", headers, canary_percent=10.0)["canary_percent"] == 10
        assert sent == [headers]
        with pytest.raises(Exception, match="401"):  # what the benchmark died of before
            serve_load.set_traffic("", {}, canary_percent=0.0)


# --------------------------------------------------------------------------- conversations


def test_a_query_carries_its_conversation_to_the_replica(tmp_path, monkeypatch):
    seen: list = []
    plain = Stub.answer

    def answer(self, question: str, query_id: str = "q", history=None) -> dict:
        seen.append(history)  # every replica (stable or canary) records its turns
        return plain(self, question, query_id)

    monkeypatch.setattr(Stub, "answer", answer)
    c, _, _, _, _ = make_app(tmp_path)
    with c:
        history = [{"role": "user", "text": "Tell me about the Eiffel Tower."},
                   {"role": "agent", "text": "It is in Paris [1]."}]
        r = c.post("/query", json={"question": "How tall is it?", "history": history})
        assert r.status_code == 200, r.text
        assert c.post("/query", json={"question": "How tall is the Eiffel Tower?"}
                      ).status_code == 200
        assert c.post("/query", json={"question": "And now?", "history": []}).status_code == 200
        assert seen == [tuple(history), None, None]  # single turns keep two arguments
        bad = c.post("/query", json={"question": "Q?", "history": [{"role": "bot", "text": "x"}]})
        assert bad.status_code == 422 and "history" in bad.text
        long = [{"role": "user", "text": "x"}] * 51
        assert c.post("/query", json={"question": "Q?", "history": long}).status_code == 422
        assert len(seen) == 3  # refused requests reach no replica


# --------------------------------------------------------------------------- request log


def test_every_request_and_admin_change_is_one_json_line(tmp_path):
    """Through the real middleware: a /query line carries the interaction id, variant, status
    and latency (no question text), a refused request its status, an admin change the key's
    id and the split before and after; probes and scrapes write nothing."""
    c, admin, _, _, inst = make_app(tmp_path)
    with c:
        r = c.post("/query", json={"question": "Where is the secret base?", "user_id": "u"})
        assert r.status_code == 200
        assert c.post("/admin/traffic", json={"canary_percent": 40.0},
                      headers=admin).status_code == 200
        assert c.post("/admin/traffic", json={"canary_percent": 400.0},
                      headers=admin).status_code == 422
        c.get("/healthz"), c.get("/readyz"), c.get("/metrics")
    lines = [json.loads(x) for x in inst.request_log.path.read_text().splitlines()]
    assert [(x["kind"], x.get("path", x.get("action")), x.get("status")) for x in lines] == [
        ("request", "/query", 200), ("admin", "admin/traffic", None),
        ("request", "/admin/traffic", 200), ("request", "/admin/traffic", 422)]
    q = lines[0]
    assert q["interaction_id"] == r.json()["interaction_id"] and q["latency_ms"] > 0
    assert q["variant"] == r.json()["variant_id"] and "secret" not in json.dumps(q)
    key_id = admin["X-API-Key"].split("_")[1]
    assert lines[1]["key_id"] == key_id and lines[2]["key_id"] == key_id
    assert (lines[1]["before"]["canary_percent"], lines[1]["after"]["canary_percent"]) == (
        0.0, 40.0)


def test_docs_load_every_asset_from_the_app_itself(tmp_path):
    """/docs names no other host (it rendered blank offline with FastAPI's CDN links); every
    script, stylesheet and icon it names answers 200 without an API key."""
    import re

    c, _, _, _, _ = make_app(tmp_path)
    with c:
        html = c.get("/docs")
        assert html.status_code == 200
        assert not re.search(r"(?:src|href|url)\s*[=:]\s*['\"]https?://", html.text), html.text
        assets = re.findall(r"(?:src|href)=['\"](/[^'\"]+)['\"]", html.text)
        assert {a.rsplit("/", 1)[-1] for a in assets} >= {"swagger-ui-bundle.js",
                                                          "swagger-ui.css"}
        for a in assets:
            r = c.get(a)
            assert r.status_code == 200 and len(r.content) > 100, a
        assert c.get("/openapi.json").json()["info"]["title"] == "ragpilot"
