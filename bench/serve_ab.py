"""Serve request path: this checkout against an earlier commit, on the same machine, interleaved.

    python bench/serve_ab.py --ref 997923b            # 3 rounds of `serve_load.py --quick` each
    python bench/serve_ab.py --ref 997923b --quick    # 1 round (writes serve_ab.quick.*)

Why: `bench/serve_load.py` numbers from different days are not comparable here. The 2 cores
are shared with other tenants and their speed moves between days (the same code, 997923b,
measured 43 req/s at c=16 on one day and about half that on another). A change in the
request path is judged only against its predecessor measured in the same window: the ref is
checked out into a temporary `git worktree`, and each round runs `serve_load.py --quick` of
HEAD and of the ref (same seed, same environment; the order alternates between rounds), so
slow spells hit both sides.

Rows (dataset `synthetic`): per side (`head`, `ref:<sha>`) and round, the c=16 level's
`latency_p95_ms`, `latency_p50_ms`, `throughput_rps` as `serve_load.py` measured them (CIs are
its bootstrap over requests); `head / ref` `throughput_ratio` and `latency_p95_ratio` over
rounds (mean, with the min and max of the per-round ratios as the interval).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from bench.common import make_meta, plain_row, write_results  # noqa: E402
from bench.common import parser as bench_parser  # noqa: E402

DS = "synthetic"
LEVEL = "serve/c=16"
METRICS = ("latency_p95_ms", "latency_p50_ms", "throughput_rps")
ROUNDS = 3
"""ABBA rounds of `serve_load.py --quick` per side (1 with --quick)."""


def commit_of(ref: str) -> str:
    """The full sha `ref` names (argparse type of --ref: a ref that is not a commit of this
    repository is a usage error naming it, exit 2)."""
    sha = subprocess.run(["git", "rev-parse", "--verify", f"{ref}^{{commit}}"], cwd=REPO,
                         capture_output=True, text=True)
    if sha.returncode != 0:
        raise argparse.ArgumentTypeError(
            f"{ref}: not a commit of this repository ({sha.stderr.strip()})")
    return sha.stdout.strip()


def checkout(sha: str, where: Path) -> None:
    """A detached worktree of commit `sha` at `where` (its configs importable as
    `ragpilot_configs`, as the installed package maps them)."""
    subprocess.run(["git", "worktree", "add", "--detach", str(where), sha],
                   cwd=REPO, check=True, capture_output=True)
    shim = where / ".abshim"
    shim.mkdir()
    (shim / "ragpilot_configs").symlink_to(where / "configs")


def has_proxy_choice(sha: str) -> bool:
    """Whether commit `sha`'s serving.launch reads $RAGPILOT_SERVE_PROXY (older commits always
    serve through Serve's proxy)."""
    out = subprocess.run(["git", "show", f"{sha}:src/serving/launch.py"], cwd=REPO,
                         capture_output=True, text=True)
    return out.returncode == 0 and "RAGPILOT_SERVE_PROXY" in out.stdout


def run_side(tree: Path, seed: int, proxy: str = "serve") -> dict[str, dict]:
    """`serve_load.py --quick` in `tree` behind `proxy` (both sides the same, so the A/B
    compares code, not topologies); its c=16 rows (first pass) keyed by metric."""
    env = dict(os.environ)
    env["RAGPILOT_SERVE_PROXY"] = proxy
    env["PYTHONPATH"] = os.pathsep.join([str(tree / "src"), str(tree / ".abshim"), str(tree)]
                                        if tree != REPO else [str(REPO / "src"), str(REPO)])
    out = subprocess.run([sys.executable, "bench/serve_load.py", "--quick", "--seed", str(seed)],
                         cwd=tree, env=env, capture_output=True, text=True)
    if out.returncode != 0:
        raise SystemExit(f"serve_load.py in {tree} failed:\n{out.stderr[-3000:]}")
    rows = json.loads((tree / "bench/results/serve_load.quick.json").read_text())["rows"]
    got = {r["metric"]: r for r in rows if r["system"] == LEVEL and r["metric"] in METRICS}
    missing = set(METRICS) - set(got)
    if missing:
        raise SystemExit(f"{tree}: serve_load.quick.json has no {LEVEL} rows {sorted(missing)}")
    return got


