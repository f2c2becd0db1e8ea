"""A real two-node Ray cluster on this machine: a head and a second node started with
`ray start` (own resources, own temp dir, loopback only), for tests that need work to run on
two nodes (tests/test_multinode.py). runbooks/ray_cluster.md shows the same commands
(`head_command`, `worker_command`; tests/unit/test_kuberay_manifests.py compares them).

    # inside a private network namespace (`netns_command`): see RUNTIME_ENV
    with two_node_cluster(tmp_path) as cluster:     # the head's GCS answers
        ray.init(address=cluster.address)
        wait_for_nodes(2)
        ...
    # on exit: each node's `ray start --block` process group is terminated (SIGTERM, then
    # SIGKILL): only this cluster's processes, never another Ray on the machine (`ray stop`
    # would stop every Ray runtime of the user, other sessions' included)

Each node gets its own ports (GCS, node manager, object manager, dashboard agent, runtime-env
agent, metrics, client server): two raylets on one host must not share any. Sized for a small
machine (platform notes): 1 CPU per node, a 100 MB object store each, dashboard off.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
OBJECT_STORE_BYTES = 100 * 1024 * 1024
HEAD_RESOURCE = "head"
"""Custom resource only the head offers (1 unit): pins actors to the head node."""
WORKER_RESOURCE = "worker_node"
"""Custom resource only the second node offers (1 unit)."""
RUNTIME_ENV = {"RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "1",
               "RAY_AUTH_MODE": "disabled",  # else the second node fails on the token file
               "RAY_DEDUP_LOGS": "0", "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
"""The nodes' environment. RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0 (the single-machine setting
that binds Ray's services to 127.0.0.1) makes `ray start --address` refuse to join ("Multi-node
Ray clusters are not supported on Windows and OSX"), and with it set to 1 a node rewrites a
127.0.0.1 address to the machine's IP: so the cluster runs inside a private network namespace
(`netns_command`), where loopback is the only interface and the node IP is 127.0.0.1."""


def netns_command(argv: list[str]) -> list[str] | None:
    """`argv` run in a new network namespace with only `lo` up (`unshare -n`): nothing it or
    its Ray nodes open is reachable from outside. None when namespaces cannot be made here
    (no `unshare`/`ip`, or not permitted)."""
    import shutil

    if not (shutil.which("unshare") and shutil.which("ip")):
        return None
    probe = subprocess.run(["unshare", "-n", "ip", "link", "set", "lo", "up"],
                           capture_output=True)
    if probe.returncode != 0:
        return None
    return ["unshare", "-n", "bash", "-c", 'ip link set lo up && exec "$@"', "netns", *argv]


@contextlib.contextmanager
def netns_script_report(script: str | Path, prefix: str, timeout_s: float, *, logs_key: str,
                        cluster_subdir: str = "") -> Iterator[dict]:
    """Run `python SCRIPT ROOT ROOT/out.json` in a private network namespace (`netns_command`;
    `RUNTIME_ENV`, this tree on PYTHONPATH), ROOT a fresh /tmp/`prefix`* folder (short: Ray's
    unix socket paths must stay below ~107 characters); yield its JSON report once it exited
    0 without an "error" (else AssertionError with the exit code, the error, the report's
    `logs_key` and stderr's tail). Always: SIGKILL the node process groups the script recorded
    under ROOT/`cluster_subdir` (`stop_recorded`, should it have been killed first), remove ROOT.
    Callers check `netns_command(["true"])` first (and skip with their reason)."""
    import json
    import shutil
    import sys
    import tempfile

    root = Path(tempfile.mkdtemp(prefix=prefix, dir="/tmp"))
    out = root / "out.json"
    cmd = netns_command([sys.executable, str(script), str(root), str(out)])
    try:
        assert cmd is not None, "no private network namespace here (unshare -n / ip link)"
        proc = subprocess.run(cmd, cwd=REPO, env=_env(), capture_output=True, text=True,
                              timeout=timeout_s)
        data = json.loads(out.read_text()) if out.exists() else {}
        assert proc.returncode == 0 and "error" not in data, (
            f"rc={proc.returncode} {data.get('error')}\n{data.get(logs_key, '')}\n"
            f"{proc.stderr[-4000:]}")
        yield data
    finally:
        stop_recorded(root / cluster_subdir)
        shutil.rmtree(root, ignore_errors=True)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _node_ports() -> list[str]:
    """The per-node ports two raylets on one host must not share, as `ray start` flags."""
    names = ("node-manager-port", "object-manager-port", "dashboard-agent-listen-port",
             "dashboard-agent-grpc-port", "runtime-env-agent-port", "metrics-export-port")
    return [f"--{n}={free_port()}" for n in names]


def head_command(port: int, temp_dir: str | Path) -> list[str]:
    """`ray start` for the head: GCS on 127.0.0.1:`port`, 1 CPU, the `head` resource."""
    return ["ray", "start", "--head", "--node-ip-address=127.0.0.1", f"--port={port}",
            "--num-cpus=1", '--resources={"head": 1}', f"--temp-dir={temp_dir}",
            "--include-dashboard=false", f"--object-store-memory={OBJECT_STORE_BYTES}",
            f"--ray-client-server-port={free_port()}", *_node_ports(), "--block"]


def worker_command(port: int, temp_dir: str | Path) -> list[str]:
    """`ray start` for the second node: joins 127.0.0.1:`port`, 1 CPU, `worker_node`."""
    return ["ray", "start", f"--address=127.0.0.1:{port}", "--node-ip-address=127.0.0.1",
            "--num-cpus=1", '--resources={"worker_node": 1}', f"--temp-dir={temp_dir}",
            f"--object-store-memory={OBJECT_STORE_BYTES}", *_node_ports(), "--block"]


@dataclass
class LocalCluster:
    address: str
    """The GCS address to `ray.init(address=...)`: 127.0.0.1:<port>."""
    temp_dir: Path
    procs: list[subprocess.Popen] = field(default_factory=list)
    logs: list[Path] = field(default_factory=list)

    def stop(self, grace_s: float = 10.0) -> None:
        """Terminate every node's process group (started here), newest first; SIGKILL what
        is left after `grace_s`."""
        for p in reversed(self.procs):
            with contextlib.suppress(ProcessLookupError):
                os.killpg(p.pid, signal.SIGTERM)
        deadline = time.monotonic() + grace_s
        for p in reversed(self.procs):
            with contextlib.suppress(subprocess.TimeoutExpired):
                p.wait(timeout=max(0.1, deadline - time.monotonic()))
            with contextlib.suppress(ProcessLookupError):
                os.killpg(p.pid, signal.SIGKILL)  # raylet/workers left in the group
        self.procs.clear()

    def tail(self, n: int = 30) -> str:
        """The last `n` lines of each node's `ray start` output (for failure messages)."""
        out = []
        for log in self.logs:
            lines = log.read_text(errors="replace").splitlines() if log.exists() else []
            out.append(f"--- {log.name}\n" + "\n".join(lines[-n:]))
        return "\n".join(out)


def _env() -> dict[str, str]:
    env = {**os.environ, **RUNTIME_ENV}
    # the nodes' workers import the project (env runners build the tuner env) from this tree
    env["PYTHONPATH"] = os.pathsep.join([str(REPO / "src"), str(REPO)]
                                        + [p for p in [os.environ.get("PYTHONPATH")] if p])
    return env


def _ray_bin() -> str:
    import sys

    here = Path(sys.executable).with_name("ray")
    return str(here) if here.exists() else "ray"


def _wait_port(port: int, proc: subprocess.Popen, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"ray start exited with {proc.returncode}")
        with socket.socket() as s:
            if s.connect_ex(("127.0.0.1", port)) == 0:
                return
        time.sleep(0.2)
    raise TimeoutError(f"no GCS on 127.0.0.1:{port} after {timeout_s} s")


def wait_for_nodes(n: int, timeout_s: float = 60.0) -> list[dict]:
    """Poll the connected cluster until `n` nodes are alive; their `ray.nodes()` entries."""
    import ray

    deadline = time.monotonic() + timeout_s
    while True:
        alive = [nd for nd in ray.nodes() if nd.get("Alive")]
        if len(alive) >= n or time.monotonic() > deadline:
            return alive
        time.sleep(0.5)


PGIDS_FILE = "node-pgids.txt"


def stop_recorded(root: str | Path) -> int:
    """SIGKILL the process groups `two_node_cluster(root)` recorded (the fallback when the
    process that started them was killed before its own cleanup); returns how many were
    still there."""
    path = Path(root) / PGIDS_FILE
    n = 0
    for line in path.read_text().split() if path.exists() else []:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(int(line), signal.SIGKILL)
            n += 1
    return n


@contextlib.contextmanager
def two_node_cluster(root: str | Path, timeout_s: float = 90.0) -> Iterator[LocalCluster]:
    """Start a head and a second node under `root` (temp dirs and logs); yield the cluster
    once the head's GCS answers; always stop both nodes on exit. Needs a short `root`
    (Ray's unix socket paths must stay under ~107 characters)."""
    root = Path(root)
    root.mkdir(parents=True, exist_ok=True)
    port = free_port()
    cluster = LocalCluster(f"127.0.0.1:{port}", root / "ray")
    try:
        for name, cmd in (("head", head_command(port, root / "ray-head")),
                          ("worker", worker_command(port, root / "ray-worker"))):
            log = root / f"{name}.log"
            cluster.logs.append(log)
            with log.open("w") as f:
                cluster.procs.append(subprocess.Popen(
                    [_ray_bin(), *cmd[1:]], stdout=f, stderr=subprocess.STDOUT,
                    env=_env(),
                    cwd=REPO, start_new_session=True))  # its own process group: stop() by id
            with (root / PGIDS_FILE).open("a") as f:  # for `stop_recorded` from outside
                f.write(f"{cluster.procs[-1].pid}\n")
            if name == "head":
                _wait_port(port, cluster.procs[0], timeout_s)
        yield cluster
    finally:
        cluster.stop()


@contextlib.contextmanager
def cluster_session(root: Path, out: Path, report: dict, *, started: float | None = None,
                    wall_key: str = "cluster_wall_s") -> Iterator[dict]:
    """A two-node cluster under `root`, the driver connected and both nodes alive; yields
    `report` with "nodes" ({node id: its custom resources}) filled in. On exit (always):
    "error" and the nodes' `ray start` logs if the body raised, `wall_key` = seconds since
    `started` (default: entering), `report` written to `out` as JSON, Ray shut down, the
    cluster stopped. What the multinode scripts (tests/support/multinode_*.py) share."""
    import json

    import ray

    t0 = time.perf_counter() if started is None else started
    with two_node_cluster(root / "c") as cluster:
        try:
            ray.init(address=cluster.address, log_to_driver=False, logging_level="ERROR")
            nodes = wait_for_nodes(2)
            report["nodes"] = {nd["NodeID"]: sorted(k for k in nd["Resources"]
                                                    if k in ("head", "worker_node"))
                               for nd in nodes}
            yield report
        except BaseException as exc:
            report["error"] = f"{type(exc).__name__}: {exc}"
            report["ray_start_logs"] = cluster.tail()
            raise
        finally:
            if ray.is_initialized():
                ray.shutdown()
            report[wall_key] = time.perf_counter() - t0
            out.write_text(json.dumps(report, indent=1))
