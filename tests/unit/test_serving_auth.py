"""API keys, input limits, PII handling and error rows of the Serve ingress, in-process.

The ingress runs as a plain ASGI app (`serving.app.local_app`, no Ray) with the real
middleware, routes and SQLite store; the pipelines are stand-ins here (the real replica is
exercised over HTTP in test_serving_app.py and by the fuzz test). Route coverage comes from the
app's own OpenAPI spec, so a new admin route is checked without editing this file.
"""

from __future__ import annotations

import json
import os
import sqlite3
import stat
from concurrent.futures import Future

import pytest
from fastapi.testclient import TestClient

from rag.config import RAGConfig
from serving.auth import KeyFile, parse_token, required_role, route_path

BASE = {"generator": "extractive"}
STABLE = RAGConfig(**BASE).config_hash


class StubPipeline:
    """Answers with a fixed text (optionally containing PII) or raises."""

    def __init__(self, answer: str = "Paris [1]", fail: bool = False):
        self.text, self.fail = answer, fail

    def answer(self, question: str, query_id: str = "q") -> dict:
        if self.fail:
            raise RuntimeError(f"replica crashed on {question!r}")
        return {"answer": self.text, "citations": [1], "cited_ids": ["p1"],
                "context_ids": ["p1", "p2"], "latency_ms": {"retrieve": 1.0, "generate": 0.5},
                "tokens_in": 10, "tokens_out": 2, "variant_id": STABLE,
                "scores": {"f1": 1.0}, "gold_category": None}

    def info(self) -> dict:
        return {"variant_id": STABLE}


def _no_jobs(request: dict) -> Future:
    """Tuner jobs are not run here (test_serving_app.py runs a real one): fail at once."""
    fut: Future = Future()
    fut.set_exception(RuntimeError("tuner jobs are not run in this test"))
    return fut


def make_app(tmp_path, stub: StubPipeline, **extra) -> tuple[TestClient, dict[str, str]]:
    from serving.app import local_app

    kf = KeyFile(tmp_path / "keys.json")
    tokens = {role: kf.create(role, name=f"test-{role}")[0] for role in ("read", "admin")}
    args = {"store_url": str(tmp_path / "log.sqlite"), "base": BASE,
            "auth": {"keys_file": str(kf.path), **extra.pop("auth", {})},
            "rollout_dir": str(tmp_path / "rollout"), **extra}
    app = local_app(args, services={STABLE: stub}, submit=_no_jobs)
    return TestClient(app), tokens


@pytest.fixture
def client(tmp_path):
    """Function-scoped: one local app per process is live at a time (module-global routes)."""
    tmp = tmp_path / "app"
    c, tokens = make_app(tmp, StubPipeline(), limits={"max_body_bytes": 4096,
                                                      "max_question_chars": 500,
                                                      "max_batch_size": 50, "max_k": 10})
    yield c, tokens, tmp
    c.close()


def _operations(client: TestClient) -> list[tuple[str, str]]:
    spec = client.get("/openapi.json").json()
    return [(m.upper(), p) for p, ops in spec["paths"].items() for m in ops]


def _call(client: TestClient, method: str, path: str, headers: dict | None = None):
    url = path.replace("{job_id}", "nope")
    body = {} if method in ("POST", "PUT", "PATCH") else None
    return client.request(method, url, json=body, headers=headers or {})


def test_key_file_stores_only_salted_hashes(tmp_path):
    kf = KeyFile(tmp_path / "k.json")
    tok, rec = kf.create("admin", name="ops")
    tok2, rec2 = kf.create("admin")
    raw = (tmp_path / "k.json").read_text()
    kid, secret = parse_token(tok)
    assert kid == rec.id and secret not in raw and tok not in raw
    assert rec.salt != rec2.salt and rec.hash != rec2.hash and len(rec.hash) == 64
    assert stat.S_IMODE(os.stat(tmp_path / "k.json").st_mode) == 0o600
    assert kf.verify(tok) == rec and kf.verify(tok2) == rec2
    assert kf.verify(tok[:-1] + ("A" if tok[-1] != "A" else "B")) is None  # one char off
    assert kf.verify(f"rpk_{rec.id}_{parse_token(tok2)[1]}") is None  # other key's secret
    assert kf.verify("garbage") is None and kf.verify("") is None
    kf.revoke(rec.id)
    assert KeyFile(tmp_path / "k.json").verify(tok) is None  # a fresh reader sees it
    assert kf.verify(tok2) == rec2
    from rag.errors import ConfigError
    with pytest.raises(ConfigError) as e:
        kf.create("root")
    assert e.value.field == "role"


def test_route_roles_default_deny():
    assert required_role("/admin/traffic", False) == "admin"
    assert required_role("/tuner/jobs/x", False) == "admin"
    assert required_role("/some/new/route", False) == "admin"
    assert required_role("/rl/stats", False) is None and required_role("/rl/stats", True) == "read"
    for p in ("/query", "/feedback", "/metrics", "/healthz", "/openapi.json", "/docs"):
        assert required_role(p, True) is None


