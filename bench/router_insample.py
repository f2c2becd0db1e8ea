"""How the supervised router scores on the queries it was fitted on, against valid and test:
what a behaviour clone of its *training* picks (the PPO policy's `supervised-router` warm
start, `bench/policy.py`) is fitted to.

    python bench/router_insample.py            # hotpotqa, scifact, mtrag (committed splits)
    python bench/router_insample.py --quick    # the synthetic world (< 2 min)

The protocol is bench/policy.py's on the committed splits (train: the seeded subset of
`--max-train` queries, 250 as in the committed policy run; the router chosen on valid by
`rl.routing.router.select_router`). Rows per role (train / valid / test): the mean per-query
reward of `supervised-router`, `best-static` (valid's best arm) and `per-query-oracle`
(`metric`: `<role>_reward`), and `supervised-router` `<role>_oracle_agreement`: the share of
queries where the router's pick scores as well as the oracle's. A router whose train rewards
sit near the oracle's but whose valid rewards do not has fitted the training queries'
outcomes, and its training picks are those outcomes.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.common import cost_model_used, evaluator, make_meta, metric_row, write_results  # noqa: E402
from bench.headroom import matrices  # noqa: E402
from bench.policy import _features, _parts, arms, role_data  # noqa: E402
from rag.corpus.loaders import data_root  # noqa: E402
from rl.kernel.settings import TunerSettings  # noqa: E402
from rl.routing.router import arm_features, select_router  # noqa: E402
from rl.stats.headroom import best_static, oracle_choice, pick  # noqa: E402

NAME = "router_insample"
TITLE = "The supervised router on its own training queries vs valid and test"
ROLES = ("train", "valid", "test")


def run_dataset(ds: str, policy: TunerSettings, seed: int, max_train: int | None,
                rows: list, details: dict) -> None:
    t0 = time.perf_counter()
    ev, source = evaluator(ds, policy)
    configs = arms(ds, policy)
    parts = _parts(ev, seed, max_train)
    full = {s: matrices(ev, configs, s) for s in sorted({s for s, _ in parts.values()})}
    M, X, _ = role_data(ev, parts, full, _features(ev, policy, [parts]))
    base = best_static(M["valid"]["R"])
    router, sel = select_router(X["train"], M["train"]["R"], X["valid"], M["valid"]["R"],
                                M["train"]["T"], seed=seed,
                                arms=arm_features([c for _, c in configs]))
    for role in ROLES:
        R = M[role]["R"]
        ch, orc = router.choose(X[role], 0.0), oracle_choice(R)
        for system, got in (("supervised-router", pick(R, ch)), ("best-static", R[:, base]),
                            ("per-query-oracle", pick(R, orc))):
            rows.append(metric_row(ds, system, f"{role}_reward", got, seed))
        rows.append(metric_row(ds, "supervised-router", f"{role}_oracle_agreement",
                               (pick(R, ch) >= pick(R, orc) - 1e-12).astype(float), seed))
    details[ds] = {"n": {r: int(len(M[r]["R"])) for r in ROLES}, "router": sel.best,
                   "best_static": configs[base][0], "cost_model": cost_model_used(ev, source),
                   "wall_s": round(time.perf_counter() - t0, 1)}
    print(f"[{ds}] done in {details[ds]['wall_s']}s", flush=True)


def markdown(meta: dict, rows: list[dict]) -> str:
    def g(ds: str, system: str, metric: str) -> str:
        r = next((r for r in rows if r["dataset"] == ds and r["system"] == system
                  and r["metric"] == metric), None)
        return "–" if r is None else f"{r['value']:.3f} [{r['ci_low']:.3f}, {r['ci_high']:.3f}]"

    out = [__doc__.split("\n\n", 1)[1].split("\n\n", 1)[1].strip(), "",
           "| dataset | role | router | best static | per-query oracle | router = oracle |",
           "|---|---|---|---|---|---|"]
    for ds in meta["details"]:
        for role in ROLES:
            out.append(f"| {ds} | {role} | {g(ds, 'supervised-router', role + '_reward')} | "
                       f"{g(ds, 'best-static', role + '_reward')} | "
                       f"{g(ds, 'per-query-oracle', role + '_reward')} | "
                       f"{g(ds, 'supervised-router', role + '_oracle_agreement')} |")
    return "\n".join(out)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true", help="the synthetic world only (< 2 min)")
    ap.add_argument("--datasets", default="hotpotqa,scifact,mtrag")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--max-train", type=int, default=250)
    a = ap.parse_args()
    datasets = ["synthetic"] if a.quick else a.datasets.split(",")
    policy = TunerSettings.defaults()
    rows: list[dict] = []
    details: dict = {}
    for ds in datasets:
        run_dataset(ds, policy, a.seed, a.max_train, rows, details)
    files = {} if a.quick else {d: data_root() / d for d in datasets}
    meta = make_meta(a.seed, files, {"quick": a.quick, "max_train": a.max_train,
                                     "details": details})
    write_results(NAME, rows, meta, TITLE, markdown(meta, rows))


if __name__ == "__main__":
    main()
