"""Lifecycle of `ragpilot serve` as an operator runs it (a child process, two ingress replicas):
cold start to alive (/healthz) and to ready (/readyz) measured; an edited serve.yaml applied
with SIGHUP (a canary added) without a restart, the interaction store and the API keys kept;
and SIGTERM in the middle of a bounded load answers every request already sent (0 dropped)
before the process exits 0.

Runs in a private network namespace when permitted (the replicas' internal ports stay there).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx
import pytest
import yaml

from serving.auth import KeyFile

pytestmark = pytest.mark.ray

CLIENTS, PER_CLIENT = 8, 15
"""The bounded load: 8 clients asking 15 questions each, one after the other."""
SIGTERM_AFTER = 24
"""Answers received before the server is sent SIGTERM."""


def _yaml(tmp: Path, port: int, **args) -> Path:
    cfg = {"proxy_location": "HeadOnly", "http_options": {"host": "127.0.0.1", "port": port},
           "applications": [{"name": "ragpilot", "route_prefix": "/",
                             "import_path": "serving.app:build_app", "args": {
                                 "store_url": str(tmp / "interactions.sqlite"),
                                 "base": {"generator": "extractive", "variant": "bm25"},
                                 "limits": {"max_inflight": 64, "rate_per_s": 1e6,
                                            "burst": 1e6},
                                 "ingress": {"replicas": 2},
                                 "pipelines": {"num_replicas": 1, "autoscaling": None,
                                               "num_cpus": 0.1},
                                 "auth": {"keys_file": str(tmp / "keys.json")},
                                 "rollout_dir": str(tmp / "rollout"), **args}}]}
    path = tmp / "serve.yaml"
    path.write_text(yaml.safe_dump(cfg))
    return path


def _first_200(url: str, proc: subprocess.Popen, t0: float, timeout: float = 240) -> float:
    while time.perf_counter() - t0 < timeout:
        assert proc.poll() is None, f"server exited with {proc.returncode}"
        try:
            if httpx.get(url, timeout=2).status_code == 200:
                return time.perf_counter() - t0
        except httpx.HTTPError:
            pass
        time.sleep(0.1)
    raise AssertionError(f"{url}: no 200 in {timeout} s")


def _listening_beyond_loopback() -> list[tuple[str, int, str]]:
    """(address, port, process name) of every TCP socket listening on a non-loopback address
    (0.0.0.0 and :: included) in this network namespace."""
    import psutil

    out = []
    for c in psutil.net_connections(kind="tcp"):
        ip = c.laddr.ip.removeprefix("::ffff:")  # an IPv4 address on an IPv6 socket
        if c.status != psutil.CONN_LISTEN or ip.startswith("127.") or ip == "::1":
            continue
        try:
            name = psutil.Process(c.pid).name() if c.pid else "?"
        except psutil.Error:
            name = "?"
        out.append((c.laddr.ip, c.laddr.port, name))
    return sorted(out)


def test_cold_start_and_sigterm_drains_in_flight_requests(tmp_path) -> None:
    import ray

    from serving import netns
    from serving.launch import stop_local

    if ray.is_initialized():  # another module's cluster: this test runs its own server
        stop_local()
    if not netns.in_private_netns() and not netns.enter_private_netns():
        print(f"not isolated ({netns.last_error}); HTTP on 127.0.0.1 only")
    port = netns.free_port()
    url = f"http://127.0.0.1:{port}"
    log = (tmp_path / "serve.log").open("w")
    env = {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
    t0 = time.perf_counter()
    proc = subprocess.Popen([sys.executable, "-m", "serving.cli", "serve", "--config",
                             str(_yaml(tmp_path, port))], stdout=log, stderr=subprocess.STDOUT,
                            env=env)
    try:
        alive = _first_200(f"{url}/healthz", proc, t0)
        ready = _first_200(f"{url}/readyz", proc, t0)
        print(f"cold start: alive after {alive:.1f} s, ready after {ready:.1f} s")
        assert ready >= alive
        exposed = _listening_beyond_loopback()
        print("listening on every interface:", exposed)
        assert ("127.0.0.1", port) not in exposed and all(p != port for _, p, _ in exposed)

        # a config change without a restart: the edited file, then SIGHUP (once the server
        # says it is serving: /readyz can answer before `ragpilot serve` has returned from
        # deploying)
        while "ragpilot serving at" not in (tmp_path / "serve.log").read_text():
            assert time.perf_counter() - t0 < 300 and proc.poll() is None
            time.sleep(0.2)
        token, _ = KeyFile(tmp_path / "keys.json").create("admin", name="lifecycle")
        admin = {"X-API-Key": token}
        with httpx.Client(base_url=url, timeout=60) as h:
            for i in range(5):
                assert h.post("/query", json={"question": "Where was person 1 born?",
                                              "user_id": f"before-{i}"}).status_code == 200
            assert h.get("/admin/traffic", headers=admin).json()["canary"] is None
            _yaml(tmp_path, port, canary={"k": 3}, traffic={"canary_percent": 50.0})
            t_reload = time.perf_counter()
            proc.send_signal(signal.SIGHUP)
            while True:
                t = h.get("/admin/traffic", headers=admin).json()
                if t.get("canary") and t["canary_percent"] == 50.0:
                    break
                assert time.perf_counter() - t_reload < 120, t
                time.sleep(0.5)
            print(f"reload applied after {time.perf_counter() - t_reload:.1f} s")
            routes = {h.post("/query", json={"question": "Where was person 2 born?",
                                             "user_id": f"after-{i}"}).json()["route"]
                      for i in range(30)}
            assert routes == {"stable", "canary"}
            stats = h.get("/rl/stats", headers=admin).json()
            assert stats["store"]["interactions"] >= 35, stats["store"]  # nothing lost
        assert proc.poll() is None

        answered: list[int] = []
        failures: list[str] = []
        lock = threading.Lock()
        enough = threading.Event()

        def client(c: int) -> None:
            with httpx.Client(base_url=url, timeout=60) as h:
                for i in range(PER_CLIENT):
                    try:
                        r = h.post("/query", json={"question": f"Where was person {i} born?",
                                                   "user_id": f"c{c}-{i}"})
                        ok = r.status_code == 200
                        detail = f"{r.status_code} {r.text[:120]}"
                    except httpx.HTTPError as exc:
                        ok, detail = False, repr(exc)
                    with lock:
                        (answered if ok else failures).append(
                            r.status_code if ok else detail)  # type: ignore[arg-type]
                        if len(answered) >= SIGTERM_AFTER:
                            enough.set()

        threads = [threading.Thread(target=client, args=(c,)) for c in range(CLIENTS)]
        for t in threads:
            t.start()
        assert enough.wait(120), failures[:3]
        proc.send_signal(signal.SIGTERM)
        sent_at = len(answered)
        for t in threads:
            t.join(120)
        rc = proc.wait(120)
        text = (tmp_path / "serve.log").read_text()
        print(f"SIGTERM after {sent_at} answers; {len(answered)} answered, "
              f"{len(failures)} dropped; exit {rc}")
        assert not failures, f"{len(failures)} of {CLIENTS * PER_CLIENT} dropped: {failures[:2]}"
        assert len(answered) == CLIENTS * PER_CLIENT
        assert rc == 0, text[-2000:]
        assert "drained in" in text, text[-2000:]
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(30)
        log.close()