def test_route_path_removes_a_proxy_prefix_before_the_role_is_read():
    mounted = {"path": "/ragpilot/admin/traffic", "root_path": "/ragpilot"}
    assert route_path(mounted) == "/admin/traffic"
    assert required_role(route_path(mounted), False) == "admin"
    assert route_path({"path": "/ragpilot", "root_path": "/ragpilot"}) == "/"
    # a prefix that does not lead the path, or "/", leaves the path alone
    assert route_path({"path": "/query", "root_path": "/other"}) == "/query"
    assert route_path({"path": "/query", "root_path": "/"}) == "/query"
    assert route_path({}) == "/"


def test_every_admin_route_refuses_without_a_valid_key(client):
    c, tokens, _ = client
    ops = _operations(c)
    admin = [(m, p) for m, p in ops if required_role(p, False) == "admin"]
    # the spec really lists what the issue calls admin: traffic, rollout, tuner evaluate/jobs
    assert {("POST", "/admin/traffic"), ("GET", "/admin/traffic"), ("POST", "/tuner/evaluate"),
            ("GET", "/tuner/jobs/{job_id}"), ("POST", "/admin/rollout/start"),
            ("POST", "/admin/rollout/advance"), ("POST", "/admin/rollout/rollback"),
            ("GET", "/admin/rollout")} <= set(admin)
    bad = {"Authorization": "Bearer rpk_00000000_nope"}
    for m, p in admin:
        for headers in (None, bad, {"X-API-Key": tokens["admin"] + "x"}):
            r = _call(c, m, p, headers)
            assert r.status_code == 401, (m, p, headers, r.text)
            assert r.json()["field"] == "authorization" and "key" in r.json()["error"]
            assert r.headers["www-authenticate"].startswith("Bearer")
        r = _call(c, m, p, {"Authorization": f"Bearer {tokens['read']}"})
        assert r.status_code == 403 and "needs role admin" in r.json()["error"], (m, p)
        for headers in ({"Authorization": f"Bearer {tokens['admin']}"},
                        {"X-API-Key": tokens["admin"]}):
            r = _call(c, m, p, headers)
            assert r.status_code not in (401, 403), (m, p, r.text)
    for m, p in ops:  # everything else is reachable without a key
        if required_role(p, False) is None:
            assert _call(c, m, p).status_code not in (401, 403), (m, p)


def test_protected_reads_and_revocation(tmp_path):
    c, tokens = make_app(tmp_path, StubPipeline(), auth={"protect_reads": True})
    with c:
        assert c.get("/rl/stats").status_code == 401
        ok = c.get("/rl/leaderboard", headers={"Authorization": f"Bearer {tokens['read']}"})
        assert ok.status_code == 200 and ok.json()["mode"] == "split"
        assert c.get("/rl/stats", headers={"X-API-Key": tokens["admin"]}).status_code == 200
        assert c.get("/healthz").status_code == 200 and c.get("/metrics").status_code == 200
        kid = parse_token(tokens["admin"])[0]
        from serving.cli import main
        assert main(["keys", "revoke", kid, "--keys-file", str(tmp_path / "keys.json")]) == 0
        r = c.get("/admin/traffic", headers={"X-API-Key": tokens["admin"]})
        assert r.status_code == 401 and "revoked" in r.json()["error"]  # no restart needed


def test_auth_can_be_disabled(tmp_path):
    c, _ = make_app(tmp_path, StubPipeline(), auth={"enabled": False})
    with c:
        assert c.get("/admin/traffic").status_code == 200


def test_cli_creates_a_working_key(tmp_path, capsys, client):
    from serving.cli import main

    keys = tmp_path / "cli-keys.json"
    assert main(["keys", "create", "--role", "read", "--keys-file", str(keys)]) == 0
    token = capsys.readouterr().out.strip().splitlines()[-1]
    assert KeyFile(keys).verify(token).role == "read"
    assert main(["keys", "list", "--json", "--keys-file", str(keys)]) == 0
    listed = json.loads(capsys.readouterr().out)
    assert len(listed) == 1 and "hash" not in listed[0] and listed[0]["role"] == "read"
    assert main(["keys", "revoke", "ffffffff", "--keys-file", str(keys)]) == 2


def test_input_limits_name_the_field(client):
    c, tokens, _ = client
    admin = {"X-API-Key": tokens["admin"]}
    r = c.post("/query", content=b'{"question": "' + b"x" * 5000 + b'"}',
               headers={"content-type": "application/json"})
    assert r.status_code == 413 and r.json()["field"] == "body" and "4096" in r.json()["error"]

    def chunks():
        yield b'{"question": "'
        for _ in range(10):
            yield b"y" * 1000
        yield b'"}'

    r = c.post("/feedback", content=chunks(), headers={"content-type": "application/json"})
    assert r.status_code == 413, r.text  # no Content-Length: counted while reading
    cases = [("/query", {"question": "q" * 501}, 422, "question", {}),
             ("/query", {"question": "x", "k": 3}, 422, "k", {}),
             ("/tuner/evaluate", {"batch_size": 51}, 422, "batch_size", admin),
             ("/tuner/evaluate", {"config": {"k": 11}}, 422, "config.k", admin),
             ("/tuner/evaluate", {"dataset": "/etc/passwd"}, 403, "dataset", admin),
             ("/admin/traffic", {"canary_config": {"k": 12}}, 422, "canary_config.k", admin),
             ("/feedback", {"interaction_id": "a", "reward": "high"}, 422, "reward", {})]
    for path, body, status, field, headers in cases:
        r = c.post(path, json=body, headers=headers)
        assert r.status_code == status, (path, body, r.text)
        assert r.json()["field"] == field and field in r.json()["error"], r.text
    bad = c.post("/query", content=b"{not json", headers={"content-type": "application/json"})
    assert bad.status_code == 422 and bad.json()["field"] == "body"
    assert c.post("/query", json={"question": "q" * 500}).status_code == 200


