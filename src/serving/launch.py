"""Start the Serve application from Python: `ragpilot serve`, the tests and the load benchmark.

    url = start_local(args, port=8123)     # Ray (2 CPUs, loopback) + Serve + the app, in-process
    ...
    stop_local()

`ragpilot serve --config configs/serve/default.yaml` does what `serve run <yaml>` does (same
YAML; `args` validated by ServeSettings), with HTTP forced onto 127.0.0.1 unless --host says
otherwise, optionally inside a private network namespace (--private-netns), and stops cleanly
on SIGINT or SIGTERM. The first application's `runtime_env.env_vars` reach every replica as they
do under `serve run` (e.g. RAGPILOT_FAISS_DEVICE, RAGPILOT_OPENSEARCH_URL: the index settings a
deployment overrides, docs/operations.md); other runtime_env keys are left to `serve run`.
"""

from __future__ import annotations

import math
import os
import shutil
import signal
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from rag.errors import ConfigError
from rl.common.runtime import LOCAL_CLUSTER_ENV
from serving.drain import FLAG_ENV, RETRY_AFTER_S

RAY_INIT = {"num_cpus": 2, "include_dashboard": False, "object_store_memory": 200 * 2**20}


def read_serve_yaml(path: str | Path) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """(http_options, applications) of a Serve config file; errors name the key."""
    from ray.serve.schema import HTTPOptionsSchema, ServeApplicationSchema, ServeDeploySchema

    from rag.settings_base import YamlSource

    src = YamlSource.read(path, "config")  # UTF-8, valid YAML, no key written twice
    data = src.data or {}

    def error(loc: tuple, message: str) -> ConfigError:
        return ConfigError(".".join(map(str, loc)), message, source=src.name,
                           line=src.line_of(loc))

    def known(mapping: Any, loc: tuple, schema: Any) -> dict[str, Any]:
        # Serve's own schema names the keys: one it does not have would be ignored here
        if not isinstance(mapping, dict):
            raise error(loc, f"must be a mapping, got {type(mapping).__name__}")
        for key in mapping:
            if key not in schema.__fields__:
                raise error((*loc, key), f"unknown key (Serve's {schema.__name__} has: "
                                         f"{', '.join(sorted(schema.__fields__))})")
        return mapping

    known(data, (), ServeDeploySchema)
    http = known(data.get("http_options") or {}, ("http_options",), HTTPOptionsSchema)
    port = http.get("port")
    if port is not None and (isinstance(port, bool) or not isinstance(port, int)
                             or not 1 <= port <= 65535):
        raise error(("http_options", "port"), f"must be a port number (1-65535), got {port!r}")
    apps = data.get("applications")
    if not isinstance(apps, list) or not apps:
        raise ConfigError("applications", f"{src.name} has no `applications:` list")
    names: dict[str, int] = {}
    for i, a in enumerate(apps):
        known(a, ("applications", i), ServeApplicationSchema)
        if a.get("import_path") not in ("serving.app:build_app", "serving.app:app"):
            raise error(("applications", i, "import_path"),
                        "must be serving.app:build_app (or serving.app:app)")
        name = str(a.get("name", "default"))
        if name in names:
            raise error(("applications", i, "name"), f"{name!r} is also application "
                                                    f"{names[name]}'s name")
        names[name] = i
    return dict(http), apps


def app_env_vars(app: dict[str, Any], i: int = 0) -> dict[str, str]:
    """`runtime_env.env_vars` of one application of a Serve YAML (strings; errors name the key)."""
    env = app.get("runtime_env") or {}
    if not isinstance(env, dict):
        raise ConfigError(f"applications.{i}.runtime_env", "must be a mapping")
    env_vars = env.get("env_vars") or {}
    if not isinstance(env_vars, dict) or not all(
            isinstance(k, str) and isinstance(v, str) for k, v in env_vars.items()):
        raise ConfigError(f"applications.{i}.runtime_env.env_vars",
                          "must map names to strings (quote numbers and booleans)")
    return dict(env_vars)


