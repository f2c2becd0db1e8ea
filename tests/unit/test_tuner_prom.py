"""rl.tuner.prometheus.TunerMetrics: episodes, moving average, gate breaches, variant shares and the
Pareto frontier, exported over HTTP on 127.0.0.1 and as a textfile."""

from __future__ import annotations

import httpx
from prometheus_client.parser import text_string_to_metric_families

from rag.config import RAGConfig
from rl.kernel.settings import Thresholds
from rl.tuner.prometheus import TunerMetrics, pareto_front
from serving.netns import free_port


def _step(cfg: RAGConfig, reward: float, f: float, r: float, p95: float, cost: float) -> dict:
    return {"config": cfg, "config_hash": cfg.config_hash, "reward": reward, "faithfulness": f,
            "relevancy": r, "p95_latency_ms": p95, "cost": cost}


def _samples(text: str) -> dict[tuple[str, tuple], float]:
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for fam in text_string_to_metric_families(text) for s in fam.samples}


def test_pareto_front() -> None:
    pts = {"a": (0.8, 300.0), "b": (0.6, 100.0), "c": (0.5, 200.0), "d": (0.8, 350.0),
           "e": (0.9, 900.0)}
    assert pareto_front(pts) == {"a", "b", "e"}  # c: dominated by b; d: by a (same quality)


def test_consume_counts_only_new_steps_and_exports(tmp_path) -> None:
    bm25, dense = RAGConfig(variant="bm25"), RAGConfig(variant="dense", k=3)
    hybrid = RAGConfig(variant="hybrid")
    thr = Thresholds.model_validate({"faithfulness": 0.5, "relevancy": 0.5,
                                     "p95_latency_ms": 500.0})
    m = TunerMetrics(episode_length=3, alpha=0.5, beta=0.5, thresholds=thr)
    hist = [_step(bm25, 0.2, 0.4, 0.6, 100, 200),     # faithfulness breach
            _step(dense, 0.5, 0.7, 0.7, 600, 300),    # latency breach
            _step(bm25, 0.4, 0.6, 0.6, 100, 200),
            _step(hybrid, 0.9, 0.9, 0.9, 300, 500)]
    assert m.consume(hist) == 4
    assert m.consume(hist) == 0                       # nothing new: nothing counted twice
    hist.append(_step(hybrid, 0.7, 0.3, 0.2, 300, 500))  # both quality gates breached
    hist.append(_step(dense, 0.6, 0.7, 0.7, 200, 300))
    assert m.consume(hist) == 2
    path = m.write_textfile(tmp_path / "tuner.prom")
    s = _samples(path.read_text())
    assert s[("ragpilot_tuner_episodes_total", ())] == 2
    assert abs(s[("ragpilot_tuner_episode_reward", ())] - (0.9 + 0.7 + 0.6) / 3) < 1e-9
    assert abs(s[("ragpilot_tuner_episode_reward_ma", ())] - (1.1 / 3 + 2.2 / 3) / 2) < 1e-9
    breaches = {dict(k[1])["gate"]: v for k, v in s.items()
                if k[0] == "ragpilot_tuner_gate_breaches_total"}
    assert breaches == {"faithfulness": 2, "relevancy": 1, "p95_latency_ms": 1}
    counts = {dict(k[1])["variant"]: v for k, v in s.items()
              if k[0] == "ragpilot_tuner_steps_total"}
    assert counts == {"bm25": 2, "dense": 2, "hybrid": 2}
    sums = {dict(k[1])["variant"]: v for k, v in s.items()
            if k[0] == "ragpilot_tuner_reward_sum"}
    assert abs(sums["hybrid"] - 1.6) < 1e-9
    q = {dict(k[1])["config"]: v for k, v in s.items() if k[0] == "ragpilot_tuner_config_quality"}
    assert abs(q[hybrid.config_hash] - (0.9 + 0.25) / 2) < 1e-9  # mean of 0.9 and 0.25
    front = {dict(k[1])["config"]: v for k, v in s.items()
             if k[0] == "ragpilot_tuner_config_pareto"}
    # bm25 q=0.55 @200, dense q=0.7 @300, hybrid q=0.575 @500 (dominated by dense)
    assert front == {bm25.config_hash: 1, dense.config_hash: 1, hybrid.config_hash: 0}


def test_http_export_on_loopback_and_config_cap() -> None:
    m = TunerMetrics(episode_length=2, max_configs=1)
    a, b = RAGConfig(variant="bm25"), RAGConfig(variant="graph")
    m.consume([_step(a, 0.1, 0.5, 0.5, 10, 10), _step(b, 0.3, 0.5, 0.5, 10, 10)],
              resolve=None)
    port = free_port()
    server = m.serve(port)
    try:
        text = httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=10).text
    finally:
        server.shutdown()
    s = _samples(text)
    assert s[("ragpilot_tuner_configs_dropped_total", ())] == 1
    assert s[("ragpilot_tuner_episode_reward", ())] == 0.2
    assert [k for k in s if k[0] == "ragpilot_tuner_config_pareto"] == [
        ("ragpilot_tuner_config_pareto", (("config", a.config_hash), ("variant", "bm25")))]
