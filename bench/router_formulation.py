"""Can the supervised router choose a conversation turn's retrieval query per turn? A design study
on MTRAG, train ∪ valid only (test unread), in bench/router_selection.py's outer loop.

    python bench/router_formulation.py            # mtrag (committed splits), 4 variants
    python bench/router_formulation.py --quick    # 100 train queries, 2 variants, one grid
                                                  # entry, margin 0 (~2 min, rows cached)

Every arm of the headroom portfolio retrieves with the base config's query formulation
(`last_turn`), yet the searchers' best MTRAG configs use `last_two_user`. Two changes, alone and
together, against the router as shipped (`select_router_cv`, parameters and margin chosen by
grouped CV):

- formulation arms: each portfolio arm (abstaining prompts and `search-best-known` left out)
  also with `last_two_user` and with `all_user` (31 → 85 arms);
- formulation features: the query's retrieval features (`RETRIEVAL_NAMES`: BM25, dense and
  graph top scores, gaps, list agreement) computed again with each other formulation, and
  their differences from the `last_turn` ones (42 → 126 columns). Pre-answer signals only:
  the same retrievers on other query strings.

Outer loop: 5 folds of train ∪ valid grouped by conversation (`rl.stats.headroom.group_folds`);
each fold is held out once, the router is chosen on the other four and acts on it. Rows
(`metric` `delta_reward`): per held-out query, reward minus that of the **base portfolio's**
best static arm on the valid-role rows of the four folds (one scale for every variant), pooled
over folds, paired bootstrap 95% CI. `best-static+formulation-arms` is the valid-role best of
the 85 arms (what a static choice of formulation gains); `X - best-static+formulation-arms`
rows give a variant's gain over that stronger static reference; `per-query-oracle[...]` rows
are each arm set's hindsight bound.
"""

from __future__ import annotations

import argparse
import sys
import time
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
from rl.routing.features import RETRIEVAL_NAMES, QueryFeaturizer  # noqa: E402
from rl.routing.router import MARGINS, PARAM_GRID, arm_features, select_router_cv  # noqa: E402
from rl.stats.bootstrap import paired_bootstrap  # noqa: E402
from rl.stats.headroom import best_static, group_folds, pick  # noqa: E402

NAME = "router_formulation"
TITLE = "Choosing the query formulation per conversation turn: formulation arms and features"
DATASET = "mtrag"
OTHER = ("last_two_user", "all_user")
VARIANTS = ("router", "router+formulation-arms", "router+formulation-features",
            "router+formulation-arms+features")
OUTER = 5
QUICK_TRAIN = 100


def formulation_arms(base_arms):
    """`base_arms` plus each non-abstaining portfolio arm with every other formulation."""
    extra = []
    for name, cfg in base_arms:
        if "abstain" in name or name == "search-best-known":
            continue
        for qf in OTHER:
            if (cfg.query_formulation or "last_turn") != qf:
                extra.append((f"{name}@{qf}", cfg.replace(query_formulation=qf)))
    return base_arms + extra


def formulation_features(ev, policy, examples, X):
    """`X` with the retrieval features under each other formulation and their differences."""
    n = len(RETRIEVAL_NAMES)
    add = [QueryFeaturizer(ev.memo, policy.base_config().replace(query_formulation=qf)
                           ).matrix(examples)[:, :n] for qf in OTHER]
    ev.memo.flush()
    return np.hstack([X, *add, *(X[:, :n] - a for a in add)])


def load(seed: int, max_train: int):
    """Everything the variants share: arms, per-role rewards, features, groups, roles."""
    policy = TunerSettings.defaults()
    ev, source = evaluator(DATASET, policy)
    base = arms(DATASET, policy)
    configs = formulation_arms(base)
    parts = {r: p for r, p in _parts(ev, seed, max_train).items() if r != "test"}
    full = {s: matrices(ev, configs, s) for s in sorted({s for s, _ in parts.values()})}
    M, X, ex = role_data(ev, parts, full, _features(ev, policy, [parts]))
    exs = ex["train"] + ex["valid"]
    X0 = np.vstack([X["train"], X["valid"]])
    return {"configs": configs, "n_base": len(base),
            "X": {"base": X0, "formulation": formulation_features(ev, policy, exs, X0)},
            "R": np.vstack([M["train"]["R"], M["valid"]["R"]]),
            "T": np.vstack([M["train"]["T"], M["valid"]["T"]]),
            "role": np.array([0] * len(X["train"]) + [1] * len(X["valid"])),
            "groups": [conversation_of(e) for e in exs],
            "cost_model": cost_model_used(ev, source)}