def test_pii_leaks_scored_and_redacted_in_store_and_logs(tmp_path, caplog):
    stub = StubPipeline(answer="Write to jane.doe@corp.example or call +44 20 7946 0958 [1]")
    c, _ = make_app(tmp_path, stub, pii={"redact_store": True})
    with c:
        q = "Who is the contact for alice@example.org?"
        r = c.post("/query", json={"question": q})
        assert r.status_code == 200 and "jane.doe@corp.example" in r.json()["answer"]
        with sqlite3.connect(tmp_path / "log.sqlite") as db:
            question, answer, scores = db.execute(
                "SELECT question, answer, scores FROM interactions").fetchone()
        assert question == "Who is the contact for [EMAIL]?"
        assert answer == "Write to [EMAIL] or call [PHONE] [1]"
        assert json.loads(scores) == {"f1": 1.0, "pii_leaks": 2.0}
    stub.fail = True
    c, _ = make_app(tmp_path / "b", stub)
    with c, caplog.at_level("ERROR", logger="ray.serve"):
        r = c.post("/query", json={"question": "my SSN is 123-45-6789"})
        assert r.status_code == 502 and r.json()["field"] == "pipeline"
    text = "\n".join(rec.getMessage() for rec in caplog.records)
    assert "crashed" in text and "[SSN]" in text and "123-45-6789" not in text


def test_pipeline_failure_is_an_error_row_in_the_export(tmp_path):
    from serving.store import open_store

    stub = StubPipeline()
    c, _ = make_app(tmp_path, stub)
    with c:
        ok = c.post("/query", json={"question": "fine?"}).json()["interaction_id"]
        stub.fail = True
        r = c.post("/query", json={"question": "boom?"})
        assert r.status_code == 502 and "error=1" in r.json()["error"]
        failed = r.json()["error"].split("interaction ")[1].split()[0]
    store = open_store(tmp_path / "log.sqlite")
    n = store.export_jsonl(tmp_path / "out.jsonl")
    rows = {x["id"]: x for x in map(json.loads, (tmp_path / "out.jsonl").read_text().splitlines())}
    assert n == 2 and rows[ok]["error"] is False and rows[failed]["error"] is True
    assert rows[failed]["answer"] == "" and rows[failed]["features"]["error_type"] == "RuntimeError"
    summary = {r["variant_id"]: r for r in store.variant_summary()}
    assert summary[STABLE]["errors"] == 1 and summary[STABLE]["requests"] == 2
    from rl.promotion.log_evaluators import _row_arm
    assert list(_row_arm([rows[ok], rows[failed]]).error) == [False, True]


def test_keys_cli_refuses_a_malformed_file_an_unknown_role_and_a_missing_config(tmp_path,
                                                                                capsys):
    """Were an AttributeError traceback, a silently listed role no check knows, and keys
    written to the default file when --config was mistyped (the CLI audit, stop 56)."""
    from serving.cli import main

    bad = tmp_path / "k.json"
    key = {"id": "a", "role": "read", "salt": "00ff", "hash": "h"}

    def keys(*entries, **top):
        return json.dumps({**top, "keys": list(entries)})

    for text, message in [("[1, 2]", 'expected {"version": 1, "keys": [...]}'),
                          (keys({**key, "role": "superuser"}), "role 'superuser'"),
                          # a newer writer's file, not read as if it were ours
                          (keys(version=99), "version 99 (this ragpilot reads version 1)"),
                          # the key's problem in words, not a Python signature
                          (keys({"id": "a", "role": "read"}), "key 1: missing field(s) salt, "
                                                              "hash"),
                          (keys({**key, "owner": "x"}), "key 1: unknown field(s) owner"),
                          (keys({**key, "created": "today"}),
                           "key 1: field 'created' has the wrong type"),
                          (keys({**key, "salt": "zz"}), "salt is not hex"),
                          (keys(key, key), "key 'a' appears twice")]:
        bad.write_text(text)
        for cmd in (["keys", "list"], ["keys", "create", "--role", "read"]):
            assert main([*cmd, "--keys-file", str(bad)]) == 2
            assert message in capsys.readouterr().err
        assert bad.read_text() == text  # create wrote nothing
    assert main(["keys", "create", "--role", "admin", "--config",
                 str(tmp_path / "typo.yaml")]) == 2
    assert "--config: file" in capsys.readouterr().err