THROUGHPUT_MODE = "RAY_SERVE_THROUGHPUT_OPTIMIZED"
"""Serve's throughput-optimized mode (user code on the replica's event loop, sync methods still
in a thread pool; router on the caller's loop; buffered request-path logs; direct ingress; GC
frozen after start-up). On for the clusters `start_local` starts (set it to 0 to opt out); an
existing cluster takes it from the environment of its `ray start`. Measured:
`bench/results/serve_load.mode_on.md` (on) against `serve_load.mode_off.md` (off, the same hour),
both with Serve's proxy."""


PROXIES = ("serve", "haproxy")
"""What answers on the HTTP port: `serve`, Ray Serve's Python proxy actor, which forwards each
request to an ingress replica through Ray; `haproxy`, Ray Serve's HAProxy mode (HAProxy, a C
load balancer Serve configures and keeps current, in front of the ingress replicas' own HTTP
servers: direct ingress). HAProxy mode needs the `haproxy` binary and binds the replicas'
ports (30000-31000) and HAProxy's stats (8404) and metrics (9101) ports on every interface
(docs/serving.md: what else changes). `PROXY_ENV` picks the default."""
PROXY_ENV = "RAGPILOT_SERVE_PROXY"
DRAIN_ENV, LOCAL_DRAIN_S = "RAY_SERVE_DIRECT_INGRESS_MIN_DRAINING_PERIOD_S", "2"
"""With direct ingress (on in the throughput-optimized mode) Serve keeps a stopping ingress
replica alive at least 30 s so that an external load balancer can deregister it: every
`stop_local` waited 31.6 s (6.6 s at 2 s). The clusters `start_local` starts have no external
balancer (Serve's proxy, or the HAProxy Serve itself reconfigures), so they drain for 2 s
unless the variable is set; a cluster behind a cloud load balancer keeps Ray's default."""
HAPROXY_ENV = "RAY_SERVE_ENABLE_HA_PROXY"


def resolve_proxy(proxy: str | None) -> str:
    """`proxy`, or $RAGPILOT_SERVE_PROXY, or `haproxy` when Ray's own switch
    ($RAY_SERVE_ENABLE_HA_PROXY=1) is set, else `serve`; a typed error names a bad value."""
    value = (proxy or os.environ.get(PROXY_ENV)
             or ("haproxy" if os.environ.get(HAPROXY_ENV) == "1" else "serve"))
    if value not in PROXIES:
        field = "proxy" if proxy else PROXY_ENV
        raise ConfigError(field, f"must be one of {', '.join(PROXIES)}, got {value!r}")
    return value


def haproxy_binary() -> str | None:
    """The haproxy executable Serve would run ($RAY_SERVE_HAPROXY_BINARY_PATH, else PATH,
    else /usr/sbin), or None."""
    env = os.environ.get("RAY_SERVE_HAPROXY_BINARY_PATH")
    if env:
        return env if os.access(env, os.X_OK) else None
    return shutil.which("haproxy") or shutil.which("haproxy", path="/usr/sbin:/usr/local/sbin")


_SET_ENV: dict[str, str | None] = {}
"""Variables `start_local` set for the cluster it started, with their values before (None: unset);
`stop_local` puts them back, so the next cluster this process starts chooses its proxy afresh."""
_RUN_DIRS: list[Path] = []


def _set_env(var: str, value: str, overwrite: bool = True) -> None:
    if not overwrite and var in os.environ:
        return
    _SET_ENV.setdefault(var, os.environ.get(var))
    os.environ[var] = value


def _haproxy_env() -> None:
    """Environment of a cluster this process starts in HAProxy mode: the binary, and HAProxy's
    config, admin socket and server-state files in a directory of its own (Ray's default is one
    fixed /tmp/haproxy-serve for every cluster on the machine). The directory is short on
    purpose: Serve adds a 56-character subdirectory and HAProxy refuses an admin socket path
    longer than 97 characters."""
    exe = haproxy_binary()
    if exe is None:
        raise ConfigError("proxy", "haproxy mode needs the haproxy binary (Debian: apt-get "
                                   "install haproxy; or set RAY_SERVE_HAPROXY_BINARY_PATH)")
    run_dir = Path(tempfile.mkdtemp(prefix="rph-", dir="/tmp" if os.path.isdir("/tmp") else None))
    _RUN_DIRS.append(run_dir)
    for var, value in (("RAY_SERVE_HAPROXY_BINARY_PATH", exe),
                       ("RAY_SERVE_HAPROXY_CONFIG_FILE_LOC", run_dir / "haproxy.cfg"),
                       ("RAY_SERVE_HAPROXY_SOCKET_PATH", run_dir / "admin.sock"),
                       ("RAY_SERVE_HAPROXY_SERVER_STATE_BASE", run_dir),
                       ("RAY_SERVE_HAPROXY_SERVER_STATE_FILE", run_dir / "server-state")):
        _set_env(var, str(value), overwrite=False)
    _set_env(HAPROXY_ENV, "1")


