"""`ragpilot serve`'s stop and reload paths without Ray (serving.launch): the drain waits for
the in-flight count every replica publishes to reach 0 and stay there, and gives up at its
timeout; a reload of an invalid serve.yaml changes nothing and says why. The real thing under
Serve: tests/test_serving_lifecycle.py."""

from __future__ import annotations

import math
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from serving.launch import drain, inflight, reload_apps


class _Metrics(BaseHTTPRequestHandler):
    """GET /metrics: two replicas' `ragpilot_inflight`, from the server's `counts()`."""

    def do_GET(self):  # noqa: N802 - http.server's name
        time.sleep(getattr(self.server, "delay", lambda: 0.0)())
        a, b = self.server.counts()
        body = ("# TYPE ragpilot_inflight gauge\n"
                f'ragpilot_inflight{{replica="h:1"}} {a}\n'
                f'ragpilot_inflight{{replica="h:2"}} {b}\n').encode()
        self.send_response(200)
        self.send_header("Content-Type", "text/plain")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):  # quiet
        pass


@pytest.fixture
def metrics_server():
    servers = []

    def start(counts, delay=None):
        srv = ThreadingHTTPServer(("127.0.0.1", 0), _Metrics)
        srv.counts = counts
        if delay is not None:
            srv.delay = delay
        threading.Thread(target=srv.serve_forever, daemon=True).start()
        servers.append(srv)
        return f"http://127.0.0.1:{srv.server_address[1]}"

    yield start
    for srv in servers:
        srv.shutdown()


def test_drain_waits_until_every_replica_is_quiet(metrics_server, capsys):
    url = metrics_server(lambda: (1, 2))
    assert inflight(url) == 3
    start: list[float] = []

    def counts():  # from the drain's first read: replica 2 busy for 0.8 s, replica 1 for 0.4 s
        start[:] = start or [time.monotonic()]
        t = time.monotonic() - start[0]
        return (1 if t < 0.4 else 0, 2 if t < 0.8 else 0)

    url = metrics_server(counts)
    assert drain(url, quiet_s=0.5, timeout_s=10) is True
    took = time.monotonic() - start[0]
    assert 1.1 <= took < 5, took  # 0.8 s busy (read every ~0.1 s) + 0.5 s quiet
    assert "request(s) in flight" in capsys.readouterr().out


def test_a_quiet_app_still_drains_for_the_minimum_time(metrics_server):
    """Nothing in flight: the drain still lasts `min_s`, so a load balancer checking /readyz
    sees `draining` before the listener closes."""
    url = metrics_server(lambda: (0, 0))
    t0 = time.monotonic()
    assert drain(url, quiet_s=0.2, timeout_s=10, min_s=1.0) is True
    assert 1.0 <= time.monotonic() - t0 < 5
    t0 = time.monotonic()
    assert drain(url, quiet_s=0.2, timeout_s=10) is True
    assert time.monotonic() - t0 < 1.0


def test_drain_gives_up_at_its_timeout_or_on_a_second_signal(metrics_server, capsys):
    url = metrics_server(lambda: (1, 0))
    t0 = time.monotonic()
    assert drain(url, quiet_s=0.5, timeout_s=1.0) is False
    assert 1.0 <= time.monotonic() - t0 < 3
    assert "still in flight" in capsys.readouterr().out
    force = threading.Event()
    force.set()
    assert drain(url, quiet_s=0.5, timeout_s=60, give_up=force) is False


def test_a_count_read_too_slowly_is_busy_not_quiet(metrics_server, capsys):
    """A busy app may answer /metrics after the read timeout: that is not "stopped" (which
    would shut Serve down under the requests still in flight)."""
    start: list[float] = []

    def delay():  # /metrics slower than the read timeout for the first 0.8 s of the drain
        start[:] = start or [time.monotonic()]
        return 0.5 if time.monotonic() - start[0] < 0.8 else 0.0

    url = metrics_server(lambda: (0, 0), delay)
    assert math.isnan(inflight(url, timeout_s=0.2))
    start.clear()
    assert drain(url, quiet_s=0.3, timeout_s=10, read_timeout_s=0.2) is True
    took = time.monotonic() - start[0]
    # no readable count before 0.8 s, so no end before it; the quiet window runs from the last
    # unreadable read's return, which a loaded machine can put well before 0.8 s
    assert took >= 0.8, took
    assert "unknown (/metrics unread)" in capsys.readouterr().out
    url = metrics_server(lambda: (0, 0), lambda: 1.0)  # never readable in time: the timeout
    assert drain(url, quiet_s=0.3, timeout_s=1.0, read_timeout_s=0.2) is False


def test_drain_of_an_app_that_no_longer_answers_ends_at_once():
    from serving.netns import free_port

    t0 = time.monotonic()
    assert drain(f"http://127.0.0.1:{free_port()}", quiet_s=5, timeout_s=60) is True
    assert time.monotonic() - t0 < 10


def test_reload_of_an_invalid_file_changes_nothing(tmp_path, capsys):
    running = [{"name": "ragpilot", "args": {"traffic": {"canary_percent": 10.0}}}]
    bad = tmp_path / "serve.yaml"
    bad.write_text("applications:\n  - name: ragpilot\n    import_path: serving.app:build_app\n"
                   "    args:\n      traffic: {canary_percent: 500}\n")
    assert reload_apps(bad, running) is running
    out = capsys.readouterr().out
    assert out.startswith("reload refused, nothing changed: ") and "canary_percent" in out
    renamed = tmp_path / "renamed.yaml"
    renamed.write_text("applications:\n  - name: other\n    import_path: serving.app:build_app\n"
                       "    args: {}\n")
    assert reload_apps(renamed, running) is running
    assert "needs a restart" in capsys.readouterr().out


def test_haproxy_checks_each_ingress_replica_at_rays_healthz_not_readyz(tmp_path):
    """docs/serving.md (HAProxy): in `--proxy haproxy` mode Ray writes HAProxy's config, and its
    per-replica check is Ray's own `GET /-/healthz` on each replica's port (a replica leaves
    rotation when Serve stops it or it dies), not the app's `/readyz`; readiness and draining
    are the front load balancer's check of `/readyz`. Rendered with Ray's own generator for two
    replicas, as the proxy actor renders it."""
    from ray.serve._private.haproxy import BackendConfig, HAProxyApi, HAProxyConfig, ServerConfig

    servers = [ServerConfig(name=f"r{i}", host="127.0.0.1", port=30000 + i) for i in (1, 2)]
    backend = BackendConfig(name="ragpilot", path_prefix="/", servers=servers,
                            app_name="ragpilot")
    cfg = tmp_path / "haproxy.cfg"
    HAProxyApi(cfg=HAProxyConfig(), backend_configs={"ragpilot": backend},
               config_file_path=str(cfg))._generate_config_file_internal()
    lines = [x.strip() for x in cfg.read_text().splitlines()]
    assert [x for x in lines if x.startswith("option httpchk")] == ["option httpchk GET /-/healthz"]
    assert "http-check expect status 200" in lines
    checked = [x for x in lines if x.startswith("server ")]
    assert len(checked) == 2 and all(" check" in x for x in checked), checked
    assert not any("readyz" in x for x in lines)
