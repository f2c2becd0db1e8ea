"""A real Prometheus server (Debian's `prometheus` binary) scrapes the real Serve app on
127.0.0.1 with the shipped deploy/prometheus config (targets and intervals rewritten), and the
metric read back through Prometheus' HTTP API equals what the app's /metrics says.

The Serve app is the one tests/test_serving_app.py started (its session fixture) when that ran
first in this session (this file sorts after it): one Ray runtime per session. Run alone, this
module starts its own the same way (private network namespace, `serving.launch.start_local`)
and stops it at the end. Locally the test is skipped when prometheus is not installed; under
CI=true it fails instead (.ci/run installs it).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import time
from pathlib import Path

import httpx
import pytest
import yaml
from prometheus_client.parser import text_string_to_metric_families

pytestmark = pytest.mark.ray

REPO = Path(__file__).resolve().parents[1]
PROM = REPO / "deploy" / "prometheus"


def _prometheus_binary() -> str:
    exe = shutil.which("prometheus")
    if exe is None:
        if os.environ.get("CI") == "true":
            pytest.fail("prometheus not installed (CI): .ci/run installs Debian's prometheus")
        pytest.skip("prometheus not installed (apt-get install -y prometheus); live scrape "
                    "test not run")
    return exe


def _running_serve_url() -> str | None:
    """Base URL of the Serve app `ragpilot` already running in this process's Ray, if any."""
    import ray

    if not ray.is_initialized():
        return None
    try:
        from ray import serve
        from ray.serve.context import _get_global_client

        client = _get_global_client(raise_if_no_controller_running=False)
        if client is None or "ragpilot" not in serve.status().applications:
            return None
        http = client.http_config
        return f"http://{http.host}:{http.port}"
    except Exception:  # noqa: BLE001 - any failure means "start our own"
        return None


@pytest.fixture(scope="module")
def serve_url(tmp_path_factory):
    exe = _prometheus_binary()  # skip before paying for a Serve start-up
    url = _running_serve_url()
    if url is not None:
        yield exe, url
        return
    import ray

    from serving import netns
    from serving.launch import start_local, stop_local

    if not netns.in_private_netns():
        if ray.is_initialized():
            ray.shutdown()
        if not netns.enter_private_netns():
            print(f"serving test not isolated ({netns.last_error}); HTTP on 127.0.0.1 only")
    store = tmp_path_factory.mktemp("serve-prom") / "interactions.sqlite"
    args = {"store_url": str(store), "base": {"generator": "extractive", "variant": "bm25"},
            "pipelines": {"num_replicas": 1, "autoscaling": None, "num_cpus": 0.1},
            "rollout_dir": str(store.parent / "rollout")}
    url = start_local(args, port=netns.free_port())
    try:
        yield exe, url
    finally:
        stop_local()


def _direct(url: str, name: str, **labels: str) -> float:
    text = httpx.get(f"{url}/metrics", timeout=30).text
    return sum(s.value for fam in text_string_to_metric_families(text) for s in fam.samples
               if s.name == name and all(s.labels.get(k) == v for k, v in labels.items()))


def _ask(url: str, n: int, user: str) -> None:
    with httpx.Client(base_url=url, timeout=60) as c:
        for i in range(n):
            r = c.post("/query", json={"question": f"Where was person {i} born?",
                                       "user_id": f"{user}-{i}-{time.time_ns()}"})
            assert r.status_code == 200, r.text


def _config(tmp: Path, target: str, self_port: int) -> Path:
    """The shipped prometheus.yml and rules, with the serve target, 1 s intervals, no
    alertmanager and no tuner job."""
    cfg = yaml.safe_load((PROM / "prometheus.yml").read_text())
    cfg["global"].update({"scrape_interval": "1s", "evaluation_interval": "1s"})
    cfg.pop("alerting", None)
    jobs = {j["job_name"]: j for j in cfg["scrape_configs"]}
    jobs["ragpilot-serve"]["static_configs"][0]["targets"] = [target]
    jobs["prometheus"]["static_configs"][0]["targets"] = [f"127.0.0.1:{self_port}"]
    cfg["scrape_configs"] = [jobs["ragpilot-serve"], jobs["prometheus"]]
    (tmp / "rules").mkdir()
    rules = yaml.safe_load((PROM / "rules" / "ragpilot.rules.yml").read_text())
    for g in rules["groups"]:
        g["interval"] = "1s"
    (tmp / "rules" / "ragpilot.rules.yml").write_text(yaml.safe_dump(rules))
    path = tmp / "prometheus.yml"
    path.write_text(yaml.safe_dump(cfg))
    return path


def _poll(api: str, query: str, ok, timeout: float = 60.0) -> list[dict]:
    deadline, last = time.time() + timeout, None
    while time.time() < deadline:
        try:
            r = httpx.get(f"{api}/api/v1/query", params={"query": query}, timeout=5)
            if r.status_code != 200:  # Prometheus answers 503 until its TSDB is ready
                last = f"HTTP {r.status_code}: {r.text[:80]}"
                time.sleep(0.5)
                continue
            last = r.json()
            if last.get("status") == "success" and ok(last["data"]["result"]):
                return last["data"]["result"]
        except httpx.HTTPError as exc:
            last = repr(exc)
        time.sleep(0.5)
    raise AssertionError(f"{query!r}: no acceptable answer in {timeout:.0f} s (last: {last})")


def test_prometheus_scrapes_the_serve_app(serve_url, tmp_path) -> None:
    from serving.netns import free_port

    exe, url = serve_url
    _ask(url, 5, "prom-a")
    expected = _direct(url, "ragpilot_requests_total", endpoint="query", status="2xx")
    assert expected >= 5, [x for x in httpx.get(f"{url}/metrics").text.splitlines()
                           if "requests" in x]
    port = free_port()
    cfg = _config(tmp_path, url.removeprefix("http://"), port)
    log = (tmp_path / "prometheus.log").open("w")
    proc = subprocess.Popen([exe, f"--config.file={cfg}", f"--storage.tsdb.path={tmp_path / 'tsdb'}",
                             f"--web.listen-address=127.0.0.1:{port}"], stdout=log,
                            stderr=subprocess.STDOUT)
    api = f"http://127.0.0.1:{port}"
    t0 = time.perf_counter()
    try:
        up = _poll(api, 'up{job="ragpilot-serve"}', lambda res: bool(res))
        assert up[0]["value"][1] == "1", (tmp_path / "prometheus.log").read_text()[-2000:]
        got = _poll(api, 'sum(ragpilot_requests_total{endpoint="query", status="2xx"})',
                    lambda res: bool(res))
        print(f"prometheus answered after {time.perf_counter() - t0:.1f} s")
        assert float(got[0]["value"][1]) == expected  # no /query since: the same count
        # the recording rules evaluate on the real series: traffic between two scrapes makes
        # the slow-answer ratio a number (0/0 = NaN without it)
        _ask(url, 5, "prom-b")
        slow = _poll(api, "ragpilot:request_latency_slow_ratio:rate5m", lambda res: any(
            s["metric"].get("route") == "stable" and s["value"][1] != "NaN" for s in res),
            timeout=30)
        ratio = float(next(s for s in slow if s["metric"]["route"] == "stable")["value"][1])
        assert 0.0 <= ratio <= 1.0
        rules = httpx.get(f"{api}/api/v1/rules", timeout=5).json()["data"]["groups"]
        assert {g["name"] for g in rules} == {"ragpilot-slo-recording", "ragpilot-alerts"}
        assert all(r["health"] == "ok" for g in rules for r in g["rules"]), rules
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()
        log.close()