def start_local(args: dict[str, Any] | None = None, host: str = "127.0.0.1", port: int = 8000,
                name: str = "ragpilot", route_prefix: str = "/", private_netns: bool = False,
                log_to_driver: bool = False, env_vars: dict[str, str] | None = None,
                proxy: str | None = None, app: Any = None) -> str:
    """Start Ray + Serve in this process and deploy the app; returns its base URL once ready.
    The app (`app`, else `build_app(args)`) is built first, so bad settings or a served index
    of another corpus (`serving.app.preflight`) are refused before Ray starts.
    With `private_netns`, first move into a private network namespace (if permitted).
    `env_vars` go into the job's runtime_env, which every replica inherits. `proxy`: `serve`
    or `haproxy` (`PROXIES`; None: `resolve_proxy`'s default)."""
    import ray
    from ray import serve

    from serving import netns
    from serving.app import build_app

    if app is None:
        app = build_app(args)
    proxy = resolve_proxy(proxy)
    if ray.is_initialized() and (proxy == "haproxy") != (os.environ.get(HAPROXY_ENV) == "1"):
        # a cluster this process did not start (or started in the other mode) keeps its proxy
        raise ConfigError("proxy", f"{proxy!r} asked for, but Ray was started in this process "
                                   f"with {HAPROXY_ENV}={os.environ.get(HAPROXY_ENV)}: the "
                                   "proxy is chosen when the cluster starts")
    if private_netns and not ray.is_initialized() and not netns.enter_private_netns():
        print(f"note: not isolated ({netns.last_error}); HTTP stays on {host}")
    if not ray.is_initialized():
        # this process starts the cluster, so Serve's controller, proxy and replicas inherit
        # its environment: Serve's throughput-optimized mode unless the caller set the variable
        # (THROUGHPUT_MODE), and HAProxy mode when asked for
        os.environ.setdefault(THROUGHPUT_MODE, "1")
        _set_env(DRAIN_ENV, LOCAL_DRAIN_S, overwrite=False)
        for var, value in LOCAL_CLUSTER_ENV.items():  # rl.common.runtime says why
            _set_env(var, value, overwrite=False)
        if proxy == "haproxy":
            _haproxy_env()
        else:
            _set_env(HAPROXY_ENV, "0")
        extra = {"runtime_env": {"env_vars": dict(env_vars)}} if env_vars else {}
        on_sigterm = signal.getsignal(signal.SIGTERM)
        ray.init(**RAY_INIT, log_to_driver=log_to_driver, **extra)
        _keep_sigterm_handler(on_sigterm)
    serve.start(http_options={"host": host, "port": port},
                logging_config={"enable_access_log": _access_log(args)})
    serve.run(app, name=name, route_prefix=route_prefix)
    return f"http://{host}:{port}"


def _keep_sigterm_handler(handler: Any) -> None:
    """Put back the caller's SIGTERM handler that `ray.init` replaced. A driver's `ray.init`
    installs `sys.exit(15)` for SIGTERM, so a handler installed before it (`run_server`'s drain)
    would never run: the process exited with 15 mid-load and dropped the requests in flight.
    Without a handler of the caller's own (SIG_DFL, SIG_IGN, None) Ray's stays."""
    if callable(handler) and threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGTERM, handler)


def _access_log(args: dict[str, Any] | None) -> bool:
    """The proxy's access log follows the app's `access_log` setting (ServeSettings)."""
    from serving.schemas import ServeSettings

    return ServeSettings.from_args(args).access_log


