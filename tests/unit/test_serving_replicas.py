"""Two ingress replicas over one store answer the same (serving.replica_sync): the same canary
share and per-user route after a routing change made on either, no feedback lost whichever
replica took it, the same bandit statistics, a variant added on one served by the other, and
one rate-limit bucket per client across replicas (serving.shared_limits).

The replicas are two `Ingress` objects in this process (no Ray) sharing a SQLite store, the
pipelines stand-ins: what differs between Serve replicas is exactly their memory.
"""

from __future__ import annotations

import asyncio

import pytest
from starlette.requests import Request

from rag.config import RAGConfig
from serving.schemas import FeedbackRequest, QueryRequest, TrafficRequest

BASE = {"generator": "extractive"}
CANDIDATE = {"variant": "bm25"}
STABLE_ID = RAGConfig(**BASE).config_hash
CAND_ID = RAGConfig(**BASE, **CANDIDATE).config_hash


class Stub:
    def __init__(self, variant: str):
        self.variant = variant

    def answer(self, question: str, query_id: str = "q") -> dict:
        return {"answer": "Paris [1]", "citations": [1], "cited_ids": ["p1"],
                "context_ids": ["p1"], "latency_ms": {"retrieve": 1.0}, "tokens_in": 5,
                "tokens_out": 2, "variant_id": self.variant, "scores": None,
                "gold_category": None}

    def info(self) -> dict:
        return {"variant_id": self.variant}


def replica(tmp_path, **extra):
    """One Ingress object over the store in `tmp_path` (what one Serve replica holds)."""
    from serving.app import Ingress, LocalHandle

    args = {"store_url": str(tmp_path / "log.sqlite"), "base": BASE, "canary": CANDIDATE,
            "auth": {"enabled": False, "keys_file": str(tmp_path / "keys.json")},
            "traffic": {"canary_percent": 0.0},
            "ingress": {"replicas": 2, "sync_interval_s": 0.0},
            "limits": {"rate_per_s": 1e6, "burst": 1e6}, **extra}
    from serving.schemas import ServeSettings

    s = ServeSettings.from_args(args)
    configs = {STABLE_ID: s.config({}), CAND_ID: s.config(CANDIDATE)}
    cls = next(b for b in Ingress.func_or_class.__mro__[1:] if "__init__" in b.__dict__)
    inst = cls.__new__(cls)
    cls.__init__(inst, s.model_dump(mode="json"),
                 {h: LocalHandle(Stub(h)) for h in configs},
                 {"stable": STABLE_ID, "canary": CAND_ID, "shadow": None},
                 {h: c.model_dump(mode="json") for h, c in configs.items()})
    inst._deploy = lambda cfg: LocalHandle(Stub(cfg.config_hash))
    return inst


def http_request(client: str = "10.0.0.1") -> Request:
    return Request({"type": "http", "headers": [], "client": (client, 1234),
                    "method": "POST", "path": "/"})


def ask(inst, user: str, category: str | None = None):
    return asyncio.run(inst._answer(QueryRequest(question="Who?", user_id=user,
                                                 category=category)))


def routes(inst, users: list[str]) -> list[str]:
    """The route of one question per user, asked in turn on one event loop (as a replica
    serves them; `ask` starts a loop per request, most of the time of 2,000 requests)."""
    async def all_of():
        return [(await inst._answer(QueryRequest(question="Who?", user_id=u))).route
                for u in users]

    return asyncio.run(all_of())


def test_two_replicas_give_the_same_canary_share_after_a_change_on_one(tmp_path):
    a, b = replica(tmp_path), replica(tmp_path)
    asyncio.run(a._set_traffic(TrafficRequest(canary_percent=10.0)))
    users = [f"user-{i}" for i in range(2000)]
    on_a = [r == "canary" for r in routes(a, users)]
    on_b = [r == "canary" for r in routes(b, users)]  # b adopted a's split from the store
    share_a, share_b = sum(on_a) / len(users), sum(on_b) / len(users)
    assert abs(share_a - 0.10) <= 0.02 and abs(share_a - share_b) * 100 <= 2.0
    assert on_a == on_b  # the same user lands on the same side whichever replica answers
    asyncio.run(b._set_traffic(TrafficRequest(canary_percent=0.0)))
    assert set(routes(a, users[:200])) == {"stable"}


