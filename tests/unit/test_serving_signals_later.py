"""The reference-free signals of a gold-less answer are scored after the reply
(serving.routes_query._score_later), in-process (`serving.app.local_app`, no Ray): the user's
answer does not wait for them, the stored row gets them afterwards, and a row left unscored
(scoring queue full) is counted, and read by the rollout's evidence as quality `none`."""

from __future__ import annotations

import math
import threading
import time

from fastapi.testclient import TestClient

from rag.config import RAGConfig

BASE = {"generator": "extractive"}
STABLE_ID = RAGConfig(**BASE).config_hash
SIGNALS = {"sig_relevancy": 0.5, "sig_faithfulness": 0.25, "sig_combined": 0.625}


class GoldlessStub:
    """A replica answering a question without gold: the record carries `signal_input`;
    `signals` blocks until `release` is set (a slow scorer)."""

    def __init__(self):
        self.release = threading.Event()
        self.scored: list[dict] = []

    def answer(self, question: str, query_id: str = "q") -> dict:
        return {"answer": "Paris [1]", "citations": [1], "cited_ids": ["p1"],
                "context_ids": ["p1"], "latency_ms": {"retrieve": 1.0, "generate": 0.5},
                "tokens_in": 10, "tokens_out": 2, "variant_id": STABLE_ID, "scores": None,
                "gold_category": None,
                "signal_input": {"question": question, "text": "Paris [1]", "citations": [1],
                                 "contexts": [{"id": "p1", "title": "T", "text": "Paris."}]}}

    def signals(self, payload: dict) -> dict:
        assert self.release.wait(20), "signals never released"
        self.scored.append(payload)
        return {"scores": dict(SIGNALS), "ms": 7.5}

    def info(self) -> dict:
        return {"variant_id": STABLE_ID}


def _app(tmp_path):
    from serving.app import _servable_dependency, api, local_app
    from serving.store import open_store

    stub = GoldlessStub()
    app = local_app({"store_url": str(tmp_path / "log.sqlite"), "base": BASE,
                     "auth": {"enabled": False}}, services={STABLE_ID: stub})
    inst = api.dependency_overrides[_servable_dependency()]()
    return TestClient(app), stub, inst, open_store(str(tmp_path / "log.sqlite"))


def test_the_answer_is_sent_before_its_signals_and_the_row_gets_them_after(tmp_path):
    c, stub, inst, store = _app(tmp_path)
    with c:
        t0 = time.perf_counter()
        r = c.post("/query", json={"question": "Where is the secret base?", "user_id": "u"})
        waited = time.perf_counter() - t0
        assert r.status_code == 200 and "signals" not in r.json()["latency_ms"]
        iid = r.json()["interaction_id"]
        assert not stub.release.is_set() and waited < 15  # answered while scoring blocks
        row = store.get_interaction(iid)  # stored (acknowledged) before its signals
        assert row is not None and "sig_combined" not in (row["scores"] or {})
        assert c.get("/rl/stats").json()["signals"] == {"pending": 1, "skipped": 0}
        stub.release.set()
        deadline = time.time() + 20
        while time.time() < deadline and "sig_combined" not in (
                store.get_interaction(iid)["scores"] or {}):
            time.sleep(0.05)
        row = store.get_interaction(iid)
        assert {k: row["scores"][k] for k in SIGNALS} == SIGNALS
        assert row["latency_ms"]["signals"] == 7.5
        assert stub.scored[0]["question"] == "Where is the secret base?"
        assert c.get("/rl/stats").json()["signals"] == {"pending": 0, "skipped": 0}


def test_a_full_scoring_queue_leaves_the_row_unscored_counted_and_judged_on_none(
        tmp_path, monkeypatch):
    import serving.routes_query as rq
    from rl.promotion.log_evaluators import scored_quality

    monkeypatch.setattr(rq, "MAX_PENDING_SIGNALS", 0)
    c, stub, _, store = _app(tmp_path)
    stub.release.set()
    with c:
        r = c.post("/query", json={"question": "Where is the secret base?", "user_id": "u"})
        assert r.status_code == 200
        assert c.get("/rl/stats").json()["signals"] == {"pending": 0, "skipped": 1}
    row = store.get_interaction(r.json()["interaction_id"])
    assert stub.scored == [] and "sig_combined" not in (row["scores"] or {})
    (q,), source = scored_quality([row])
    assert source == "none" and math.isnan(q)  # left out of quality, not a zero