def update_app(args: dict[str, Any] | None, name: str = "ragpilot",
               route_prefix: str = "/") -> None:
    """Serve's own config update, from the driver: deploy the application again with new
    args (e.g. other declared variants or traffic); Serve replaces the deployments whose args
    or options changed. The declarative equivalent is `serve deploy` / `serve run` of the
    edited YAML. Never called from inside a replica."""
    from ray import serve

    from serving.app import build_app

    serve.run(build_app(args), name=name, route_prefix=route_prefix)


def stop_local() -> None:
    """Shut Serve and Ray down; put back the environment `start_local` set and remove HAProxy's
    directory."""
    import ray
    from ray import serve

    if ray.is_initialized():  # else serve.shutdown() starts a local Ray only to find nothing
        serve.shutdown()
        ray.shutdown()
    for var, before in _SET_ENV.items():
        if before is None:
            os.environ.pop(var, None)
        else:
            os.environ[var] = before
    _SET_ENV.clear()
    while _RUN_DIRS:
        shutil.rmtree(_RUN_DIRS.pop(), ignore_errors=True)


DRAIN_TIMEOUT_S = 30.0
"""Longest wait (s) for in-flight requests after SIGTERM before Serve is shut down anyway."""


DEREGISTER_S = float(RETRY_AFTER_S)
"""Shortest drain (s): how long `/readyz` says `draining` and new requests get 503 before the
listener closes, so a load balancer health-checking `/readyz` (or honouring `Retry-After`) has
moved its clients elsewhere; a client still sending when the listener closes gets a refused
connection."""


def inflight(url: str, timeout_s: float = 5.0) -> float | None:
    """Requests in flight over every ingress replica: the sum of `ragpilot_inflight` on
    `url`/metrics (each replica's own, published every `ingress.metrics_interval_s`); None
    when nothing accepts the connection (the app has stopped); NaN when the read failed
    otherwise (no answer within `timeout_s` seconds, a cut reply): unknown, not quiet."""
    import httpx
    from prometheus_client.parser import text_string_to_metric_families

    try:
        text = httpx.get(f"{url}/metrics", timeout=timeout_s).text
    except httpx.ConnectError:
        return None
    except httpx.HTTPError:
        return math.nan
    return sum(x.value for fam in text_string_to_metric_families(text) for x in fam.samples
               if x.name == "ragpilot_inflight")


def drain(url: str, quiet_s: float, timeout_s: float = DRAIN_TIMEOUT_S,
          give_up: threading.Event | None = None, read_timeout_s: float = 5.0,
          min_s: float = 0.0) -> bool:
    """Wait until no request is in flight on any ingress replica for `quiet_s` seconds in a
    row (longer than the replicas' metrics interval, so every replica's published count is
    from the quiet time) and at least `min_s` seconds in all (the app says `draining` that
    long before it stops listening), at most `timeout_s`, or until `give_up` is set. A count that cannot
    be read (`inflight` NaN: a busy app answering /metrics later than `read_timeout_s`)
    counts as busy. Prints one line a second while it waits. True when the app went quiet
    (or no longer accepts connections)."""
    start = quiet_since = time.monotonic()
    last_print = 0.0
    while True:
        n = inflight(url, read_timeout_s)
        now = time.monotonic()  # after the read: a busy answer restarts the quiet window
        if n is None:
            return True
        if math.isnan(n) or n > 0:  # busy, or unknown
            quiet_since = now
        elif now - quiet_since >= quiet_s and now - start >= min_s:
            return True
        count = "unknown (/metrics unread)" if math.isnan(n) else f"{n:g}"
        if now - start >= timeout_s or (give_up is not None and give_up.is_set()):
            print(f"drain: {count} request(s) still in flight after {now - start:.1f} s; "
                  "stopping anyway", flush=True)
            return False
        if now - last_print >= 1.0:
            print(f"drain: {count} request(s) in flight, {now - start:.1f} s of at most "
                  f"{timeout_s:g} s", flush=True)
            last_print = now
        time.sleep(0.1)


