"""Prometheus metrics of the Serve ingress, in their own CollectorRegistry.

Label sets are bounded: `variant` is a config hash from the first `max_variants` seen (later
ones share the label `other`), `stage` is a fixed list, `route` is stable|canary|bandit|shadow,
`endpoint` the fixed list of routes, `gate` the tuner's gate names. Units: seconds for latency
histograms (Prometheus convention), tokens for token counters, rewards in [0, 1].

    m = ServeMetrics(max_variants=8)
    m.observe_answer("3fa1c0de12ab", "stable", {"retrieve": 12.1, ...}, 120, 8)   # latency ms
    m.render() -> (bytes, content type)   # this process's series only

Replicas: every ingress replica keeps its own counters. Each publishes `m.snapshot()` (its
samples as JSON) to the interaction store about once a second (`MetricsPublisher`), and
`GET /metrics` on any replica answers `render_replicas(...)`: every live replica's samples
with a `replica` label (`host:pid`), so one scrape target behind the Serve proxy sees every
replica's counters, each one monotonic, and `sum(rate(...))` over them is the whole app's
rate. Counters with a fixed label set (requests by endpoint and status class, rejections by
reason, tuner jobs by status, shadow mirrors by outcome) have a 0 sample from the start.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Mapping
from typing import Any

from prometheus_client import (
    CONTENT_TYPE_LATEST,
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    generate_latest,
)
from prometheus_client.core import Metric

log = logging.getLogger(__name__)

OTHER = "other"
STAGES = ("retrieve", "rerank", "select", "generate", "pipeline", "store", "total")
ROUTES = ("stable", "canary", "bandit", "shadow")
ENDPOINTS = ("query", "feedback", "tuner_evaluate", "admin_traffic", "other")
STATUS_CLASSES = ("2xx", "4xx", "5xx")
REJECT_REASONS = ("queue_full", "rate_limit")
JOB_STATUSES = ("done", "failed")
SHADOW_OUTCOMES = ("ok", "error")
REPLICA_LABEL = "replica"
STALE_S = 30.0
"""A replica whose snapshot is older than this (s) is gone: its series are no longer served."""
LATENCY_BUCKETS_S = (0.002, 0.005, 0.01, 0.02, 0.035, 0.05, 0.075, 0.1, 0.15, 0.25, 0.5, 1.0,
                     2.5, 5.0, 10.0)
PREFIX = "ragpilot"


class BoundedLabels:
    """Maps raw values onto at most `limit` label values (the rest -> `other`)."""

    def __init__(self, limit: int, fixed: tuple[str, ...] = ()):
        self.limit = limit
        self._known: dict[str, None] = dict.fromkeys(fixed)
        self._lock = threading.Lock()

    def __call__(self, value: str | None) -> str:
        v = value or OTHER
        with self._lock:
            if v in self._known:
                return v
            if len(self._known) < self.limit:
                self._known[v] = None
                return v
        return OTHER

    @property
    def known(self) -> list[str]:
        return list(self._known)


class RunningMean:
    """Count and mean of a stream (thread-safety is the caller's)."""

    def __init__(self) -> None:
        self.n, self.mean = 0, 0.0

    def add(self, x: float) -> None:
        self.n += 1
        self.mean += (x - self.mean) / self.n


class ServeMetrics:
    """Every metric the ingress exports, plus the running means behind the delta gauges."""

    def __init__(self, max_variants: int = 8, registry: CollectorRegistry | None = None):
        self.registry = registry or CollectorRegistry()
        self.variant = BoundedLabels(max_variants)
        r, p = self.registry, PREFIX
        self.requests = Counter(f"{p}_requests", "HTTP requests by endpoint and status class",
                                ["endpoint", "status"], registry=r)
        self.errors = Counter(f"{p}_errors", "Failed requests by endpoint and kind",
                              ["endpoint", "kind"], registry=r)
        self.rejected = Counter(f"{p}_rejected", "Requests refused with 429",
                                ["reason"], registry=r)
        self.routed = Counter(f"{p}_routed", "Answers by variant and route",
                              ["variant", "route"], registry=r)
        self.stage_latency = Histogram(f"{p}_stage_latency_seconds",
                                       "Latency per pipeline stage and variant (s)",
                                       ["stage", "variant"], buckets=LATENCY_BUCKETS_S,
                                       registry=r)
        self.request_latency = Histogram(f"{p}_request_latency_seconds",
                                         "End-to-end /query latency at the ingress (s)",
                                         ["variant", "route"], buckets=LATENCY_BUCKETS_S,
                                         registry=r)
        self.tokens = Counter(f"{p}_tokens", "Generator tokens", ["variant", "direction"],
                              registry=r)
        self.feedback = Counter(f"{p}_feedback", "Feedback rows stored", ["variant", "route"],
                                registry=r)
        self.reward = Histogram(f"{p}_feedback_reward", "Feedback reward in [0, 1]",
                                ["variant"], buckets=(0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8,
                                                      0.9, 1.0), registry=r)
        self.gold_f1 = Histogram(f"{p}_gold_f1", "Answer F1 vs gold (when the question is "
                                 "known)", ["variant", "route"],
                                 buckets=(0.1, 0.25, 0.5, 0.75, 0.9, 1.0), registry=r)
        self.canary_delta = Gauge(f"{p}_canary_delta", "Canary minus stable: mean reward, "
                                  "mean gold F1, mean latency (ms)", ["metric"], registry=r)
        self.shadow_delta = Gauge(f"{p}_shadow_delta", "Shadow minus served answer on the "
                                  "same requests: gold F1, latency (ms)", ["metric"],
                                  registry=r)
        self.shadow_requests = Counter(f"{p}_shadow", "Shadow mirrors by outcome",
                                       ["outcome"], registry=r)
        self.gate_status = Gauge(f"{p}_gate_status", "Tuner gate verdict of a variant "
                                 "(1 pass, 0 fail) from its latest /tuner/evaluate",
                                 ["variant", "gate"], registry=r)
        self.traffic = Gauge(f"{p}_traffic_percent", "Configured traffic share (%)", ["kind"],
                             registry=r)
        self.inflight = Gauge(f"{p}_inflight", "/query requests being answered", registry=r)
        self.jobs = Counter(f"{p}_tuner_jobs", "Tuner evaluation jobs by final status",
                            ["status"], registry=r)
        self._means: dict[tuple[str, str], RunningMean] = {}
        self._lock = threading.Lock()
        for ep in ENDPOINTS:  # a 0 sample from the start, not "No data" until the first event
            for status in STATUS_CLASSES:
                self.requests.labels(ep, status)
        for reason in REJECT_REASONS:
            self.rejected.labels(reason)
        for status in JOB_STATUSES:
            self.jobs.labels(status)
        for outcome in SHADOW_OUTCOMES:
            self.shadow_requests.labels(outcome)
        self.inflight.set(0)

    # ---- observations -----------------------------------------------------------------------
    def request(self, endpoint: str, status: int) -> None:
        ep = endpoint if endpoint in ENDPOINTS else "other"
        self.requests.labels(ep, f"{status // 100}xx").inc()
        if status >= 400:
            self.errors.labels(ep, str(status)).inc()

    def observe_answer(self, variant: str, route: str, latency_ms: Mapping[str, float],
                       tokens_in: int, tokens_out: int, f1: float | None = None) -> None:
        """One answer (served or shadow): per-stage latency (ms), tokens, gold F1."""
        v = self.variant(variant)
        route = route if route in ROUTES else "stable"
        self.routed.labels(v, route).inc()
        for stage, ms in latency_ms.items():
            if stage in STAGES:
                self.stage_latency.labels(stage, v).observe(ms / 1000.0)
        if route != "shadow" and "total" in latency_ms:
            self.request_latency.labels(v, route).observe(latency_ms["total"] / 1000.0)
        self.tokens.labels(v, "in").inc(max(tokens_in, 0))
        self.tokens.labels(v, "out").inc(max(tokens_out, 0))
        if f1 is not None:
            self.gold_f1.labels(v, route).observe(f1)
        if route in ("stable", "canary"):
            self._track(route, "latency_ms", latency_ms.get("total", latency_ms.get("pipeline")))
            if f1 is not None:
                self._track(route, "f1", f1)
            self._update_canary()

    def observe_feedback(self, variant: str, route: str, reward: float) -> None:
        v = self.variant(variant)
        self.feedback.labels(v, route if route in ROUTES else "stable").inc()
        self.reward.labels(v).observe(reward)
        if route in ("stable", "canary"):
            self._track(route, "reward", reward)
            self._update_canary()

    def observe_shadow(self, served_ms: float, shadow_ms: float, served_f1: float | None,
                       shadow_f1: float | None) -> None:
        """Paired comparison of one mirrored request (latency in ms)."""
        self.shadow_requests.labels("ok").inc()
        with self._lock:
            self._mean("shadow", "latency_ms").add(shadow_ms - served_ms)
            if served_f1 is not None and shadow_f1 is not None:
                self._mean("shadow", "f1").add(shadow_f1 - served_f1)
            for m in ("latency_ms", "f1"):
                if self._mean("shadow", m).n:
                    self.shadow_delta.labels(m).set(self._mean("shadow", m).mean)

    def set_gates(self, variant: str, gates: Mapping[str, bool]) -> None:
        v = self.variant(variant)
        for gate, ok in gates.items():
            self.gate_status.labels(v, str(gate)).set(1.0 if ok else 0.0)

    def set_traffic(self, canary_percent: float, shadow_percent: float) -> None:
        self.traffic.labels("canary").set(canary_percent)
        self.traffic.labels("shadow").set(shadow_percent)

    # ---- deltas -----------------------------------------------------------------------------
    def _mean(self, route: str, metric: str) -> RunningMean:
        return self._means.setdefault((route, metric), RunningMean())

    def _track(self, route: str, metric: str, value: float | None) -> None:
        if value is not None:
            with self._lock:
                self._mean(route, metric).add(float(value))

    def _update_canary(self) -> None:
        with self._lock:
            for m in ("reward", "f1", "latency_ms"):
                s, c = self._means.get(("stable", m)), self._means.get(("canary", m))
                if s and c and s.n and c.n:
                    self.canary_delta.labels(m).set(c.mean - s.mean)

    def deltas(self) -> dict[str, dict[str, float | int]]:
        """The running means behind the delta gauges (for /rl/stats)."""
        with self._lock:
            return {f"{r}:{m}": {"n": s.n, "mean": s.mean} for (r, m), s in self._means.items()}

    def render(self) -> tuple[bytes, str]:
        """This process's series only (Prometheus text, content type)."""
        return generate_latest(self.registry), CONTENT_TYPE_LATEST

    def snapshot(self) -> list[dict[str, Any]]:
        """Every family as JSON-able {name, type, help, samples: [[name, labels, value]]}
        (`_created` samples left out: a replica's start is not a metric anyone reads)."""
        return [{"name": fam.name, "type": fam.type, "help": fam.documentation,
                 "samples": [[x.name, x.labels, x.value] for x in fam.samples
                             if not x.name.endswith("_created")]}
                for fam in self.registry.collect()]


class _Replicas:
    """A collector over stored snapshots: replica id -> `ServeMetrics.snapshot()`."""

    def __init__(self, snapshots: Mapping[str, list[dict[str, Any]]]):
        self.snapshots = snapshots

    def collect(self):
        families: dict[str, Metric] = {}
        for replica in sorted(self.snapshots):
            for fam in self.snapshots[replica]:
                m = families.get(fam["name"])
                if m is None:
                    m = families[fam["name"]] = Metric(fam["name"], fam["help"], fam["type"])
                for name, labels, value in fam["samples"]:
                    m.add_sample(name, {**labels, REPLICA_LABEL: replica}, value)
        yield from families.values()


def render_replicas(snapshots: Mapping[str, list[dict[str, Any]]]) -> tuple[bytes, str]:
    """Prometheus text of every replica's samples, each with `replica="<id>"`."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(_Replicas(snapshots))
    return generate_latest(registry), CONTENT_TYPE_LATEST


class MetricsPublisher:
    """Writes `metrics.snapshot()` to the store under `replica` every `interval_s` seconds
    (a daemon thread) and answers `GET /metrics` with every live replica's series.

    `store` needs `save_replica_metrics(replica, body)` and `replica_metrics(since)` ->
    {replica: body} (serving.store). A failed write or read is logged and retried at the next
    tick; /metrics then still answers this replica's own series."""

    def __init__(self, store: Any, metrics: ServeMetrics, replica: str, interval_s: float = 1.0):
        self.store, self.metrics, self.replica = store, metrics, replica
        self.interval_s = float(interval_s)
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def publish(self) -> None:
        self.store.save_replica_metrics(self.replica, json.dumps(self.metrics.snapshot()))

    def start(self) -> MetricsPublisher:
        self._thread = threading.Thread(target=self._run, name="metrics-publisher",
                                        daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()

    def _run(self) -> None:
        while True:
            try:
                self.publish()
            except Exception as exc:  # noqa: BLE001 - keep publishing; say why once a tick
                log.warning("metrics snapshot not stored: %s: %s", type(exc).__name__, exc)
            if self._stop.wait(self.interval_s):
                return

    def render(self) -> tuple[bytes, str]:
        """Every replica seen within `STALE_S` (this one fresh), each with its label."""
        mine = self.metrics.snapshot()
        try:
            self.store.save_replica_metrics(self.replica, json.dumps(mine))
            stored = self.store.replica_metrics(time.time() - STALE_S)
            snapshots = {r: json.loads(body) for r, body in stored.items()}
        except Exception as exc:  # noqa: BLE001 - the siblings' series are missing, not ours
            log.warning("replica metrics not read from the store: %s: %s",
                        type(exc).__name__, exc)
            snapshots = {}
        snapshots[self.replica] = mine
        return render_replicas(snapshots)


# ---- the ingress's metrics, reachable from middleware -------------------------------------------
# Ray Serve pickles the Ingress class by value (serve.ingress rebinds its module name), so a
# module global of serving.app assigned in Ingress.__init__ is a copy the request middleware
# never sees: ragpilot_requests_total stayed empty under Serve. Like serving.auth's
# install_guard, the holder lives in an importable module that both sides reach by reference.
_CURRENT: list[ServeMetrics] = []


def install_metrics(metrics: ServeMetrics) -> None:
    """Make `metrics` the one `current_metrics()` returns (called by Ingress.__init__)."""
    _CURRENT[:] = [metrics]


def current_metrics() -> ServeMetrics | None:
    return _CURRENT[0] if _CURRENT else None