def test_feedback_through_either_replica_is_stored_and_learned_by_both(tmp_path):
    a, b = replica(tmp_path), replica(tmp_path)
    asyncio.run(a._set_traffic(TrafficRequest(mode="bandit")))
    acked = 0
    for i in range(60):
        served, rater = (a, b) if i % 2 else (b, a)  # feedback reaches the other replica
        r = ask(served, f"u{i}", category="bridge" if i % 3 else "comparison")
        assert r.route == "bandit"
        reward = 1.0 if r.variant_id == CAND_ID else 0.2
        out = asyncio.run(rater._feedback(FeedbackRequest(interaction_id=r.interaction_id,
                                                          reward=reward), http_request()))
        acked += out["stored"]
    assert a.store.counts()["feedback"] == acked == 60  # none lost
    asyncio.run(a._sync_state(force=True))
    asyncio.run(b._sync_state(force=True))
    for cat in ("bridge", "comparison"):
        assert a.router.leaderboard(cat) == b.router.leaderboard(cat)
    pulls = sum(row["pulls"] for cat in ("bridge", "comparison")
                for row in a.router.leaderboard(cat)[cat])
    assert pulls == 60  # each feedback learned exactly once per replica
    c = replica(tmp_path)  # a replica started later replays the same history
    assert c.router.leaderboard("bridge") == a.router.leaderboard("bridge")


def test_a_variant_added_on_one_replica_is_served_by_the_other(tmp_path):
    a, b = replica(tmp_path), replica(tmp_path)
    new = {"variant": "dense", "k": 4}
    new_id = RAGConfig(**BASE, **new).config_hash
    asyncio.run(a._set_traffic(TrafficRequest(canary_config=new, canary_percent=100.0)))
    assert new_id in a.handles and new_id not in b.handles
    r = ask(b, "someone")
    assert r.variant_id == new_id and r.route == "canary"
    assert b.configs[new_id]["k"] == 4


def test_rate_limit_bucket_is_shared_by_the_replicas(tmp_path):
    from serving.schemas import ApiError

    a = replica(tmp_path, limits={"rate_per_s": 0.01, "burst": 3})
    b = replica(tmp_path, limits={"rate_per_s": 0.01, "burst": 3})
    req = http_request("10.9.9.9")
    for inst in (a, b, a):
        asyncio.run(inst._rate_limit(req))
    for inst in (a, b):  # the 4th request is refused whichever replica gets it
        with pytest.raises(ApiError) as err:
            asyncio.run(inst._rate_limit(req))
        assert err.value.status == 429 and int(err.value.headers["Retry-After"]) >= 1
    asyncio.run(b._rate_limit(http_request("10.9.9.10")))  # another client: its own bucket
    assert (tmp_path / "log.limits.sqlite").exists()  # beside the log, not in it


def test_one_replica_keeps_the_in_memory_limiter(tmp_path):
    from serving.limits import TokenBucketLimiter
    from serving.shared_limits import StoreTokenBucket

    assert isinstance(replica(tmp_path, ingress={"replicas": 1}).limiter, TokenBucketLimiter)
    assert isinstance(replica(tmp_path).limiter, StoreTokenBucket)


def test_concurrent_requests_wait_for_the_sync_in_flight(tmp_path):
    """Once the state is older than sync_interval_s, every request arriving together waits for
    the one sync pass and routes on the newest split (none on the split being replaced)."""
    import time

    a = replica(tmp_path, ingress={"replicas": 2, "sync_interval_s": 0.2})
    b = replica(tmp_path, ingress={"replicas": 2, "sync_interval_s": 0.2})
    asyncio.run(a._set_traffic(TrafficRequest(canary_percent=100.0)))
    time.sleep(0.25)

    async def burst():
        return await asyncio.gather(*(b._answer(QueryRequest(question="Who?", user_id=f"u{i}"))
                                      for i in range(16)))

    assert [r.route for r in asyncio.run(burst())] == ["canary"] * 16


def test_a_request_arriving_while_a_sync_runs_waits_for_it(tmp_path):
    """A sync pass marks the state fresh when it starts; a request arriving while it still runs
    must wait for it, not route on the split it is replacing (the scale-out test saw one such
    request serve the old canary right after a routing change)."""
    import time

    a = replica(tmp_path, ingress={"replicas": 2, "sync_interval_s": 0.2})
    b = replica(tmp_path, ingress={"replicas": 2, "sync_interval_s": 0.2})
    asyncio.run(a._set_traffic(TrafficRequest(canary_percent=100.0)))
    time.sleep(0.25)
    read = b.store.last_routing

    def slow_read():
        time.sleep(0.3)
        return read()

    b.store.last_routing = slow_read

    async def late_arrival():
        first = asyncio.ensure_future(b._answer(QueryRequest(question="Who?", user_id="u0")))
        await asyncio.sleep(0.1)  # the pass has started in its thread and is still reading
        assert time.monotonic() - b._sync_at < 0.2  # so the state reads fresh
        second = await b._answer(QueryRequest(question="Who?", user_id="u1"))
        return [await first, second]

    assert [r.route for r in asyncio.run(late_arrival())] == ["canary", "canary"]