def run_variant(variant: str, seed: int, max_train: int, quick: bool, d: dict | None = None
                ) -> dict:
    """One variant's held-out picks over the outer folds, with the shared references; `d`:
    `load`'s data (loaded here when None: a worker process)."""
    t0 = time.perf_counter()
    d = load(seed, max_train) if d is None else d
    cols = list(range(len(d["configs"]) if "arms" in variant else d["n_base"]))
    X = d["X"]["formulation" if "features" in variant else "base"]
    R, T, role, groups = d["R"], d["T"], d["role"], d["groups"]
    desc = arm_features([d["configs"][i][1] for i in cols])
    grid, margins = (PARAM_GRID[:1], (0.0,)) if quick else (PARAM_GRID, MARGINS)
    outer = group_folds(groups, OUTER, seed)
    got = {k: [] for k in ("ref", "ref-ext", "router", "oracle", "oracle-ext")}
    folds = []
    for o in range(OUTER):
        held, rest = outer == o, outer != o
        va = rest & (role == 1)
        ref = best_static(R[va][:, :d["n_base"]])
        ref_ext = best_static(R[va])
        g_rest = [g for g, r in zip(groups, rest, strict=True) if r]
        router, sel = select_router_cv(X[rest], R[rest][:, cols], T[rest][:, cols], g_rest,
                                       grid=grid, margins=margins, seed=seed, arms=desc)
        ch = np.asarray(cols)[router.choose(X[held], 0.0)]
        Rh = R[held]
        got["ref"].append(Rh[:, ref])
        got["ref-ext"].append(Rh[:, ref_ext])
        got["router"].append(pick(Rh, ch))
        got["oracle"].append(Rh[:, :d["n_base"]].max(1))
        got["oracle-ext"].append(Rh.max(1))
        chosen = sel.tried[sel.best]
        folds.append({"held": int(held.sum()), "best_static": d["configs"][ref][0],
                      "best_static_ext": d["configs"][ref_ext][0],
                      "margin": chosen["margin"], "cv_reward": round(chosen["cv_reward"], 4),
                      "switched": float((ch != cols[router.static_arm]).mean()),
                      "other_formulation": float(np.mean(
                          [d["configs"][int(c)][1].query_formulation not in (None, "last_turn")
                           for c in ch]))})
        print(f"[{variant}] outer fold {o + 1}/{OUTER}: {folds[-1]}", flush=True)
    return {"got": {k: np.concatenate(v) for k, v in got.items()}, "folds": folds,
            "arms": len(cols), "features": int(X.shape[1]), "n": int(len(R)),
            "cost_model": d["cost_model"], "wall_s": round(time.perf_counter() - t0, 1)}


def _row(system: str, a: np.ndarray, b: np.ndarray, seed: int) -> dict:
    r = paired_bootstrap(a, b, seed=seed)
    return {"dataset": DATASET, "system": system, "metric": "delta_reward",
            "value": r.mean_diff, "ci_low": r.ci_low, "ci_high": r.ci_high, "n": r.n}


def rows_of(done: dict[str, dict], seed: int) -> list[dict]:
    g = next(iter(done.values()))["got"]
    rows = [_row("best-static+formulation-arms", g["ref"], g["ref-ext"], seed),
            _row("per-query-oracle", g["ref"], g["oracle"], seed),
            _row("per-query-oracle+formulation-arms", g["ref"], g["oracle-ext"], seed)]
    for v, res in done.items():
        rows.append(_row(v, res["got"]["ref"], res["got"]["router"], seed))
        rows.append(_row(f"{v} - best-static+formulation-arms", res["got"]["ref-ext"],
                         res["got"]["router"], seed))
    return rows


def markdown(meta: dict, rows: list[dict]) -> str:
    def cell(system: str) -> str:
        r = next(r for r in rows if r["system"] == system)
        return f"{r['value']:+.4f} [{r['ci_low']:+.4f}, {r['ci_high']:+.4f}]"

    det = meta["details"]
    out = [__doc__.split("\n\n", 2)[2].strip(), "",
           f"{DATASET}: {next(iter(det.values()))['n']} train ∪ valid queries; "
           f"{'quick: one grid entry, margin 0' if meta['quick'] else 'full grid and margins'}.",
           "", "| system | arms | features | Δ reward vs base best static | "
           "Δ reward vs best static of the 85 arms |", "|---|---|---|---|---|"]
    for v, d in det.items():
        out.append(f"| {v} | {d['arms']} | {d['features']} | {cell(v)} | "
                   f"{cell(f'{v} - best-static+formulation-arms')} |")
    out += ["", "| reference | Δ reward vs base best static |", "|---|---|"]
    for s in ("best-static+formulation-arms", "per-query-oracle",
              "per-query-oracle+formulation-arms"):
        out.append(f"| {s} | {cell(s)} |")
    out.append("")
    for v, d in det.items():
        f = d["folds"]
        out.append(f"- {v}: margins {[x['margin'] for x in f]}; switched off the static arm on "
                   + ", ".join(f"{x['switched']:.0%}" for x in f)
                   + " of the held-out queries; picked another formulation on "
                   + ", ".join(f"{x['other_formulation']:.0%}" for x in f)
                   + f"; best static per fold {sorted({x['best_static_ext'] for x in f})} "
                     f"(85 arms), {sorted({x['best_static'] for x in f})} (base); "
                     f"{d['wall_s']:.0f} s.")
    return "\n".join(out)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true",
                    help=f"{QUICK_TRAIN} train queries, the first and last variant, one grid "
                         f"entry and margin 0 (~2 min with cached rows)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--max-train", type=int, default=250)
    ap.add_argument("--jobs", type=int, default=1, help="variants run in parallel processes")
    a = ap.parse_args()
    variants = (VARIANTS[0], VARIANTS[-1]) if a.quick else VARIANTS
    max_train = QUICK_TRAIN if a.quick else a.max_train
    args = [(v, a.seed, max_train, a.quick) for v in variants]
    if a.jobs > 1:
        with ProcessPoolExecutor(a.jobs) as pool:
            results = list(pool.map(run_variant, *zip(*args, strict=True)))
    else:
        data = load(a.seed, max_train)
        results = [run_variant(*x, d=data) for x in args]
    done = dict(zip(variants, results, strict=True))
    details = {v: {k: r[k] for k in ("folds", "arms", "features", "n", "wall_s")}
               for v, r in done.items()}
    meta = make_meta(a.seed, {DATASET: data_root() / DATASET},
                     {"quick": a.quick, "max_train": max_train, "outer_folds": OUTER,
                      "other_formulations": list(OTHER), "details": details,
                      "cost_model": results[0]["cost_model"]})
    rows = rows_of(done, a.seed)
    write_results(NAME, rows, meta, TITLE, markdown(meta, rows))


if __name__ == "__main__":
    main()
