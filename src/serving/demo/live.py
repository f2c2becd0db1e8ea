"""The demo's live stages: the Serve app on 127.0.0.1 (stable = default, canary = tuned),
simulated users, and the promotion loop driven by `rl.promotion.service`.

    with local_app(args, port) as (url, admin_key): ...   # Serve + Ray stopped on any exit
    users = SimulatedUsers(url, examples, seed)           # bounded, loopback only, seeded
    loop = PromotionLoop(state_dir, url, admin_key, users, settings)
    loop.start(tuned, default, offline_report); loop.run(max_requests)

The promotion decisions are the state machine's (`rl.promotion`): this module feeds it evidence
(the offline holdout report, then the app's own interaction store after each batch of
simulated requests, as `ragpilot rollout advance` reads it: rows since the last batch, each
judged per metric, quality paired on the mirrored requests of shadow) and applies the split
each stage asks for through `POST /admin/traffic`.
"""

from __future__ import annotations

import random
import socket
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

from rag.errors import ConfigError

BATCH = 20
"""Simulated requests between two looks at the evidence (one batch report each)."""
THUMBS_UP_F1 = 0.5
"""A simulated user gives thumbs up (reward 1) when the answer's F1 against gold is at least
this, thumbs down (0) otherwise."""
LOOPBACK = ("127.0.0.1", "localhost", "::1")


def check_port(port: int, host: str = "127.0.0.1") -> None:
    """ConfigError `port` naming the port when something already listens on host:port."""
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host, port))
        except OSError as exc:
            raise ConfigError("port", f"{host}:{port} is busy ({exc.strerror}); stop what "
                                      f"listens there or pick another port with --port") from None


@contextmanager
def local_app(args: dict[str, Any], port: int, private_netns: bool = False):
    """Ray + Serve + the ragpilot app on 127.0.0.1:`port` in this process; yields (url, admin
    API key). `serve.shutdown()` and `ray.shutdown()` run on every exit, Ctrl-C included."""
    from serving.auth import KeyFile
    from serving.launch import start_local, stop_local

    check_port(port)
    token, _ = KeyFile(args["auth"]["keys_file"]).create("admin", name="ragpilot-demo")
    try:
        url = start_local(args, port=port, private_netns=private_netns)
        yield url, token
    finally:
        stop_local()


def f1_feedback(answer: str, gold: Sequence[str]) -> float:
    """The simulated user's rating: 1.0 when the answer's best F1 against the gold answers is
    at least THUMBS_UP_F1, else 0.0."""
    from rag.metrics.qa import best_em_f1

    return 1.0 if gold and best_em_f1(answer, list(gold))[1] >= THUMBS_UP_F1 else 0.0


@dataclass
class SimulatedUsers:
    """Users asking the synthetic world's holdout questions of the app at `url` (loopback only)
    and rating each answer (`f1_feedback`). Seeded: the same seed asks the same questions as
    the same users. `sent` counts requests; `ratings` the feedback per variant."""

    url: str
    examples: Sequence[Any]
    seed: int = 0
    n_users: int = 200
    concurrency: int = 2
    sent: int = 0
    errors: int = 0
    ratings: dict[str, list[float]] = field(default_factory=dict)

    def __post_init__(self) -> None:
        host = urlparse(self.url).hostname
        if host not in LOOPBACK:
            raise ConfigError("url", f"simulated users only talk to 127.0.0.1, got {host!r}")
        if not self.examples:
            raise ConfigError("examples", "no questions to ask")
        self._rng = random.Random(self.seed)

    def _one(self, client: Any, ex: Any, user: str) -> None:
        r = client.post("/query", json={"question": ex.question, "user_id": user,
                                        "category": ex.category})
        if r.status_code != 200:
            self.errors += 1
            return
        body = r.json()
        reward = f1_feedback(body["answer"], ex.answers)
        client.post("/feedback", json={"interaction_id": body["interaction_id"],
                                       "reward": reward})
        self.ratings.setdefault(body["variant_id"], []).append(reward)

    def ask(self, n: int, on_done: Callable[[], None] | None = None) -> None:
        """Send `n` questions (each from a user drawn from `n_users`), rate every answer."""
        import httpx

        jobs = [(self._rng.choice(self.examples), f"user-{self._rng.randrange(self.n_users)}")
                for _ in range(n)]
        with httpx.Client(base_url=self.url, timeout=60.0) as client, \
                ThreadPoolExecutor(self.concurrency) as pool:
            for f in [pool.submit(self._one, client, ex, u) for ex, u in jobs]:
                f.result()
                self.sent += 1
                if on_done is not None:
                    on_done()


