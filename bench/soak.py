"""Bounded soak test of the Ray Serve app (src/serving) on 127.0.0.1, synthetic world.

    python bench/soak.py            # full: capacity 30 s, then 10 minutes at 80% of it
    python bench/soak.py --quick    # < 2 min: capacity 8 s, then 45 s at 80%

Launched like bench/serve_load.py: Ray and Serve in this process, inside a private network
namespace when permitted. Phases:
  1. capacity: closed loop, 8 concurrent clients on POST /query for a fixed time; capacity =
     answered requests per second;
  2. soak: open loop at 80% of capacity (one request every 1/rate s, whatever the replies do;
     at most 256 outstanding, beyond that a request counts as an error), plus a /feedback write
     for every 5th answered query (the store's write path under load);
  3. every 5 s: RSS of the Serve process tree (every descendant of this process: raylet, GCS,
     the ingress and pipeline replicas; this process, which also runs the load generator, is
     left out).
Reported: error rate (non-2xx or transport error), p95 latency of the first vs the last
window (1 minute; --quick: 15 s) and their ratio (drift), RSS of the first vs the last window
and its growth (target < 10%), achieved rate. Rows {dataset, system, metric, value, ci_low,
ci_high, n}; 95% bootstrap CIs for the p95s.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.common import make_meta, parser, plain_row, write_results  # noqa: E402
from rag.env import configure_runtime_env  # noqa: E402
from rl.stats.bootstrap import bootstrap_statistic  # noqa: E402

configure_runtime_env()
DS = "synthetic"
SYSTEM = "serve/soak@80%"


def tree_rss_mb() -> float:
    """Summed RSS (MiB) of every descendant process of this one."""
    import psutil

    total = 0
    for p in psutil.Process().children(recursive=True):
        with contextlib.suppress(psutil.NoSuchProcess, psutil.AccessDenied):
            total += p.memory_info().rss
    return total / 2**20


def p95_row(metric: str, values, seed: int) -> dict:
    x = np.asarray(values, dtype=np.float64)
    boots = bootstrap_statistic(lambda idx: np.percentile(x[idx], 95, axis=1), x.size, 2000,
                                seed)
    return {"dataset": DS, "system": SYSTEM, "metric": metric,
            "value": float(np.percentile(x, 95)), "ci_low": float(np.quantile(boots, 0.025)),
            "ci_high": float(np.quantile(boots, 0.975)), "n": int(x.size)}


async def capacity(url: str, questions: list[str], seconds: float, clients: int = 8) -> float:
    """Answered /query requests per second with `clients` closed-loop clients."""
    import httpx

    done = 0
    stop = time.perf_counter() + seconds
    limits = httpx.Limits(max_connections=clients, max_keepalive_connections=clients)
    async with httpx.AsyncClient(base_url=url, timeout=60.0, limits=limits) as client:
        async def worker(w: int) -> None:
            nonlocal done
            i = w
            while time.perf_counter() < stop:
                r = await client.post("/query", json={"question": questions[i % len(questions)]})
                done += r.status_code == 200
                i += clients

        t0 = time.perf_counter()
        await asyncio.gather(*(worker(w) for w in range(clients)))
        return done / (time.perf_counter() - t0)


async def soak(url: str, questions: list[str], rate: float, seconds: float,
               rss: list[tuple[float, float]], max_outstanding: int = 256
               ) -> list[tuple[float, float, int]]:
    """Open loop at `rate` req/s for `seconds`: [(start offset s, latency ms, status)]
    (status 0 = transport error or dropped for too many outstanding)."""
    import httpx

    out: list[tuple[float, float, int]] = []
    limits = httpx.Limits(max_connections=max_outstanding,
                          max_keepalive_connections=max_outstanding)
    outstanding = 0
    t_start = time.perf_counter()
    async with httpx.AsyncClient(base_url=url, timeout=60.0, limits=limits) as client:
        async def one(i: int, at: float) -> None:
            nonlocal outstanding
            outstanding += 1
            t0 = time.perf_counter()
            try:
                r = await client.post("/query", json={"question": questions[i % len(questions)],
                                                      "user_id": f"soak-{i % 997}"})
                status = r.status_code
                if status == 200 and i % 5 == 0:
                    fb = await client.post("/feedback", json={
                        "interaction_id": r.json()["interaction_id"], "reward": (i % 10) / 10})
                    if fb.status_code != 200:
                        out.append((at, 0.0, fb.status_code))
            except httpx.HTTPError:
                status = 0
            finally:
                outstanding -= 1
            out.append((at, (time.perf_counter() - t0) * 1000.0, status))

        async def sampler() -> None:
            while time.perf_counter() - t_start < seconds:
                rss.append((time.perf_counter() - t_start, await asyncio.to_thread(tree_rss_mb)))
                await asyncio.sleep(5.0)

        tasks = [asyncio.create_task(sampler())]
        i = 0
        while True:
            at = i / rate
            if at >= seconds:
                break
            delay = t_start + at - time.perf_counter()
            if delay > 0:
                await asyncio.sleep(delay)
            if outstanding >= max_outstanding:
                out.append((at, 0.0, 0))
            else:
                tasks.append(asyncio.create_task(one(i, at)))
            i += 1
        await asyncio.gather(*tasks)
        rss.append((time.perf_counter() - t_start, tree_rss_mb()))
    return out


def main() -> None:
    ap = parser(__doc__, seed=True)
    ap.add_argument("--duration-s", type=float, help="soak length (full 600, quick 45)")
    ap.add_argument("--load", type=float, default=0.8, help="fraction of measured capacity")
    args = ap.parse_args()
    q = args.quick
    cap_s = 8.0 if q else 30.0
    dur = args.duration_s or (45.0 if q else 600.0)
    window = 15.0 if q else 60.0
    if not 0 < args.load <= 1 or dur < 2 * window:
        raise SystemExit(f"error: --load must be in (0, 1] and --duration-s >= {2 * window:g}")

    from rag.corpus.synthetic import make_synthetic_world
    from serving import netns
    from serving.launch import start_local, stop_local

    questions = [e.question for e in make_synthetic_world().examples]
    np.random.default_rng(args.seed).shuffle(questions)
    t_all = time.perf_counter()
    isolated = netns.enter_private_netns()
    tmp = Path(tempfile.mkdtemp(prefix="soak-"))
    settings = {"store_url": str(tmp / "interactions.sqlite"),
                "auth": {"keys_file": str(tmp / "keys.json")},
                "traffic": {"canary_percent": 0.0, "shadow_percent": 0.0},
                "limits": {"max_inflight": 512, "rate_per_s": 1e6, "burst": 1e6},
                "pipelines": {"num_replicas": 1, "autoscaling": None, "num_cpus": 0.1,
                              "max_ongoing_requests": 32}}
    t0 = time.perf_counter()
    url = start_local(settings, port=netns.free_port())
    ready_s = time.perf_counter() - t0
    print(f"serve ready in {ready_s:.1f} s (isolated={isolated})", flush=True)
    rss: list[tuple[float, float]] = []
    try:
        asyncio.run(capacity(url, questions, 3.0, 2))  # warm-up
        cap = asyncio.run(capacity(url, questions, cap_s))
        rate = args.load * cap
        print(f"capacity {cap:.1f} req/s; soak at {rate:.1f} req/s for {dur:.0f} s", flush=True)
        res = asyncio.run(soak(url, questions, rate, dur, rss))
    finally:
        stop_local()

    at = np.array([r[0] for r in res])
    ms = np.array([r[1] for r in res])
    ok = np.array([200 <= r[2] < 300 for r in res])
    n_err = int((~ok).sum())
    first = ms[ok & (at < window)]
    last = ms[ok & (at >= dur - window)]
    p95_first, p95_last = float(np.percentile(first, 95)), float(np.percentile(last, 95))
    rss_first = [m for t, m in rss if t < window]
    rss_last = [m for t, m in rss if t >= dur - window]
    rss0, rss1 = float(np.mean(rss_first)), float(np.mean(rss_last))
    growth = (rss1 - rss0) / rss0
    achieved = int(ok.sum()) / dur
    rows = [plain_row(DS, SYSTEM, "capacity_rps", cap, 0),
            plain_row(DS, SYSTEM, "target_rps", rate, 0),
            plain_row(DS, SYSTEM, "achieved_rps", achieved, int(ok.sum())),
            plain_row(DS, SYSTEM, "requests", len(res), len(res)),
            plain_row(DS, SYSTEM, "errors", n_err, len(res)),
            plain_row(DS, SYSTEM, "error_rate", n_err / max(len(res), 1), len(res)),
            p95_row("latency_p95_ms_first_window", first, args.seed),
            p95_row("latency_p95_ms_last_window", last, args.seed),
            plain_row(DS, SYSTEM, "p95_drift_ratio", p95_last / p95_first, len(last)),
            plain_row(DS, SYSTEM, "rss_mb_first_window", rss0, len(rss_first)),
            plain_row(DS, SYSTEM, "rss_mb_last_window", rss1, len(rss_last)),
            plain_row(DS, SYSTEM, "rss_growth", growth, len(rss))]
    total_s = time.perf_counter() - t_all
    verdict = "met" if n_err == 0 and growth < 0.10 else "MISSED"
    md = [f"Capacity (8 closed-loop clients, {cap_s:g} s): **{cap:.1f} req/s**. Soak: open loop "
          f"at {args.load:.0%} = {rate:.1f} req/s for {dur:.0f} s (+ a /feedback write per 5th "
          f"answer); achieved {achieved:.1f} answered req/s.", "",
          "| metric | first window | last window | change |", "|---|---|---|---|",
          f"| p95 latency ms ({window:g} s windows) | {p95_first:.1f} | {p95_last:.1f} | "
          f"×{p95_last / p95_first:.2f} |",
          f"| RSS of the Serve process tree, MiB | {rss0:.0f} | {rss1:.0f} | "
          f"{growth * 100:+.1f}% |", "",
          f"Requests {len(res)}, errors **{n_err}** (error rate {n_err / max(len(res), 1):.4f}). "
          f"Target: no errors and RSS growth < 10%: **{verdict}**.", "",
          f"Serve ready in {ready_s:.0f} s; whole run {total_s:.0f} s; private network "
          f"namespace: {isolated}; load average at the end {os.getloadavg()[0]:.2f} (2 cores, "
          "possibly shared with other jobs: latency drift can come from them)."]
    print("\n".join(md), flush=True)
    write_results("soak", rows, make_meta(args.seed, {}, extra={
        "quick": q, "duration_s": dur, "window_s": window, "load": args.load,
        "capacity_s": cap_s, "isolated_netns": isolated, "ready_s": round(ready_s, 1),
        "total_s": round(total_s, 1), "rss_samples": [[round(t, 1), round(m, 1)] for t, m in rss],
        "loadavg_end": os.getloadavg()}),
        md_title="Soak of the Ray Serve app (synthetic world, 127.0.0.1)", md_body="\n".join(md))


if __name__ == "__main__":
    main()
