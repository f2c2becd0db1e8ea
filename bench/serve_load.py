"""Load benchmark of `ragpilot serve` as an operator runs it (synthetic world, 127.0.0.1).

    python bench/serve_load.py                 # full (~5 min on 2 cores)
    python bench/serve_load.py --quick         # < 2 min, fewer requests (serve_load.quick.*)
    python bench/serve_load.py --proxy serve   # Serve's Python proxy (default auto: below)

The server is `python -m serving.cli serve` in a child process (2 ingress replicas, 1 shared
pipeline replica, API keys and request logs on: the defaults), in a private network namespace
when permitted. Phases, each bounded in requests:
  1. cold start: s from the process start to /healthz 200 and to /readyz 200;
  2. latency p50/p95/p99 (ms, client side) and throughput at 1, 4, 16 clients, then 16 again;
     at 16 clients also the median of each stage the server reports in the answers'
     `latency_ms` (retrieval, generation, ..., `pipeline`: the ingress's wait for the replica,
     `store`, `total`) and how many answers had a `signals` stage (the reference-free signals
     are scored after the reply, so none should);
  3. logging cost: 16-client throughput in rounds with request logs on and off (serve.yaml
     edited + SIGHUP, the in-place update; order on off | off on | ...), pooled ratio with a
     paired bootstrap CI over rounds;
  4. memory: RSS of every Serve replica process before/after 4 config variants are added at
     run time (`/admin/traffic`), 30 questions each;
  5. SIGTERM after a third of a bounded 16-client load is answered: requests dropped (no
     answer, a cut one, or an error other than the drain's clean 503 / a refused connection),
     requests refused while draining, exit code, seconds to exit.
Targets: p95 ≤ 500 ms at 16 clients, `throughput_ratio_logging_on_vs_off` ≥ 0.95,
`dropped_on_sigterm` = 0, `rss_mb_per_variant` ≤ 150 MB. Proxy auto: $RAGPILOT_SERVE_PROXY when
set (bench/serve_ab.py pins it), else haproxy when installed (docs/serving.md: 31-39% less CPU
per request than Serve's proxy), else serve.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import yaml

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.common import make_meta, plain_row, write_results  # noqa: E402
from rl.stats.bootstrap import bootstrap_statistic  # noqa: E402

DS = "synthetic"
SYNC_WAIT_S = 0.5
EXTRA_VARIANTS = [{"k": 3}, {"k": 7, "fusion_weight": 0.7}, {"variant": "dense", "k": 4},
                  {"variant": "bm25", "k": 6}]  # added at run time in the memory phase


def ci_row(system: str, metric: str, stat, n: int, seed: int) -> dict:
    """`stat(idx)` over n rows (`idx`: resamples × n row indices, one value per resample) with
    a 95% bootstrap CI (2,000 resamples; arrays indexed alike are resampled as pairs)."""
    lo, hi = np.quantile(bootstrap_statistic(stat, n, 2000, seed), [0.025, 0.975])
    return {"dataset": DS, "system": system, "metric": metric,
            "value": float(stat(np.arange(n)[None])[0]), "ci_low": float(lo),
            "ci_high": float(hi), "n": int(n)}


async def load(url: str, payloads: list[dict], concurrency: int, path: str = "/query",
               on_answer=None) -> tuple[list[tuple[int, float, dict]], float]:
    """POST every payload with `concurrency` workers; [(status, client ms, body)] (status 0:
    no HTTP answer, e.g. the connection was closed), wall s. `on_answer(n)` is called with the
    number of 200s so far after each one."""
    import httpx

    out: list[tuple[int, float, dict]] = [(0, 0.0, {})] * len(payloads)
    nxt, answered = iter(range(len(payloads))), [0]
    limits = httpx.Limits(max_connections=concurrency, max_keepalive_connections=concurrency)
    async with httpx.AsyncClient(base_url=url, timeout=60.0, limits=limits) as client:
        async def worker() -> None:
            for i in nxt:
                t0 = time.perf_counter()
                try:
                    r = await client.post(path, json=payloads[i])
                except httpx.HTTPError as exc:
                    out[i] = (0, 0.0, {"error": repr(exc)})
                    continue
                out[i] = (r.status_code, (time.perf_counter() - t0) * 1000.0,
                          r.json() if r.status_code < 500 else {})
                if r.status_code == 200 and on_answer is not None:
                    answered[0] += 1
                    on_answer(answered[0])

        t0 = time.perf_counter()
        await asyncio.gather(*(worker() for _ in range(concurrency)))
        return out, time.perf_counter() - t0


def admin_key(keys_file: str | Path) -> dict[str, str]:
    """Create an `admin` key in `keys_file` (the app's `auth.keys_file`) as `ragpilot keys
    create --role admin` does; the request headers that send it."""
    from serving.auth import KeyFile

    token, rec = KeyFile(keys_file).create("admin", name="bench/serve_load")
    print(f"admin key {rec.id} created in {keys_file}", flush=True)
    return {"Authorization": f"Bearer {token}"}


def set_traffic(url: str, headers: dict[str, str], **body) -> dict:
    """POST /admin/traffic with the admin key's `headers`."""
    import httpx

    r = httpx.post(f"{url}/admin/traffic", json=body, headers=headers, timeout=120)
    r.raise_for_status()
    # the other ingress replicas adopt the change within ingress.sync_interval_s (0.2 s):
    # measure the new split, not that window
    time.sleep(SYNC_WAIT_S)
    return r.json()


def replica_rss() -> dict[str, float]:
    """Resident memory (MB) of each Ray Serve replica process, keyed by its title + pid."""
    import psutil

    out: dict[str, float] = {}
    for proc in psutil.process_iter(["pid", "cmdline", "memory_info"]):
        cmd = proc.info.get("cmdline") or []
        if cmd and cmd[0].startswith("ray::ServeReplica") and proc.info.get("memory_info"):
            out[f"{cmd[0]}#{proc.info['pid']}"] = proc.info["memory_info"].rss / 2**20
    return out


class Server:
    """`python -m serving.cli serve --config <tmp>/serve.yaml` in a child process; `logs`
    switches the request logs in the YAML, applied to the running app with SIGHUP."""

    def __init__(self, tmp: Path, port: int, proxy: str):
        self.tmp, self.url, self.proxy = tmp, f"http://127.0.0.1:{port}", proxy
        self.yaml, self.log = tmp / "serve.yaml", tmp / "serve.log"
        self.args = {"store_url": str(tmp / "interactions.sqlite"), "canary": {"variant": "bm25"},
                     "auth": {"enabled": True, "keys_file": str(tmp / "keys.json")},
                     "traffic": {"canary_percent": 0.0},
                     "limits": {"max_inflight": 512, "rate_per_s": 1e6, "burst": 1e6},
                     "ingress": {"replicas": 2, "sync_interval_s": 0.2},
                     "pipelines": {"num_replicas": 1, "autoscaling": None, "num_cpus": 0.1,
                                   "max_ongoing_requests": 32}}
        self.write(logs=True)
        self.t0 = time.perf_counter()
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "serving.cli", "serve", "--config", str(self.yaml),
             "--proxy", proxy], stdout=self.log.open("w"), stderr=subprocess.STDOUT)

    def write(self, logs: bool) -> None:
        self.args["logs"] = {"enabled": logs}
        self.yaml.write_text(yaml.safe_dump({
            "http_options": {"host": "127.0.0.1", "port": int(self.url.rsplit(":", 1)[1])},
            "applications": [{"name": "ragpilot", "route_prefix": "/",
                              "import_path": "serving.app:build_app", "args": self.args}]}))

    def text(self) -> str:
        return self.log.read_text(errors="replace")

    def wait_for(self, path: str, timeout: float = 300.0) -> float:
        """Seconds from the start to the first 200 on `path`."""
        import httpx

        while time.perf_counter() - self.t0 < timeout:
            if self.proc.poll() is not None:
                raise SystemExit(f"server exited {self.proc.returncode}:\n{self.text()[-3000:]}")
            try:
                if httpx.get(self.url + path, timeout=2).status_code == 200:
                    return time.perf_counter() - self.t0
            except httpx.HTTPError:
                pass
            time.sleep(0.1)
        raise SystemExit(f"{path}: no 200 in {timeout:.0f} s:\n{self.text()[-3000:]}")

    def reload(self, logs: bool) -> None:
        """Edit serve.yaml and SIGHUP; return once the server printed `reloaded`."""
        n, t0 = self.text().count("reloaded "), time.perf_counter()
        self.write(logs)
        self.proc.send_signal(signal.SIGHUP)
        while self.text().count("reloaded ") == n:
            if "reload refused" in self.text() or time.perf_counter() - t0 > 180:
                raise SystemExit(f"reload failed:\n{self.text()[-3000:]}")
            time.sleep(0.2)
        print(f"logs {'on' if logs else 'off'}: reloaded in {time.perf_counter() - t0:.1f} s",
              flush=True)

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            self.proc.wait(120)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--proxy", choices=("auto", "serve", "haproxy"), default="auto",
                    help="what answers on the HTTP port (serving.launch.PROXIES); auto: "
                         "$RAGPILOT_SERVE_PROXY when set, else haproxy when installed, else serve")
    args = ap.parse_args()
    q = args.quick
    n_c = {1: 60, 4: 100, 16: 160} if q else {1: 200, 4: 400, 16: 1000}
    rounds, n_round, n_sigterm = (2, 160, 160) if q else (4, 400, 320)
    rng = np.random.default_rng(args.seed)

    from rag.corpus.synthetic import make_synthetic_world
    from serving import netns
    from serving.launch import PROXY_ENV, haproxy_binary, resolve_proxy

    proxy = resolve_proxy(args.proxy if args.proxy != "auto" else (
        os.environ.get(PROXY_ENV) or ("haproxy" if haproxy_binary() else "serve")))
    examples = list(make_synthetic_world().examples)
    rows: list[dict] = []
    t_start = time.perf_counter()

    def payloads(n: int) -> list[dict]:
        return [{"question": examples[i].question, "category": examples[i].category,
                 "user_id": f"user-{rng.integers(1 << 62)}"}
                for i in rng.integers(0, len(examples), size=n)]

    isolated = netns.enter_private_netns()
    tmp = Path(tempfile.mkdtemp(prefix="serve-load-"))
    admin = admin_key(tmp / "keys.json")
    srv = Server(tmp, netns.free_port(), proxy)
    url = srv.url
    try:
        # 1. cold start
        alive_s, ready_s = srv.wait_for("/healthz"), srv.wait_for("/readyz")
        rows += [plain_row(DS, "ragpilot serve", "cold_start_to_alive_s", alive_s, 1),
                 plain_row(DS, "ragpilot serve", "cold_start_to_ready_s", ready_s, 1)]
        print(f"cold start: alive {alive_s:.1f} s, ready {ready_s:.1f} s (isolated={isolated}, "
              f"proxy={proxy})", flush=True)
        while "ragpilot serving at" not in srv.text():  # SIGHUP is acted on from here on
            if srv.proc.poll() is not None or time.perf_counter() - srv.t0 > 300:
                raise SystemExit(f"server not serving:\n{srv.text()[-3000:]}")
            time.sleep(0.2)
        asyncio.run(load(url, payloads(20), 2))  # warm connections and replicas

        # 2. latency and throughput by client count (logs on)
        table, load_avg, stages = [], {}, {}
        for c, n, name in [(c, n, f"serve/c={c}") for c, n in n_c.items()] + [
                (16, n_c[16], "serve/c=16 2nd run")]:
            load_avg[name] = os.getloadavg()[0]  # the machine is shared: say how busy it was
            res, wall = asyncio.run(load(url, payloads(n), c))
            ms = [r[1] for r in res if r[0] == 200]
            x = np.asarray(ms)
            rows += [ci_row(name, f"latency_p{p}_ms", lambda i, p=p, x=x: np.percentile(
                x[i], p, axis=1), x.size, args.seed) for p in (50, 95, 99)]
            rows += [plain_row(DS, name, "throughput_rps", len(ms) / wall, len(ms)),
                     plain_row(DS, name, "errors", len(res) - len(ms), len(res)),
                     plain_row(DS, name, "loadavg_1m_start", load_avg[name], 1)]
            if name == "serve/c=16":  # where the time of a request goes, server side
                lats = [r[2].get("latency_ms") or {} for r in res if r[0] == 200]
                stages = {k: float(np.median([x[k] for x in lats if k in x]))
                          for k in sorted({k for x in lats for k in x})}
                rows += [plain_row(DS, name, f"stage_{k}_ms_p50", v, len(lats))
                         for k, v in stages.items()]
                rows.append(plain_row(DS, name, "answers_with_signals_stage",
                                      sum("signals" in x for x in lats), len(lats)))
                print("c=16 stages (median ms): " + ", ".join(
                    f"{k} {v:.1f}" for k, v in stages.items()), flush=True)
            table.append((name.removeprefix("serve/"), *np.percentile(ms, [50, 95, 99]),
                          len(ms) / wall, len(res) - len(ms)))
            print(f"{name}: p50 {table[-1][1]:.1f} p95 {table[-1][2]:.1f} ms, "
                  f"{table[-1][4]:.1f} req/s", flush=True)

        # 3. logging on vs off at 16 clients, interleaved rounds (one reload per round; an
        #    even number of rounds ends with the logs on)
        runs: dict[bool, list[tuple[int, float]]] = {True: [], False: []}
        logs_now = True
        for r in range(rounds):
            for logs in ((True, False) if r % 2 == 0 else (False, True)):
                if logs != logs_now:
                    srv.reload(logs)
                    logs_now = logs
                    asyncio.run(load(url, payloads(16), 4))  # warm the new replicas
                res, wall = asyncio.run(load(url, payloads(n_round), 16))
                runs[logs].append((sum(x[0] == 200 for x in res), wall))
                print(f"round {r + 1}/{rounds} logs {'on' if logs else 'off'}: "
                      f"{runs[logs][-1][0] / wall:.1f} req/s", flush=True)
        log_lines = sum(len(f.read_bytes().splitlines()) for f in tmp.rglob("requests-*.jsonl"))
        on, off = np.asarray(runs[True], float), np.asarray(runs[False], float)
        ratio = ci_row("serve/c=16 logs on vs off", "throughput_ratio_logging_on_vs_off",
                       lambda i: (on[i, 0].sum(-1) / on[i, 1].sum(-1))
                       / (off[i, 0].sum(-1) / off[i, 1].sum(-1)), rounds, args.seed)
        rows += [ratio, plain_row(DS, "serve/c=16 logs on vs off", "request_log_lines",
                                  log_lines, sum(n for n, _ in runs[True] + runs[False]))]
        thr = {k: sum(n for n, _ in v) / sum(w for _, w in v) for k, v in runs.items()}
        print(f"logging on/off throughput {ratio['value']:.3f} ({log_lines} log lines)",
              flush=True)

        # 4. resident memory added per run-time variant (all Serve replica processes)
        set_traffic(url, admin, canary_percent=100.0)
        asyncio.run(load(url, payloads(30), 4))
        rss0 = replica_rss()
        for extra in EXTRA_VARIANTS:
            set_traffic(url, admin, canary_config=extra, canary_percent=100.0)
            asyncio.run(load(url, payloads(30), 4))
        rss1 = replica_rss()
        set_traffic(url, admin, canary_percent=0.0)
        per_variant = (sum(rss1.values()) - sum(rss0.values())) / len(EXTRA_VARIANTS)
        pipeline_rss = max(v for k, v in rss1.items() if "SharedPipelines" in k)
        rows += [plain_row(DS, "serve/shared pipelines", "rss_mb_per_variant", per_variant, 4),
                 plain_row(DS, "serve/shared pipelines", "pipeline_replica_rss_mb", pipeline_rss,
                           1)]
        print(f"RSS per extra variant {per_variant:.1f} MB", flush=True)

        # 5. SIGTERM in the middle of a bounded load
        sent: list[float] = []

        def sigterm_at_a_third(n: int) -> None:
            if n >= n_sigterm // 3 and not sent:
                srv.proc.send_signal(signal.SIGTERM)
                sent.append(time.perf_counter())

        res, _ = asyncio.run(load(url, payloads(n_sigterm), 16, on_answer=sigterm_at_a_third))
        rc = srv.proc.wait(180)
        exit_s = time.perf_counter() - sent[0]
        # refused cleanly while draining (503 with Retry-After: serving.drain) or after the
        # server stopped (no connection) is not dropped; a cut or missing answer is
        refused = [x for x in res if x[0] == 503 or "ConnectError" in x[2].get("error", "")]
        dropped = [x[2].get("error", x[0]) for x in res if x[0] != 200 and x not in refused]
        drain_line = next((x for x in srv.text().splitlines() if x.startswith("drained in")), "")
        rows += [plain_row(DS, "ragpilot serve", "dropped_on_sigterm", len(dropped), len(res)),
                 plain_row(DS, "ragpilot serve", "refused_on_sigterm", len(refused), len(res)),
                 plain_row(DS, "ragpilot serve", "exit_code_after_sigterm", rc, 1),
                 plain_row(DS, "ragpilot serve", "sigterm_to_exit_s", exit_s, 1)]
        print(f"SIGTERM: {len(dropped)} of {len(res)} dropped {dropped[:2]}, {len(refused)} "
              f"refused (draining), exit {rc} after "
              f"{exit_s:.1f} s ({drain_line})", flush=True)
    finally:
        srv.stop()

    total_s = time.perf_counter() - t_start
    p95_16 = table[2][2]
    md = ["| clients | p50 ms | p95 ms | p99 ms | throughput req/s | errors |",
          "|---|---|---|---|---|---|"]
    md += [f"| {c} | {a:.1f} | {b:.1f} | {d:.1f} | {t:.1f} | {e} |" for c, a, b, d, t, e in table]
    ci = next(r for r in rows if r["system"] == "serve/c=16" and r["metric"] == "latency_p95_ms")
    md += ["", f"Target p95 ≤ 500 ms at 16 clients: **{p95_16:.1f} ms** "
           f"({'met' if p95_16 <= 500 else 'MISSED'}, margin {500 - p95_16:+.1f} ms; 95% CI "
           f"[{ci['ci_low']:.1f}, {ci['ci_high']:.1f}]; the second c=16 run: {table[3][2]:.1f} "
           "ms). 1-minute load average when each level started: "
           + ", ".join(f"{k.removeprefix('serve/')}: {v:.1f}" for k, v in load_avg.items())
           + " on 2 cores.",
           "", "Server-side stages at 16 clients (median ms over the answers' `latency_ms`): "
           + ", ".join(f"{k} {v:.1f}" for k, v in stages.items()) + ".",
           "", f"Request logs on vs off (16 clients, {rounds} rounds × {n_round} requests each "
           f"way, order alternating, one SIGHUP reload per round): {thr[True]:.1f} vs "
           f"{thr[False]:.1f} req/s, `throughput_ratio_logging_on_vs_off` **{ratio['value']:.3f}"
           f"** (95% CI over rounds {ratio['ci_low']:.3f}–{ratio['ci_high']:.3f}; target ≥ "
           f"0.95: {'met' if ratio['value'] >= 0.95 else 'MISSED'}, margin "
           f"{ratio['value'] - 0.95:+.3f}); {log_lines} JSON lines written.",
           "", f"Cold start of `ragpilot serve`: /healthz 200 after **{alive_s:.1f} s**, "
           f"/readyz 200 after **{ready_s:.1f} s**. SIGTERM after {n_sigterm // 3} of {n_sigterm} requests (16 clients) were "
           f"answered: **{len(dropped)} dropped** (target 0: "
           f"{'met' if not dropped else 'MISSED'}), exit code {rc}, {exit_s:.1f} s from the "
           f"signal to the exit (`{drain_line}`).",
           "", f"Memory: 4 config variants added at run time added **{per_variant:.1f} MB RSS "
           f"per variant** over all Serve replica processes (target ≤ 150 MB); one "
           f"SharedPipelines replica holds {pipeline_rss:.0f} MB. Proxy: **{proxy}**; private network namespace: {isolated}; whole run "
           f"{total_s:.0f} s; load average at the end {os.getloadavg()[0]:.2f} (other work may "
           f"share the 2 cores); command: `python bench/serve_load.py {' '.join(sys.argv[1:])}`."]
    write_results("serve_load", rows, make_meta(args.seed, {}, extra={
        "quick": q, "isolated_netns": isolated, "proxy": proxy, "total_s": round(total_s, 1),
        "loadavg_at_client_levels": load_avg, "loadavg_end": os.getloadavg()}),
        md_title="`ragpilot serve` under load (synthetic world, 127.0.0.1)",
        md_body="\n".join(md))


if __name__ == "__main__":
    main()