@dataclass
class PromotionLoop:
    """Drive one rollout of the tuned config against the default on the live app. `timeline`:
    one record per decision (time s since start, stage before/after, action, reason, the
    deciding numbers, requests sent so far)."""

    state_dir: Path
    url: str
    admin_key: str
    store_path: Path
    users: SimulatedUsers
    settings: Any
    timeline: list[dict[str, Any]] = field(default_factory=list)
    sm: Any = None
    last: Any = None

    def __post_init__(self) -> None:
        self._t0 = time.perf_counter()

    def _apply(self) -> None:
        """Point the app's router at the split of the rollout's current stage."""
        import httpx

        from rl.promotion import service

        r = httpx.post(f"{self.url}/admin/traffic", json=service.traffic_body(self.sm),
                       headers={"X-API-Key": self.admin_key}, timeout=60.0)
        if r.status_code != 200:
            raise RuntimeError(f"POST /admin/traffic answered {r.status_code}: {r.text}")

    def _record(self, d: Any) -> None:
        self.last = d
        self.timeline.append({"t_s": round(time.perf_counter() - self._t0, 1),
                              "requests": self.users.sent, "action": d.action,
                              "from": d.from_stage, "to": d.to_stage, "reason": d.reason,
                              "evidence": _numbers(d.evidence)})

    def start(self, candidate: str, stable: str, offline_report: Any) -> Any:
        """A new rollout (state in `state_dir`), the offline holdout report observed, one
        advance tried, the split applied. Returns the Decision."""
        from rl.promotion import service

        self.sm = service.start(self.state_dir, candidate, stable, "synthetic",
                                self.settings, force=True)
        d = service.advance(self.sm, [offline_report])
        self._record(d)
        self._apply()
        return d

    def _wait_shadows(self, timeout_s: float = 30.0) -> None:
        """Mirrored requests finish after the answer; wait until none is pending."""
        import httpx

        deadline = time.time() + timeout_s
        while time.time() < deadline:
            st = httpx.get(f"{self.url}/rl/stats", timeout=30.0).json()
            if not st.get("shadow_tasks_pending"):
                return
            time.sleep(0.2)

    def step(self, on_done: Callable[[], None] | None = None) -> Any:
        """One batch of simulated requests, its evidence (the app's store since the last
        batch, `rl.promotion.evidence.reports_from_store`), one advance tried."""
        from rl.promotion import service
        from rl.promotion.evidence import reports_from_store
        from serving.store import open_store

        self.users.ask(BATCH, on_done)
        self._wait_shadows()
        stage = self.sm.stage
        reports = reports_from_store(self.store_path, self.sm, open_store=open_store).reports
        d = service.advance(self.sm, reports)
        if d.action != "refused" or not self.timeline or self.timeline[-1]["reason"] != d.reason:
            self._record(d)
        else:
            self.last = d
        if self.sm.stage != stage:
            self._apply()
        return d

    def more_evidence(self, max_requests: int) -> bool:
        """Whether another batch of users can move the rollout: not when it is full or rolled
        back, not at stage candidate (it takes offline reports only, and the demo has one),
        not past `max_requests`."""
        return (not self.sm.done and self.sm.stage != "candidate"
                and self.users.sent + BATCH <= max_requests)

    def run(self, max_requests: int, on_done: Callable[[], None] | None = None) -> None:
        """Batches while `more_evidence(max_requests)`, then `finish`."""
        while self.more_evidence(max_requests):
            self.step(on_done)
        self.finish()

    def finish(self) -> Any:
        """End a rollout that no more evidence can move (waiting at candidate, or the request
        budget spent): roll it back through the state machine, the reason naming what the
        evidence lacked; the router goes back to stable only. None when it already ended."""
        from rl.promotion import service

        if self.sm.done:
            return None
        why = self.last.reason if self.last is not None else "no decision"
        d = service.rollback(self.sm, f"demo over at {self.sm.stage} without enough evidence "
                                      f"({why})")
        self._record(d)
        self._apply()
        return d

    def outcome(self) -> dict[str, Any]:
        """`decision` promoted | rolled_back (| held before `finish`), the stage it ended at,
        the reason, and the deciding statistics: per stage left (advance or rollback), each
        metric's verdict with its difference and confidence sequence (`statistic`: stage ->
        its evidence); per metric the judgement that decided it (`deciding_metrics`,
        `deciding_judgements`; `deciding`: their lines, else the offline CI), requests sent."""
        st = self.sm.stage
        decision = {"full": "promoted", "rolled_back": "rolled_back"}.get(st, "held")
        d = self.last
        moves = [t for t in self.timeline if t["to"] != t["from"]]
        stat = {t["from"]: t["evidence"] for t in moves if t["evidence"]}
        offline = next((v.get("offline") for v in stat.values() if v.get("offline")), None)
        deciding = deciding_judgements(stat, decision == "rolled_back")
        return {"decision": decision, "stage": st,
                "last_stage": moves[-1]["from"] if decision == "rolled_back" and moves else st,
                "candidate": self.sm.state.candidate,
                "stable": self.sm.state.stable, "reason": d.reason if d else "",
                "statistic": stat, "deciding_metrics": deciding,
                "deciding": deciding_text(deciding, offline),
                "requests": self.users.sent, "audit_log": str(self.state_dir / "audit.jsonl")}


