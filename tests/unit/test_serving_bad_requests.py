"""Bad requests against the ingress in-process (no Ray): every refusal is a 4xx with
`{"error", "field"}` naming what was wrong, and a refused request changes nothing (no variant
deployed, no routing row, no rollout evidence, no feedback the bandit learns).

Found by an audit of the HTTP API (stop 56): each case below failed before its fix (a 500, a
body in another shape, or a 4xx that had already changed state).
"""

from __future__ import annotations

import json
import sqlite3

from tests.support.rollout_reports import clean_batch as _report
from tests.unit.test_serving_ingress import CAND_ID, STABLE_ID, make_app

JSON = {"content-type": "application/json"}


def _shape(r, status: int, field: str) -> dict:
    assert r.status_code == status, r.text
    body = r.json()
    assert body["field"] == field and body["error"].startswith(f"{field}: "), body
    return body


def _routing_rows(tmp_path) -> int:
    with sqlite3.connect(tmp_path / "log.sqlite") as db:
        return db.execute("SELECT COUNT(*) FROM routing").fetchone()[0]


def test_non_finite_numbers_wrong_types_and_bad_text_are_422_never_500(tmp_path):
    c, admin, _, _, _ = make_app(tmp_path)
    with c:
        iid = c.post("/query", json={"question": "Who?"}).json()["interaction_id"]
        for raw in ("NaN", "Infinity", "-Infinity", "1e999", "true", '"0.5"'):
            body = f'{{"interaction_id": "{iid}", "reward": {raw}}}'.encode()
            _shape(c.post("/feedback", content=body, headers=JSON), 422, "reward")
        # nothing was stored: the interaction can still be rated once
        assert c.post("/feedback", json={"interaction_id": iid, "reward": 1.0}
                      ).status_code == 200
        _shape(c.post("/query", content=b'{"question": "\\ud800"}', headers=JSON), 422,
               "question")
        r = _shape(c.post("/query", content=b'{"question": "x", "k": NaN}', headers=JSON),
                   422, "k")
        assert all(set(d) == {"loc", "msg", "type"} for d in r["detail"])  # input not echoed
        _shape(c.post("/admin/traffic", content=b'{"canary_percent": 1e999}', headers={
            **JSON, **admin}), 422, "canary_percent")
        _shape(c.post("/admin/traffic", content=b'{"canary_config": {"temperature": NaN}}',
                      headers={**JSON, **admin}), 422, "canary_config")
        _shape(c.post("/admin/traffic", json={"canary_config": 5}, headers=admin), 422,
               "canary_config")  # not `canary_config.dict[str,any]`
        _shape(c.post("/tuner/evaluate", content=b'{"seed": 1e999}', headers={**JSON, **admin}),
               422, "seed")
        _shape(c.post("/tuner/evaluate", json={"allow_missing_gold": "yes"}, headers=admin),
               422, "allow_missing_gold")


def test_starlettes_own_errors_and_429_have_the_same_shape(tmp_path):
    c, admin, _, _, _ = make_app(tmp_path, limits={"rate_per_s": 0.01, "burst": 1})
    with c:
        _shape(c.get("/no/such/route", headers=admin), 404, "path")
        _shape(c.get("/query"), 405, "method")
        _shape(c.post("/query", content=b'{"question": "\xff\xfe"}', headers=JSON), 400, "body")
        assert c.post("/query", json={"question": "Who?"}).status_code == 200
        r = c.post("/query", json={"question": "Who?"})
        assert "rate limit" in _shape(r, 429, "client")["error"] and r.headers["Retry-After"]


def test_a_refused_traffic_change_deploys_nothing_and_changes_no_split(tmp_path):
    c, admin, _, stubs, ing = make_app(tmp_path)
    with c:
        before = (c.get("/admin/traffic", headers=admin).json(), set(ing.handles),
                  _routing_rows(tmp_path))
        refused = [({"canary_config": {"k": 3}, "shadow_config": "nope"}, 422, "shadow_config"),
                   ({"canary_config": {"k": 4}, "mode": "policy"}, 409, "mode"),
                   ({"canary_config": None, "canary_percent": 50}, 422, "canary_percent"),
                   ({"shadow_percent": 10}, 422, "shadow_percent"),
                   ({"canary_config": STABLE_ID, "canary_percent": 50}, 422, "canary_config"),
                   ({"canary_config": {"k": 5}}, 422, "canary_config"),  # == the stable's
                   ({"shadow_config": {"k": 6}, "stable": {"k": 6}}, 422, "shadow_config"),
                   ({"canary_config": {"generator": "no-such-gen"}}, 422,
                    "canary_config.generator"),
                   ({"canary_config": {"generator": "minilm"}}, 422, "canary_config.generator")]
        for body, status, field in refused:
            _shape(c.post("/admin/traffic", json=body, headers=admin), status, field)
        assert (c.get("/admin/traffic", headers=admin).json(), set(ing.handles),
                _routing_rows(tmp_path)) == before
        # the cap counts every variant a request adds, before adding any
        for k in (6, 7, 8, 9, 10, 11):
            ok = c.post("/admin/traffic", json={"canary_config": {"k": k}}, headers=admin)
            assert ok.status_code == 200, ok.text  # 2 + 6 = 8 variants: max_variants
        n = len(ing.handles)
        _shape(c.post("/admin/traffic", json={"canary_config": {"k": 12}}, headers=admin),
               409, "canary_config")
        assert len(ing.handles) == n == 8
        assert c.post("/admin/traffic", json={"canary_config": CAND_ID, "canary_percent": 30,
                                              "shadow_config": {"k": 6}, "shadow_percent": 5},
                      headers=admin).status_code == 200


