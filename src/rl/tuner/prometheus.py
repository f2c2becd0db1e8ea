"""Prometheus metrics of a tuner run: what the "policy performance", "quality vs cost" and
"variant breakdown" Grafana dashboards read (dashboards/, deploy/prometheus/).

A tune run is a batch job, not a server, so it exports either over HTTP on 127.0.0.1 while it
runs (Prometheus scrapes job `ragpilot-tuner`) or as a node-exporter textfile written after
every iteration (`--metrics-textfile`, for runs shorter than a scrape interval):

    m = TunerMetrics(episode_length=8, alpha=0.5, beta=0.5, thresholds=ev.thresholds)
    m.serve(9464)                      # prometheus_client HTTP server on 127.0.0.1:9464
    m.consume(env.history)             # after each PPO iteration: only new steps are counted
    m.write_textfile("runs/tune/tuner.prom")

Label sets are bounded: `variant` is the config's candidate source (bm25|dense|hybrid|graph),
`gate` the three hard gates, `config` a config hash from the first `max_configs` configs seen
(later ones are counted but not plotted: `ragpilot_tuner_configs_dropped_total`).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
from prometheus_client import CollectorRegistry, Counter, Gauge

from rl.kernel.reward import HARD_GATES, gate_verdicts

PREFIX = "ragpilot_tuner"
VARIANTS = ("bm25", "dense", "hybrid", "graph")
GATES = HARD_GATES
MA_EPISODES = 10


def pareto_front(points: Mapping[str, tuple[float, float]]) -> set[str]:
    """Keys of the (quality, cost) points no other point dominates (quality at least as high and
    cost at least as low, one of them strictly): the frontier the scatter panel highlights."""
    front = set()
    for k, (q, c) in points.items():
        if not any((q2 >= q and c2 <= c) and (q2 > q or c2 < c)
                   for k2, (q2, c2) in points.items() if k2 != k):
            front.add(k)
    return front


class TunerMetrics:
    """Every tuner-side metric, in its own registry (not the process default)."""

    def __init__(self, episode_length: int, alpha: float = 0.5, beta: float = 0.5,
                 thresholds: Any = None, max_configs: int = 200,
                 registry: CollectorRegistry | None = None):
        if episode_length < 1:
            raise ValueError("episode_length must be >= 1")
        self.registry = registry or CollectorRegistry()
        self.episode_length, self.alpha, self.beta = episode_length, alpha, beta
        self.thresholds, self.max_configs = thresholds, max_configs
        r, p = self.registry, PREFIX
        # rewards can be negative (penalties): a Histogram would drop its _sum then, and a
        # Counter cannot go down, so the running reward sum is a Gauge
        self.steps = Counter(f"{p}_steps", "Tuner steps (a config evaluated on a batch), by "
                             "the config's candidate source", ["variant"], registry=r)
        self.reward_sum = Gauge(f"{p}_reward_sum", "Sum of the step rewards so far, by "
                                "candidate source (divide a delta by the steps' increase)",
                                ["variant"], registry=r)
        self.episodes = Counter(f"{p}_episodes", "Completed tuner episodes", registry=r)
        self.episode_reward = Gauge(f"{p}_episode_reward", "Mean step reward of the latest "
                                    "completed episode", registry=r)
        self.episode_reward_ma = Gauge(f"{p}_episode_reward_ma", f"Mean of the last "
                                       f"{MA_EPISODES} episode rewards", registry=r)
        self.breaches = Counter(f"{p}_gate_breaches", "Tuner steps that failed a hard gate",
                                ["gate"], registry=r)
        self.quality = Gauge(f"{p}_config_quality", "Mean alpha*F + beta*R of a config over "
                             "its steps", ["config", "variant"], registry=r)
        self.cost = Gauge(f"{p}_config_cost_tokens", "Mean tokens per query of a config",
                          ["config", "variant"], registry=r)
        self.latency = Gauge(f"{p}_config_p95_latency_seconds", "Mean batch p95 latency of a "
                             "config (s)", ["config", "variant"], registry=r)
        self.pareto = Gauge(f"{p}_config_pareto", "1 when the config is on the quality-vs-cost "
                            "Pareto frontier of the configs seen, else 0", ["config", "variant"],
                            registry=r)
        self.dropped = Counter(f"{p}_configs_dropped", "Configs seen beyond max_configs (not "
                               "plotted)", registry=r)
        self._seen = 0
        self._episode: list[float] = []
        self._episode_means: list[float] = []
        self._configs: dict[str, dict[str, Any]] = {}
        for g in GATES:  # export zeros so `increase()` works from the first breach
            self.breaches.labels(g)

    # ---- input --------------------------------------------------------------------------------
    def consume(self, history: Sequence[Mapping[str, Any]],
                resolve: Callable[[str], Any] | None = None) -> int:
        """Count the steps of `history` not seen yet (history only grows). A step is a dict
        with reward, faithfulness, relevancy, p95_latency_ms, cost, config_hash and `config`
        (a RAGConfig) or a `resolve(config_hash)` that returns one. Returns steps added."""
        new = history[self._seen:]
        for step in new:
            self._step(step, resolve)
        self._seen = len(history)
        if new:
            self._update_pareto()
        return len(new)

    def _step(self, s: Mapping[str, Any], resolve: Callable[[str], Any] | None) -> None:
        cfg = s.get("config") or (resolve(s["config_hash"]) if resolve else None)
        variant = getattr(cfg, "variant", None)
        variant = variant if variant in VARIANTS else "other"
        reward = float(s["reward"])
        self.steps.labels(variant).inc()
        self.reward_sum.labels(variant).inc(reward)
        for gate in self._failed_gates(s):
            self.breaches.labels(gate).inc()
        h = str(s["config_hash"])
        c = self._configs.get(h)
        if c is None:
            if len(self._configs) >= self.max_configs:
                self.dropped.inc()
            else:
                c = self._configs[h] = {"variant": variant, "n": 0, "q": 0.0, "cost": 0.0,
                                        "p95": 0.0}
        if c is not None:
            c["n"] += 1
            q = self.alpha * float(s["faithfulness"]) + self.beta * float(s["relevancy"])
            for key, x in (("q", q), ("cost", float(s["cost"])),
                           ("p95", float(s["p95_latency_ms"]) / 1000.0)):
                c[key] += (x - c[key]) / c["n"]
        self._episode.append(reward)
        if len(self._episode) == self.episode_length:
            mean = float(np.mean(self._episode))
            self._episode = []
            self._episode_means.append(mean)
            self.episodes.inc()
            self.episode_reward.set(mean)
            self.episode_reward_ma.set(float(np.mean(self._episode_means[-MA_EPISODES:])))

    def _failed_gates(self, s: Mapping[str, Any]) -> list[str]:
        t = self.thresholds
        if t is None:  # only the verdict is known: count it against every gate it could be
            return [] if s.get("gates_passed", True) else ["unknown"]
        verdicts = gate_verdicts({g: float(s[g]) for g in GATES}, t)
        return [g for g, ok in verdicts.items() if ok is False]

    def _update_pareto(self) -> None:
        front = pareto_front({h: (c["q"], c["cost"]) for h, c in self._configs.items()})
        for h, c in self._configs.items():
            labels = (h, c["variant"])
            self.quality.labels(*labels).set(c["q"])
            self.cost.labels(*labels).set(c["cost"])
            self.latency.labels(*labels).set(c["p95"])
            self.pareto.labels(*labels).set(1.0 if h in front else 0.0)

    # ---- output -------------------------------------------------------------------------------
    textfile: Path | None = None

    def flush(self) -> None:
        """Write the textfile when one was configured (after each iteration and at the end)."""
        if self.textfile is not None:
            self.write_textfile(self.textfile)

    def serve(self, port: int, addr: str = "127.0.0.1"):
        """Expose the registry over HTTP on addr:port (a daemon thread); returns the server."""
        from prometheus_client import start_http_server

        server, _thread = start_http_server(port, addr=addr, registry=self.registry)
        return server

    def write_textfile(self, path: str | Path) -> Path:
        """Atomically write the exposition text (node-exporter textfile collector format)."""
        from prometheus_client import write_to_textfile

        p = Path(path)
        p.parent.mkdir(parents=True, exist_ok=True)
        write_to_textfile(str(p), self.registry)
        return p


def for_tune_run(policy: Any, thresholds: Any, port: int | None = None,
                 textfile: str | Path | None = None) -> TunerMetrics | None:
    """The exporter `ragpilot tune --metrics-port/--metrics-textfile` uses (None when neither
    is given). Episode length and quality weights come from the policy."""
    if port is None and textfile is None:
        return None
    w = policy.reward_weights
    m = TunerMetrics(policy.episode.length, w.alpha, w.beta, thresholds)
    if port is not None:
        m.serve(port)
    if textfile is not None:
        m.textfile = Path(textfile)
    return m
