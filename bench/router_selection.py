"""How the supervised router should be chosen: on one valid split, or by cross-validation over
train ∪ valid with a switching margin (the design study behind `select_router_cv`).

    python bench/router_selection.py            # hotpotqa, scifact, mtrag (committed splits)
    python bench/router_selection.py --quick    # the synthetic world, a small grid (< 2 min)

Only train ∪ valid is read (bench/policy.py's roles: train = the seeded subset of
`--max-train` queries, valid = the tune split); test is never opened. Outer loop: 5 folds
of train ∪ valid grouped by conversation (`rl.stats.headroom.group_folds`); each fold is held
out once and every method is chosen on the other four and scored on it:

- `holdout-selection`: `select_router` fitted on the fold-out rows of the train role and
  chosen on those of the valid role (the rule before `select_router_cv`);
- `cv`: grouped 4-fold CV over the four folds picks the parameters by out-of-fold realised
  reward (margin fixed at 0: plain argmax), refitted on them;
- `cv-margin`: `select_router_cv` itself (parameters and margin chosen jointly).

Rows (`metric` `delta_reward`): per held-out query, the method's reward minus that of the best
static arm of the valid-role rows of the four folds (the reference the policy bench's
`best-static` uses), pooled over the five held-out folds, paired bootstrap 95% CI; plus
`best-static-train-valid` (the best static arm of all four folds) on the same scale. The rule
fixed before the run: adopt the method with the highest mean `delta_reward` over the
datasets if it beats `holdout-selection`.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Callable
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.common import cost_model_used, evaluator, make_meta, write_results  # noqa: E402
from bench.headroom import matrices  # noqa: E402
from bench.policy import _features, _parts, arms, role_data  # noqa: E402
from rag.corpus.loaders import data_root  # noqa: E402
from rag.types import conversation_of  # noqa: E402
from rl.kernel.settings import TunerSettings  # noqa: E402
from rl.routing.router import (  # noqa: E402
    MARGINS,
    PARAM_GRID,
    arm_features,
    select_router,
    select_router_cv,
)
from rl.stats.bootstrap import paired_bootstrap  # noqa: E402
from rl.stats.headroom import best_static, group_folds, pick  # noqa: E402

NAME = "router_selection"
TITLE = "Choosing the supervised router: one valid split vs cross-validation with a margin"
METHODS = ("holdout-selection", "cv", "cv-margin", "best-static-train-valid")
OUTER = 5


def run_dataset(ds: str, seed: int, max_train: int | None, quick: bool
                ) -> tuple[list[dict], dict]:
    t0 = time.perf_counter()
    policy = TunerSettings.defaults()
    ev, source = evaluator(ds, policy)
    configs = arms(ds, policy)
    parts = {r: p for r, p in _parts(ev, seed, max_train).items() if r != "test"}
    full = {s: matrices(ev, configs, s) for s in sorted({s for s, _ in parts.values()})}
    M, X, ex = role_data(ev, parts, full, _features(ev, policy, [parts]))
    desc = arm_features([c for _, c in configs])
    Xa = np.vstack([X["train"], X["valid"]])
    Ra, Ta = (np.vstack([M["train"][k], M["valid"][k]]) for k in ("R", "T"))
    role = np.array([0] * len(X["train"]) + [1] * len(X["valid"]))
    groups = [conversation_of(e) for e in ex["train"] + ex["valid"]]
    grid = PARAM_GRID[:2] if quick else PARAM_GRID
    outer = group_folds(groups, OUTER, seed)
    got: dict[str, list[np.ndarray]] = {m: [] for m in (*METHODS, "reference")}
    folds = []
    for o in range(OUTER):
        held, rest = outer == o, outer != o
        tr, va = rest & (role == 0), rest & (role == 1)
        ref = best_static(Ra[va])
        a, _ = select_router(Xa[tr], Ra[tr], Xa[va], Ra[va], Ta[tr], grid=grid, seed=seed,
                             arms=desc)
        g_rest = [g for g, r in zip(groups, rest, strict=True) if r]
        b, sel_b = select_router_cv(Xa[rest], Ra[rest], Ta[rest], g_rest, grid=grid,
                                    margins=(0.0,), seed=seed, arms=desc)
        c, sel_c = select_router_cv(Xa[rest], Ra[rest], Ta[rest], g_rest, grid=grid,
                                    margins=MARGINS, seed=seed, arms=desc)
        Rh = Ra[held]
        got["reference"].append(Rh[:, ref])
        got["holdout-selection"].append(pick(Rh, a.choose(Xa[held], 0.0)))
        got["cv"].append(pick(Rh, b.choose(Xa[held], 0.0)))
        ch = c.choose(Xa[held], 0.0)
        got["cv-margin"].append(pick(Rh, ch))
        got["best-static-train-valid"].append(Rh[:, c.static_arm])
        folds.append({"held": int(held.sum()), "valid_best_static": configs[ref][0],
                      "train_valid_best_static": configs[c.static_arm][0],
                      "cv": {k: sel_b.tried[sel_b.best][k]
                             for k in ("max_iter", "max_leaf_nodes", "shrink", "pooled")},
                      "cv_margin": {k: sel_c.tried[sel_c.best][k] for k in
                                    ("max_iter", "max_leaf_nodes", "shrink", "pooled",
                                     "margin")},
                      "cv_margin_switched": float((ch != c.static_arm).mean())})
        print(f"[{ds}] outer fold {o + 1}/{OUTER}: {folds[-1]}", flush=True)
    cat = {k: np.concatenate(v) for k, v in got.items()}
    rows = []
    for m in METHODS:
        r = paired_bootstrap(cat["reference"], cat[m], seed=seed)
        rows.append({"dataset": ds, "system": m, "metric": "delta_reward",
                     "value": r.mean_diff, "ci_low": r.ci_low, "ci_high": r.ci_high,
                     "n": r.n})
    details = {"n": {r: int(len(M[r]["R"])) for r in parts}, "arms": len(configs),
               "grid": len(grid), "margins": list(MARGINS), "folds": folds,
               "cost_model": cost_model_used(ev, source),
               "wall_s": round(time.perf_counter() - t0, 1)}
    print(f"[{ds}] done in {details['wall_s']}s", flush=True)
    return rows, details


def _held(meta: dict, ds: str) -> int:
    return sum(f["held"] for f in meta["details"][ds]["folds"])


def markdown(meta: dict, rows: list[dict]) -> str:
    def cell(ds: str, m: str) -> str:
        r = next(r for r in rows if r["dataset"] == ds and r["system"] == m)
        return f"{r['value']:+.4f} [{r['ci_low']:+.4f}, {r['ci_high']:+.4f}]"

    dss = list(meta["details"])
    out = [__doc__.split("\n\n", 2)[2].strip(), "",
           "| method | " + " | ".join(f"{ds} (n {_held(meta, ds)})" for ds in dss)
           + " | mean |",
           "|---|" + "---|" * (len(dss) + 1)]
    means = {}
    for m in METHODS:
        vals = [next(r["value"] for r in rows if r["dataset"] == ds and r["system"] == m)
                for ds in dss]
        means[m] = float(np.mean(vals))
        out.append(f"| {m} | " + " | ".join(cell(ds, m) for ds in dss)
                   + f" | {means[m]:+.4f} |")
    learnt = {m: v for m, v in means.items() if m != "best-static-train-valid"}
    best = max(learnt, key=learnt.get)
    verdict = ("adopted" if best != "holdout-selection" and
               learnt[best] > learnt["holdout-selection"] else "not adopted: holdout stays")
    out += ["", f"Highest mean over the datasets: `{best}` ({learnt[best]:+.4f}; "
                f"holdout-selection {learnt['holdout-selection']:+.4f}): {verdict}.", ""]
    for ds in dss:
        f = meta["details"][ds]["folds"]
        switched = ", ".join(f"{x['cv_margin_switched']:.0%}" for x in f)
        out.append(f"- {ds}: cv-margin chose margins "
                   f"{[x['cv_margin']['margin'] for x in f]} and switched off the static arm "
                   f"on {switched} of the "
                   f"held-out queries; train ∪ valid's best static: "
                   f"{sorted({x['train_valid_best_static'] for x in f})}, valid's: "
                   f"{sorted({x['valid_best_static'] for x in f})}.")
    return "\n".join(out)


def study_main(doc: str, run: Callable, name: str, title: str,
               markdown: Callable[[dict, list[dict]], str], **extra) -> None:
    """The command line of a router design study (this one, bench/router_embedding.py):
    `run(ds, seed, max_train, quick)` -> (rows, details) per dataset, in parallel processes
    with `--jobs`; `extra` goes into the meta beside the run's settings."""
    ap = argparse.ArgumentParser(description=doc.split("\n")[0])
    ap.add_argument("--quick", action="store_true",
                    help="the synthetic world, the first two grid entries (< 2 min)")
    ap.add_argument("--datasets", default="hotpotqa,scifact,mtrag")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--max-train", type=int, default=250)
    ap.add_argument("--jobs", type=int, default=1, help="datasets run in parallel processes")
    a = ap.parse_args()
    datasets = ["synthetic"] if a.quick else a.datasets.split(",")
    args = [(ds, a.seed, a.max_train, a.quick) for ds in datasets]
    if a.jobs > 1:
        with ProcessPoolExecutor(a.jobs) as pool:
            done = list(pool.map(run, *zip(*args, strict=True)))
    else:
        done = [run(*x) for x in args]
    rows = [r for rs, _ in done for r in rs]
    details = {ds: d for ds, (_, d) in zip(datasets, done, strict=True)}
    files = {} if a.quick else {d: data_root() / d for d in datasets}
    meta = make_meta(a.seed, files, {"quick": a.quick, "max_train": a.max_train,
                                     "outer_folds": OUTER, **extra, "details": details})
    write_results(name, rows, meta, title, markdown(meta, rows))


def main() -> None:
    study_main(__doc__, run_dataset, NAME, TITLE, markdown)

if __name__ == "__main__":
    main()