def test_rollout_reports_are_checked_before_any_is_observed(tmp_path):
    c, admin, _, _, _ = make_app(tmp_path)
    state = tmp_path / "rollout" / "state.json"
    with c:
        assert c.post("/admin/rollout/start", json={"candidate": CAND_ID},
                      headers=admin).status_code == 200
        _shape(c.post("/admin/rollout/start", json={"candidate": CAND_ID}, headers=admin), 409,
               "force")
        _shape(c.post("/admin/rollout/start", json={"candidate": CAND_ID, "force": True,
                                                    "manifest_id": "../x\n"}, headers=admin),
               422, "manifest_id")
        good = _report("offline", 500, 500)
        bad = [({**good, "ci_low": "abc"}, "reports.0.ci_low"),
               ({**good, "ci_low": 0.9}, "reports.0.ci_low"),  # above ci_high
               ({**good, "diff_se": -1.0}, "reports.0.diff_se"),
               ({**good, "paired": "yes"}, "reports.0.paired"),
               ({**good, "gates": {"relevancy": "ok"}}, "reports.0.gates"),
               ({**good, "candidate": {**good["candidate"], "n": -5}}, "reports.0.candidate.n"),
               ({**good, "candidate": {**good["candidate"], "errors": 501}},
                "reports.0.candidate.errors"),
               ({**good, "candidate": {**good["candidate"], "bogus": 1}},
                "reports.0.candidate.bogus")]
        for rep, field in bad:
            _shape(c.post("/admin/rollout/advance", json={"reports": [rep]}, headers=admin),
                   422, field)
        _shape(c.post("/admin/rollout/advance", content=json.dumps(
            {"reports": [{**good, "ci_high": float("inf")}]}).encode(),
            headers={**JSON, **admin}), 422, "reports")
        assert json.loads(state.read_text())["stage"] == "candidate"
        r = c.post("/admin/rollout/advance", json={"reports": [good]}, headers=admin)
        assert r.json()["stage"] == "shadow", r.text
        # a good shadow report followed by a bad one: neither is observed
        shadow = _report("shadow", 10, 10)
        for second, field in (({**shadow, "kind": "canary"}, "reports.1.kind"),
                              ({**shadow, "diff": "x"}, "reports.1.diff")):
            _shape(c.post("/admin/rollout/advance", json={"reports": [shadow, second]},
                          headers=admin), 422, field)
            st = json.loads(state.read_text())
            assert st["stage"] == "shadow" and st["evidence"]["n"] == 0, st["evidence"]


def test_a_refused_rollback_leaves_the_split_alone(tmp_path):
    c, admin, _, _, _ = make_app(tmp_path)
    with c:
        c.post("/admin/rollout/start", json={"candidate": CAND_ID}, headers=admin)
        _shape(c.post("/admin/rollout/rollback", json={"reason": "   "}, headers=admin), 422,
               "reason")
        assert c.post("/admin/rollout/rollback", json={"reason": "bad"},
                      headers=admin).json()["stage"] == "rolled_back"
        split = {"canary_config": CAND_ID, "canary_percent": 30.0}
        assert c.post("/admin/traffic", json=split, headers=admin).status_code == 200
        rows = _routing_rows(tmp_path)
        _shape(c.post("/admin/rollout/rollback", json={"reason": "again"}, headers=admin), 409,
               "rollout")
        t = c.get("/admin/traffic", headers=admin).json()
        assert (t["canary"], t["canary_percent"]) == (CAND_ID, 30.0)
        assert _routing_rows(tmp_path) == rows


def test_feedback_on_a_failed_request_is_refused_and_not_learned(tmp_path):
    from serving.app import _LocalMethod

    c, admin, _, _, ing = make_app(tmp_path, traffic={"mode": "bandit"})

    def boom(*_a, **_k):
        raise RuntimeError("boom")

    with c:
        for h in ing.handles.values():
            h.answer = _LocalMethod(boom)
        r = c.post("/query", json={"question": "Who?"})
        assert r.status_code == 502
        iid = r.json()["error"].split("interaction ")[1].split()[0]
        _shape(c.post("/feedback", json={"interaction_id": iid, "reward": 1.0}), 409,
               "interaction_id")
        board = c.get("/rl/leaderboard").json()
        assert all(a["pulls"] == 0 for arms in board["bandit"].values() for a in arms), board
        assert c.get("/rl/stats").json()["store"]["feedback"] == 0



def test_rollout_start_refuses_a_hash_nothing_serves(tmp_path):
    """A stable or candidate id no deployment serves is a 404 naming the field, listing what is
    served; no rollout state is written, and a served pair then starts."""
    c, admin, stubs, _, _ = make_app(tmp_path)
    state = tmp_path / "rollout" / "state.json"
    with c:
        for body, field in (({"candidate": CAND_ID, "stable": "ffffffffffff"}, "stable"),
                            ({"candidate": "ffffffffffff", "stable": STABLE_ID}, "candidate"),
                            ({"candidate": "ffffffffffff"}, "candidate")):
            err = _shape(c.post("/admin/rollout/start", json=body, headers=admin), 404,
                         field)["error"]
            assert "ffffffffffff" in err and STABLE_ID in err and CAND_ID in err, err
            assert not state.exists()
        r = c.post("/admin/rollout/start", json={"candidate": CAND_ID, "stable": STABLE_ID},
                   headers=admin)
        assert r.status_code == 200 and r.json()["stage"] == "candidate", r.text
        assert state.exists()
