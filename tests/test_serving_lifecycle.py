"""Lifecycle of `ragpilot serve` as an operator runs it (a child process, two ingress replicas):
cold start to alive (/healthz) and to ready (/readyz) measured; an edited serve.yaml applied
with SIGHUP (a canary added) without a restart, the interaction store and the API keys kept;
the sockets it listens on beyond loopback are exactly those docs/operations.md lists (one
inter-deployment gRPC port per Serve replica); and SIGTERM in the middle of a bounded load
answers the requests already inside (none dropped, hung or cut), refuses new ones with 503 and
Retry-After (or a refused connection once it has stopped), fails /readyz with `draining` from
the start of the drain, and exits 0.

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


def _listening_beyond_loopback(root: int) -> list[tuple[str, int, str]]:
    """(address, port, process title) of every TCP socket that process `root` or one of its
    descendants listens on at a non-loopback address (0.0.0.0 and :: included)."""
    import psutil

    tree = {root} | {p.pid for p in psutil.Process(root).children(recursive=True)}
    out = []
    for c in psutil.net_connections(kind="tcp"):
        ip = c.laddr.ip.removeprefix("::ffff:")  # an IPv4 address on an IPv6 socket
        if (c.status != psutil.CONN_LISTEN or c.pid not in tree or ip.startswith("127.")
                or ip == "::1"):
            continue
        try:
            title = " ".join(psutil.Process(c.pid).cmdline()).strip() or "?"
        except psutil.Error:
            title = "?"
        out.append((c.laddr.ip, c.laddr.port, title))
    return sorted(out)


def _ephemeral_ports() -> range:
    low, high = map(int, Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split())
    return range(low, high + 1)


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
        # a config change without a restart: the edited file, then SIGHUP (once the server
        # says it is serving: /readyz can answer before `ragpilot serve` has returned from
        # deploying)
        while "ragpilot serving at" not in (tmp_path / "serve.log").read_text():
            assert time.perf_counter() - t0 < 300 and proc.poll() is None
            time.sleep(0.2)
        # docs/operations.md, "What listens where": beyond loopback, one inter-deployment gRPC
        # port per Serve replica on every interface (2 ingress + 1 SharedPipelines here), an
        # ephemeral port owned by that replica's process, and nothing else (a replica opens
        # its port as it finishes starting: up to 30 s for all three)
        want = ["Ingress", "Ingress", "SharedPipelines"]
        t_ports = time.perf_counter()
        while True:
            exposed = _listening_beyond_loopback(proc.pid)
            kinds = sorted(title.split()[0].rsplit(":", 1)[-1] for _, _, title in exposed)
            if kinds == want or time.perf_counter() - t_ports > 30:
                break
            time.sleep(0.5)
        print("listening beyond loopback:", exposed)
        assert kinds == want, exposed
        assert all(ip in ("::", "0.0.0.0") and p in _ephemeral_ports()
                   and title.startswith("ray::ServeReplica:ragpilot:")
                   for ip, p, title in exposed), exposed

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

        # each request: (sent at, outcome) with outcome "200", "503" (draining, Retry-After
        # set), "refused" (no connection: the server has stopped) or what else happened
        results: list[tuple[float, str]] = []
        lock = threading.Lock()
        enough = threading.Event()

        def client(c: int) -> None:
            with httpx.Client(base_url=url, timeout=60) as h:
                for i in range(PER_CLIENT):
                    sent = time.perf_counter()
                    try:
                        r = h.post("/query", json={"question": f"Where was person {i} born?",
                                                   "user_id": f"c{c}-{i}"})
                        if r.status_code == 200 and r.json().get("answer") is not None:
                            outcome = "200"
                        elif (r.status_code == 503 and r.headers.get("retry-after")
                              and r.json().get("field") == "server"):
                            outcome = "503"
                        else:
                            outcome = f"{r.status_code} {r.text[:120]}"
                    except httpx.ConnectError:
                        outcome = "refused"
                    except httpx.HTTPError as exc:  # a hang (timeout) or a cut answer
                        outcome = repr(exc)
                    with lock:
                        results.append((sent, outcome))
                        if sum(o == "200" for _, o in results) >= SIGTERM_AFTER:
                            enough.set()

        threads = [threading.Thread(target=client, args=(c,)) for c in range(CLIENTS)]
        for t in threads:
            t.start()
        assert enough.wait(120), results[-3:]
        t_sig = time.perf_counter()
        proc.send_signal(signal.SIGTERM)
        ready = None  # /readyz from the start of the drain
        while ready is None and time.perf_counter() - t_sig < 3:
            try:
                r = httpx.get(f"{url}/readyz", timeout=5)
                if r.status_code == 503:
                    ready = r.json()
            except httpx.ConnectError:
                break
            time.sleep(0.05)
        for t in threads:
            t.join(120)
        rc = proc.wait(120)
        text = (tmp_path / "serve.log").read_text()
        before = [o for t, o in results if t < t_sig]
        after = [(t - t_sig, o) for t, o in results if t >= t_sig]
        count = {k: sum(o == k for o in before + [o for _, o in after])
                 for k in ("200", "503", "refused")}
        print(f"SIGTERM after {len(before)} requests sent; outcomes {count}; /readyz "
              f"{ready and ready['status']}; exit {rc}")
        assert len(results) == CLIENTS * PER_CLIENT
        # none dropped, hung or cut: an answer, or a clean refusal
        odd = [o for o in before + [o for _, o in after] if o not in count]
        assert not odd, f"{len(odd)} requests neither answered nor refused cleanly: {odd[:2]}"
        # sent before SIGTERM: answered, except at most each client's one request still on its
        # way to an ingress replica when the drain began (refused with 503, never cut)
        assert sum(o != "200" for o in before) <= CLIENTS, before
        assert "refused" not in before
        # sent after SIGTERM: refused; an answer only in the instant before the gate was shut
        assert after and any(o == "503" for _, o in after), after
        assert all(o != "200" for dt, o in after if dt > 1.0), after
        assert ready is not None and ready["status"] == "draining", ready
        assert rc == 0, text[-2000:]
        assert "drained in" in text, text[-2000:]
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(30)
        log.close()
