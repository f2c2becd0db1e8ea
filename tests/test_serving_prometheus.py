"""A real Prometheus server (Debian's `prometheus` binary) scrapes the real Serve app, run with
two ingress replicas on 127.0.0.1, through the shipped deploy/prometheus config (targets and
intervals rewritten), and what it reads back adds up:

  * every replica's series arrive through the one scrape target, each with its `replica`
    label, and the request counters start at 0 (a sample before the first request);
  * after a fixed, bounded load, `sum(increase(...))` and `sum(rate(...))` of the request
    counter equal the number of requests sent (within 2%);
  * every series a dashboard panel or an alert/recording rule reads exists, the tuner's
    included (a `rl.tuner.prometheus.TunerMetrics` exporter on the shipped `ragpilot-tuner`
    job, fed a few steps: a real tune run would take minutes here).

This module deploys its own app (a fresh store and fresh replicas, so the counters start at 0)
on the session's shared Serve runtime (tests/conftest.py `serve_app`), in a private network
namespace when permitted. Locally the tests are skipped when prometheus is not installed; under CI=true
they fail instead (.ci/run installs it).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import pytest
import yaml

from serving.auth import KeyFile

pytestmark = pytest.mark.ray

REPO = Path(__file__).resolve().parents[1]
PROM = REPO / "deploy" / "prometheus"
LOAD = 120
"""Queries of the bounded load (8 clients)."""
Q2XX = 'ragpilot_requests_total{endpoint="query", status="2xx"}'


def _prometheus_binary() -> str:
    exe = shutil.which("prometheus")
    if exe is None:
        if os.environ.get("CI") == "true":
            pytest.fail("prometheus not installed (CI): .ci/run installs Debian's prometheus")
        pytest.skip("prometheus not installed (apt-get install -y prometheus); live scrape "
                    "test not run")
    return exe


@pytest.fixture(scope="module")
def served(serve_app, tmp_path_factory):
    """(admin key headers, app URL, Prometheus API URL)."""
    exe = _prometheus_binary()  # skip before paying for a Serve start-up
    from serving import netns

    tmp = tmp_path_factory.mktemp("serve-prom")
    store = tmp / "interactions.sqlite"
    token, _ = KeyFile(tmp / "keys.json").create("admin", name="serve-prom")
    args = {"store_url": str(store), "base": {"generator": "extractive", "variant": "bm25"},
            "canary": {"k": 3}, "shadow": {"k": 4},
            "traffic": {"canary_percent": 40.0, "shadow_percent": 20.0},
            "limits": {"max_inflight": 64, "rate_per_s": 1e6, "burst": 1e6},
            "ingress": {"replicas": 2, "sync_interval_s": 0.1, "metrics_interval_s": 0.5},
            "pipelines": {"num_replicas": 1, "autoscaling": None, "num_cpus": 0.1},
            "auth": {"keys_file": str(tmp / "keys.json")}, "rollout_dir": str(tmp / "rollout")}
    url = serve_app.deploy(args)
    tuner_port, prom_port = netns.free_port(), netns.free_port()
    tuner = _tuner_exporter(tuner_port)
    cfg = _config(tmp, url.removeprefix("http://"), prom_port, tuner_port)
    log = (tmp / "prometheus.log").open("w")
    proc = subprocess.Popen([exe, f"--config.file={cfg}", f"--storage.tsdb.path={tmp / 'tsdb'}",
                             f"--web.listen-address=127.0.0.1:{prom_port}"], stdout=log,
                            stderr=subprocess.STDOUT)
    try:
        yield {"X-API-Key": token}, url, f"http://127.0.0.1:{prom_port}"
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()
        log.close()
        tuner.shutdown()


def _tuner_exporter(port: int):
    """The tuner's real exporter with a few steps of two configs (a tune run's history)."""
    from rag.config import RAGConfig
    from rl.tuner.prometheus import TunerMetrics

    m = TunerMetrics(episode_length=2)
    configs = [RAGConfig(variant="bm25", k=3), RAGConfig(variant="dense", k=5)]
    m.consume([{"reward": 0.1 * i, "faithfulness": 0.5, "relevancy": 0.6,
                "p95_latency_ms": 900.0 * i, "cost": 100.0 + i, "config": c,
                "config_hash": c.config_hash} for i, c in enumerate(configs * 2)])
    return m.serve(port)


def _config(tmp: Path, target: str, self_port: int, tuner_port: int) -> Path:
    """The shipped prometheus.yml and rules with the test's targets, 1 s intervals and no
    alertmanager."""
    cfg = yaml.safe_load((PROM / "prometheus.yml").read_text())
    cfg["global"].update({"scrape_interval": "1s", "evaluation_interval": "1s"})
    cfg.pop("alerting", None)
    targets = {"ragpilot-serve": target, "ragpilot-tuner": f"127.0.0.1:{tuner_port}",
               "prometheus": f"127.0.0.1:{self_port}"}
    assert {j["job_name"] for j in cfg["scrape_configs"]} == set(targets)
    for job in cfg["scrape_configs"]:
        job["static_configs"][0]["targets"] = [targets[job["job_name"]]]
        job["scrape_interval"] = "1s"
    (tmp / "rules").mkdir()
    rules = yaml.safe_load((PROM / "rules" / "ragpilot.rules.yml").read_text())
    for g in rules["groups"]:
        g["interval"] = "1s"
    (tmp / "rules" / "ragpilot.rules.yml").write_text(yaml.safe_dump(rules))
    path = tmp / "prometheus.yml"
    path.write_text(yaml.safe_dump(cfg))
    return path


def _query(api: str, query: str, at: float | None = None) -> list[dict]:
    params = {"query": query} | ({"time": f"{at:.3f}"} if at is not None else {})
    r = httpx.get(f"{api}/api/v1/query", params=params, timeout=5)
    r.raise_for_status()
    return r.json()["data"]["result"]


def _poll(api: str, query: str, ok, timeout: float = 60.0) -> list[dict]:
    deadline, last = time.time() + timeout, None
    while time.time() < deadline:
        try:
            last = _query(api, query)
            if ok(last):
                return last
        except httpx.HTTPError as exc:  # 503 until its TSDB is ready
            last = repr(exc)
        time.sleep(0.5)
    raise AssertionError(f"{query!r}: no acceptable answer in {timeout:.0f} s (last: {last})")


def _value(result: list[dict]) -> float:
    return float(result[0]["value"][1]) if result else float("nan")


def _questions() -> list[str]:
    """The served dataset's own questions: their answers are scored against its gold (the
    gold-F1 series exist only for those)."""
    from rag.corpus.loaders import load_dataset

    return [e.question for e in load_dataset("synthetic").examples[:40]]


def _ask(url: str, n: int, prefix: str) -> list[httpx.Response]:
    qs = _questions()
    with httpx.Client(base_url=url, timeout=60) as c, ThreadPoolExecutor(8) as pool:
        return list(pool.map(lambda i: c.post("/query", json={
            "question": qs[i % len(qs)], "user_id": f"{prefix}-{i}"}), range(n)))


def test_counters_add_up_across_two_ingress_replicas(served) -> None:
    _, url, api = served
    # before any query: both replicas' counters are there, at 0, through the one target
    start = _poll(api, Q2XX, lambda res: len(res) == 2)
    assert len({s["metric"]["replica"] for s in start}) == 2, start
    assert all(s["value"][1] == "0" for s in start), start
    rejected = _poll(api, "ragpilot_rejected_total", lambda res: len(res) == 4)
    assert {s["metric"]["reason"] for s in rejected} == {"queue_full", "rate_limit"}
    assert all(s["value"][1] == "0" for s in rejected)

    rs = _ask(url, LOAD, "load")
    assert [r.status_code for r in rs] == [200] * LOAD, rs[0].text
    assert len({r.headers["x-ragpilot-replica"] for r in rs}) == 2  # both replicas answered
    _poll(api, f"sum({Q2XX})", lambda res: _value(res) == LOAD, timeout=30)
    # evaluated at the newest scrape: Prometheus extrapolates nothing past either end (the
    # series' first sample is 0, its last is the evaluation time)
    t_last = _value(_query(api, f"max(timestamp({Q2XX}))"))
    increase = _value(_query(api, f"sum(increase({Q2XX}[10m]))", at=t_last))
    rate = _value(_query(api, f"sum(rate({Q2XX}[10m]))", at=t_last))
    print(f"sent {LOAD}: sum(increase) {increase:.2f}, sum(rate)*600 {rate * 600:.2f}")
    assert abs(increase - LOAD) <= 0.02 * LOAD
    assert abs(rate * 600 - LOAD) <= 0.02 * LOAD
    # the app's own /metrics says the same through either replica
    text = httpx.get(f"{url}/metrics", timeout=30).text
    from prometheus_client.parser import text_string_to_metric_families

    direct = sum(s.value for fam in text_string_to_metric_families(text) for s in fam.samples
                 if s.name == "ragpilot_requests_total" and s.labels["endpoint"] == "query"
                 and s.labels["status"] == "2xx")
    assert direct == LOAD


def test_every_series_the_dashboards_and_rules_read_exists(served) -> None:
    from tests.unit.test_dashboards import dashboard_exprs, metric_names, rule_exprs

    admin, url, api = served
    rs = _ask(url, 60, "series")
    assert all(r.status_code == 200 for r in rs), rs[0].text
    with httpx.Client(base_url=url, timeout=60) as c:
        for r in rs:  # rewards on both routes: the canary-minus-stable reward delta
            assert c.post("/feedback", json={"interaction_id": r.json()["interaction_id"],
                                             "reward": 0.7}).status_code == 200
        job = c.post("/tuner/evaluate", json={"config": {"variant": "bm25"}, "dataset":
                                              "synthetic", "split": "valid", "batch_size": 8},
                     headers=admin)
        assert job.status_code == 202, job.text
        deadline = time.time() + 240
        while c.get(job.json()["poll"], headers=admin).json()["status"] == "running":
            assert time.time() < deadline, "tuner job did not finish in 240 s"
            time.sleep(0.5)
    _ask(url, 20, "series-b")  # traffic after the feedback: the ratios are numbers
    names = {n for exprs in dashboard_exprs().values() for e in exprs for n in metric_names(e)}
    names |= {n for e in rule_exprs() for n in metric_names(e)}
    names -= {"up"}
    missing: list[str] = []
    deadline = time.time() + 60
    for name in sorted(names):
        while not _query(api, f'count({{__name__="{name}"}})'):
            if time.time() > deadline:
                missing.append(name)
                break
            time.sleep(0.5)
    assert not missing, f"no series in Prometheus for {missing}"
    rules = httpx.get(f"{api}/api/v1/rules", timeout=5).json()["data"]["groups"]
    assert {g["name"] for g in rules} == {"ragpilot-slo-recording", "ragpilot-alerts"}
    assert all(r["health"] == "ok" for g in rules for r in g["rules"]), rules