def parser() -> argparse.ArgumentParser:
    ap = bench_parser(__doc__, seed=True)  # --quick: one round instead of ROUNDS
    ap.add_argument("--ref", required=True, type=commit_of,
                    help="the commit to compare HEAD with")
    ap.add_argument("--proxy", choices=("serve", "haproxy"), default="serve",
                    help="the proxy both sides serve behind (default serve: what every commit "
                         "before the HAProxy option used; haproxy needs a ref that has it)")
    return ap


def main() -> None:
    ap = parser()
    args = ap.parse_args()
    rounds = 1 if args.quick else ROUNDS
    sha = args.ref
    if args.proxy != "serve" and not has_proxy_choice(sha):
        ap.error(f"argument --proxy: {sha[:7]} predates the proxy choice and always serves "
                 "through Serve's proxy; compare with --proxy serve")
    tmp = Path(tempfile.mkdtemp(prefix="serve-ab-")) / "ref"
    checkout(sha, tmp)
    ref_name = f"ref:{sha[:7]}"
    rows: list[dict] = []
    per: dict[str, list[dict]] = {"head": [], ref_name: []}
    loads: list[tuple[float, float]] = []
    try:
        for i in range(rounds):
            order = [("head", REPO), (ref_name, tmp)]
            for side, tree in order if i % 2 == 0 else order[::-1]:  # ABBA: drift hits both
                load0 = os.getloadavg()[0]
                t0 = time.perf_counter()
                got = run_side(tree, args.seed, args.proxy)
                per[side].append(got)
                loads.append((load0, os.getloadavg()[0]))
                print(f"round {i + 1} {side}: p95 {got['latency_p95_ms']['value']:.1f} ms, "
                      f"{got['throughput_rps']['value']:.1f} req/s "
                      f"({time.perf_counter() - t0:.0f} s, load {load0:.1f})", flush=True)
                for r in got.values():
                    rows.append({**r, "system": f"{side}/c=16 round {i + 1}"})
    finally:
        subprocess.run(["git", "worktree", "remove", "--force", str(tmp)], cwd=REPO,
                       capture_output=True)
        shutil.rmtree(tmp.parent, ignore_errors=True)  # mkdtemp's folder around the worktree
    ratios = {}
    for metric, name in (("throughput_rps", "throughput_ratio"),
                         ("latency_p95_ms", "latency_p95_ratio")):
        r = np.array([h[metric]["value"] / o[metric]["value"]
                      for h, o in zip(per["head"], per[ref_name], strict=True)])
        ratios[name] = r
        rows.append({**plain_row(DS, f"head / {ref_name}", name, float(r.mean()), rounds),
                     "ci_low": float(r.min()), "ci_high": float(r.max())})
    md = [f"HEAD against `{sha[:10]}`, {rounds} round(s), each "
          "`serve_load.py --quick` of HEAD and of the ref (order alternating) in a temporary "
          "worktree, same seed and environment. Level c=16 (128 requests a pass, the first "
          "pass). Load average (1 min) at each pass's start: "
          + ", ".join(f"{a:.1f}" for a, _ in loads) + ".", "",
          "| round | side | p50 ms | p95 ms [95% CI] | req/s |", "|---|---|---|---|---|"]
    for i in range(rounds):
        for side in ("head", ref_name):
            g = per[side][i]
            p95 = g["latency_p95_ms"]
            md.append(f"| {i + 1} | {side} | {g['latency_p50_ms']['value']:.1f} | "
                      f"{p95['value']:.1f} [{p95['ci_low']:.1f}, {p95['ci_high']:.1f}] | "
                      f"{g['throughput_rps']['value']:.1f} |")
    md += ["", f"HEAD / ref: throughput ×{ratios['throughput_ratio'].mean():.2f} "
               f"(rounds {', '.join(f'{x:.2f}' for x in ratios['throughput_ratio'])}), "
               f"c=16 p95 ×{ratios['latency_p95_ratio'].mean():.2f} "
               f"(rounds {', '.join(f'{x:.2f}' for x in ratios['latency_p95_ratio'])})."]
    meta = make_meta(args.seed, {}, {"ref": sha, "rounds": rounds, "quick": args.quick,
                                     "proxy": args.proxy,
                                     "loadavg_at_passes": loads})
    write_results("serve_ab", rows, meta, "Serve request path: HEAD vs an earlier commit, "
                  "interleaved on the same machine", "\n".join(md) + "\n")


if __name__ == "__main__":
    main()