def reload_apps(config: str | Path, running: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Apply an edited Serve YAML to the running applications in place (Serve's own config
    update: deployments whose args or options changed are replaced, the HTTP server, Ray and
    the interaction store stay). Every application is checked (`build_app`) before any is
    updated; an invalid file changes nothing and is reported. The store keeps every row, and
    the run-time routing comes back when the file's routing is unchanged
    (serving.routing_state). Returns the applications now running."""
    from ray import serve

    from serving.app import build_app

    try:
        http, apps = read_serve_yaml(config)
        if [a.get("name", "ragpilot") for a in apps] != [a.get("name", "ragpilot")
                                                         for a in running]:
            raise ConfigError("applications", "names or order changed: that needs a restart")
        built = [build_app(a.get("args")) for a in apps]
    except ConfigError as exc:
        print(f"reload refused, nothing changed: {exc}", flush=True)
        return running
    t0 = time.monotonic()
    for a, app in zip(apps, built, strict=True):
        serve.run(app, name=a.get("name", "ragpilot"), route_prefix=a.get("route_prefix", "/"))
    print(f"reloaded {config} in {time.monotonic() - t0:.1f} s "
          f"({len(apps)} application(s))", flush=True)
    return apps


def run_server(config: str | Path, host: str | None = None, port: int | None = None,
               private_netns: bool = False, proxy: str | None = None,
               drain_timeout_s: float = DRAIN_TIMEOUT_S) -> int:
    """Deploy every application of a Serve YAML and block until SIGINT/SIGTERM; `proxy`: see
    `PROXIES`. On the first signal the app stops taking requests (`/readyz` 503 `draining`,
    any other new request 503 with Retry-After: serving.drain), the requests in flight are
    answered before Serve stops (`drain`, at most `drain_timeout_s`), and 0 is returned; a
    second signal stops at once."""
    from ray import serve

    from serving.app import build_app
    from serving.schemas import ServeSettings

    t_start = time.monotonic()
    # handlers first: a signal during start-up is acted on once the app is up (SIGHUP's default
    # action would kill the process)
    stop, force, reload = threading.Event(), threading.Event(), threading.Event()
    flag = Path(tempfile.gettempdir()) / f"ragpilot-draining-{os.getpid()}"
    flag.unlink(missing_ok=True)  # a killed earlier process with this pid may have left one
    _set_env(FLAG_ENV, str(flag))  # inherited by every replica of the cluster started below

    def on_signal(*_) -> None:
        flag.touch()  # from now on /readyz says draining and new requests get 503
        (force if stop.is_set() else stop).set()

    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, on_signal)
    signal.signal(signal.SIGHUP, lambda *_: reload.set())
    http, apps = read_serve_yaml(config)
    built = [build_app(a.get("args")) for a in apps]  # every one checked before any starts
    print(f"serve: {config} checked ({len(apps)} application(s)); starting Ray and Serve, "
          "then the replicas (each loads its indexes and models)", flush=True)
    env_vars = app_env_vars(apps[0])
    host = host or http.get("host") or "127.0.0.1"
    port = int(port or http.get("port") or 8000)
    url = ""
    for i, a in enumerate(apps):
        if i == 0:
            url = start_local(a.get("args"), host, port, a.get("name", "ragpilot"),
                              a.get("route_prefix", "/"), private_netns, log_to_driver=True,
                              env_vars=env_vars, proxy=proxy, app=built[0])
        else:
            serve.run(built[i], name=a.get("name", f"app{i}"),
                      route_prefix=a.get("route_prefix"))
    print(f"serve: ready after {time.monotonic() - t_start:.1f} s", flush=True)
    print(f"ragpilot serving at {url} (docs: {url}/docs; proxy: {resolve_proxy(proxy)}; "
          f"pid {os.getpid()}); SIGHUP reloads {config}, Ctrl-C or SIGTERM stops it",
          flush=True)
    while not stop.is_set():
        if reload.is_set():
            reload.clear()
            apps = reload_apps(config, apps)
        time.sleep(0.2)
    quiet = ServeSettings.from_args(apps[0].get("args")).ingress.metrics_interval_s + 0.5
    print(f"stopping: new requests get 503, /readyz says draining; answering the requests "
          f"in flight first (at most {drain_timeout_s:g} s; signal again to stop now)",
          flush=True)
    t0 = time.monotonic()
    drain(url.rstrip("/") + (apps[0].get("route_prefix") or "/").rstrip("/"), quiet,
          drain_timeout_s, force, min_s=min(DEREGISTER_S, drain_timeout_s))
    print(f"drained in {time.monotonic() - t0:.1f} s; shutting Serve down", flush=True)
    stop_local()
    flag.unlink(missing_ok=True)
    return 0