def _numbers(ev: dict[str, Any] | None) -> dict[str, Any]:
    """The scalar numbers, the per-metric judgements and the offline CI of a Decision's
    evidence, JSON-ready."""
    out: dict[str, Any] = {}
    for k, v in (ev or {}).items():
        if isinstance(v, bool) or v is None:
            continue
        if isinstance(v, (int, float, str)):
            out[k] = v
        elif k == "metrics" and isinstance(v, list):
            out[k] = [dict(j) for j in v]
        elif isinstance(v, dict) and k == "offline":
            out[k] = {kk: vv for kk, vv in v.items() if isinstance(vv, (int, float, str))}
    return out


def deciding_judgements(statistic: dict[str, dict[str, Any]],
                        rolled_back: bool = False) -> list[dict[str, Any]]:
    """Per metric, the judgement that decided it, with its `stage`, from `statistic` (stage ->
    evidence with `metrics`, in the order the stages were left). A rollback is decided by the
    last stage judged: its metrics. Otherwise an objective metric shown `better` is decided
    where it first was (shadow: the candidate is better on the objective there); every other
    metric by the last stage that measured it (latency: the canaries' served requests). The
    candidate stage's offline judgements only admit a candidate to traffic: they decide a
    rollout only when it ended there."""
    stages = [(k, v["metrics"]) for k, v in statistic.items() if (v or {}).get("metrics")]
    if not stages:
        return []
    if rolled_back:
        stage, judged = stages[-1]
        return [{**j, "stage": stage} for j in judged if j["verdict"] != "unmeasured"]
    out: dict[str, dict[str, Any]] = {}
    for stage, judged in [s for s in stages if s[0] != "candidate"] or stages:
        for j in judged:
            if j["verdict"] == "unmeasured":
                continue
            old = out.get(j["metric"])
            if old is None or not (old["objective"] and old["verdict"] == "better"):
                out[j["metric"]] = {**j, "stage": stage}
    return list(out.values())


def deciding_text(judgements: list[dict[str, Any]] | None,
                  offline: dict[str, Any] | None = None) -> str:
    """The statistics a decision rests on, one clause per metric (`Judgement.statistic`:
    verdict, Δ, always-valid CS, margin, n; prefixed by its stage when it has one), else the
    offline CI."""
    if judgements:
        return "; ".join((f"[{j['stage']}] " if j.get("stage") else "") + j["statistic"]
                         for j in judgements)
    if offline and offline.get("ci_low") is not None:
        return (f"offline Δ reward {offline['diff']:+.4f}, {offline.get('ci', 0.95):.0%} CI "
                f"[{offline['ci_low']:+.4f}, {offline['ci_high']:+.4f}] "
                f"(n = {offline.get('n', '?')})")
    return ""