def test_admin_reads_on_a_quiet_replica_show_a_change_made_on_another(tmp_path):
    """No query reaches `b` (its throttled sync never runs on a request path): its
    /admin/traffic, /rl/stats and /rl/leaderboard still show `a`'s change, well within 1 s."""
    import time

    a = replica(tmp_path, ingress={"replicas": 2, "sync_interval_s": 10.0})
    b = replica(tmp_path, ingress={"replicas": 2, "sync_interval_s": 10.0})
    assert asyncio.run(b._get_traffic())["canary_percent"] == 0.0
    asyncio.run(a._set_traffic(TrafficRequest(canary_percent=35.0, mode="bandit")))
    t0 = time.perf_counter()
    assert asyncio.run(b._get_traffic())["canary_percent"] == 35.0
    assert asyncio.run(b._stats())["traffic"]["canary_percent"] == 35.0
    assert asyncio.run(b._leaderboard())["mode"] == "bandit"
    assert time.perf_counter() - t0 < 1.0


def test_metrics_of_either_replica_count_both(tmp_path):
    """Each replica publishes its counters to the store; /metrics on either serves both,
    labelled by replica, so their sum is every request whichever replica took it."""
    from prometheus_client.parser import text_string_to_metric_families

    a, b = replica(tmp_path), replica(tmp_path)
    a.publisher.replica, b.publisher.replica = "host:1", "host:2"  # one process here
    for inst, n in ((a, 3), (b, 5)):
        for _ in range(n):
            inst.metrics.request("query", 200)
    for inst in (a, b):  # each replica's tick (its thread runs one a second)
        inst.publisher.stop()
        inst.publisher.publish()
    for inst in (a, b):
        text = asyncio.run(inst._metrics_endpoint()).body.decode()
        rows = {(s.labels["replica"], s.labels["status"]): s.value
                for fam in text_string_to_metric_families(text) for s in fam.samples
                if s.name == "ragpilot_requests_total" and s.labels["endpoint"] == "query"}
        assert rows[("host:1", "2xx")] == 3 and rows[("host:2", "2xx")] == 5
        assert rows[("host:1", "5xx")] == 0  # a sample before the first error
        rejected = [s for fam in text_string_to_metric_families(text) for s in fam.samples
                    if s.name == "ragpilot_rejected_total"]
        assert {s.labels["reason"] for s in rejected} == {"queue_full", "rate_limit"}
        assert all(s.value == 0 for s in rejected)


def test_request_and_admin_log_lines(tmp_path):
    """One JSON line per request (interaction id, variant, route, latency, status; no question
    text) and per admin action (key id, action, split before and after), in the replica's own
    file beside the store."""
    import json

    from serving.request_log import begin, note

    a = replica(tmp_path)
    a.request_log.replica = "host:1"
    r = ask(a, "u1")
    a.request_log.request("POST", "/query", 200, 12.5, {"interaction_id": r.interaction_id,
                                                        "variant": r.variant_id})
    async def admin_change():
        begin()
        note(key_id="k123")
        await a._set_traffic(TrafficRequest(canary_percent=25.0))

    asyncio.run(admin_change())
    lines = [json.loads(x) for x in a.request_log.path.read_text().splitlines()]
    assert a.request_log.path.parent == tmp_path / "logs"
    req = next(x for x in lines if x["kind"] == "request")
    assert (req["status"], req["latency_ms"], req["interaction_id"]) == (200, 12.5,
                                                                         r.interaction_id)
    assert "question" not in req
    adm = next(x for x in lines if x["kind"] == "admin")
    assert (adm["action"], adm["key_id"]) == ("admin/traffic", "k123")
    assert adm["before"]["canary_percent"] == 0.0 and adm["after"]["canary_percent"] == 25.0


def test_rate_limit_client_behind_a_trusted_proxy_is_the_forwarded_address(tmp_path):
    """Two users behind one load balancer get their own buckets; X-Forwarded-For from an
    untrusted address is ignored (anyone can write that header)."""
    inst = replica(tmp_path, limits={"rate_per_s": 1e6, "burst": 1e6,
                                     "trusted_proxies": ["10.0.0.0/24"]})

    def req(peer: str, forwarded: str | None) -> Request:
        headers = [(b"x-forwarded-for", forwarded.encode())] if forwarded else []
        return Request({"type": "http", "headers": headers, "client": (peer, 1234),
                        "method": "POST", "path": "/query"})

    assert inst.client_id(req("10.0.0.9", "203.0.113.5")) == "ip:203.0.113.5"
    assert inst.client_id(req("10.0.0.9", "203.0.113.6")) == "ip:203.0.113.6"
    # the nearest hop that is not a trusted proxy (a client-written first entry is skipped)
    assert inst.client_id(req("10.0.0.9", "6.6.6.6, 203.0.113.7, 10.0.0.4")) == \
        "ip:203.0.113.7"
    assert inst.client_id(req("198.51.100.1", "203.0.113.5")) == "ip:198.51.100.1"
    assert inst.client_id(req("10.0.0.9", None)) == "ip:10.0.0.9"
