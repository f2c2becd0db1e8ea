"""Off-policy evaluation from ε-greedy logs, the B4 contextual bandit (LinUCB) learnt from such
logs, and the serving policy's pick latency, on HotpotQA, SciFact and MTRAG.

    python bench/ope.py                 # full: 3 datasets
    python bench/ope.py --quick         # < 2 min: the synthetic world

Data: `bench/policy.py`'s protocol, reused (imported): its arms (the 30-config headroom
portfolio), its train / valid / test parts and the (queries × arms) reward, quality and
token matrices (`bench.headroom.matrices`, cached rows; latency priced with the cost model
measured on this machine: `bench.common.evaluator`), features from
`rl.routing.features.QueryFeaturizer`. On conversational data (MTRAG) both are bench/policy.py's
formulation design: the 85 arms (each portfolio arm again with `last_two_user` and `all_user`)
and the 126 columns (the retrieval features on each formulation and their differences).

Logging policies (`rl.routing.decision_log`): ε-greedy around the best static arm (chosen on
valid), ε = 0.1 uniform over the M arms, so every propensity is >= 0.1 / M; and the same with
candidate-aware exploration (`rl.routing.base.explore_mix`): the candidate policy awaiting its
gate — the supervised router — is given `CANDIDATE_SHARE` of the requests on top of the
uniform ε, so the arms it chooses are logged with propensity >= `CANDIDATE_SHARE` (what
`serve.policy.candidate_dir` / `candidate_share` do in the Serve app). The share, 0.1, was fixed
before the run that introduced it (the earlier run, ε-uniform only, missed the target on
SciFact and MTRAG).

1. B4 `linucb`: `rl.routing.portfolio_bandit.LinUCB` fitted on one ε-greedy pass over train (each train
   query logged once, its reward only for the arm served), ridge penalty and deployment
   pessimism (`beta`) chosen on valid's full-information matrix; rows as bench/policy.py's
   (`linucb` reward/quality/tokens; `linucb - best-static` delta_reward, delta_quality,
   delta_cost_pct; `linucb` headroom_captured), paired bootstrap 95% CIs over test queries.
2. OPE on test: targets `supervised-router` (bench/policy.py's router, refitted here the same
   way: `select_router` on train/valid), `linucb` and `best-static`; logs of the ε-greedy
   policy on test, either one pass (each test query once) or a stream of `STREAM_ROUNDS`
   requests drawn uniformly from the test queries (a production log is far longer than a test
   split; the length was fixed before any full run), each with the ε-uniform logging policy
   (logs `one-pass`, `stream`) and the candidate-aware one (`one-pass+candidate`,
   `stream+candidate`). For each of `N_DRAWS` seeded logs: IPS, SNIPS and DR (cross-fitted
   ridge q̂ on the log) against the target's true test value from the full matrix. Row
   `ope_abs_error` = mean |estimate − truth| over the draws (bootstrap 95% CI over draws),
   `ci_coverage` = share of draws whose 95% CI covers the truth. The headline rows (system
   exactly `dr` / `ips` / `snips`) are the supervised router on `HEADLINE_LOG`
   (`stream+candidate`: the logging policy item 5 of issue 19 asks to fix); the others are
   named `<estimator> <target> <log>`. `dr-trainq`: DR with q̂ = the router's own predictions
   (fitted on train's full-information rows, never on the logged test rounds).
3. `policy-router` latency of `serving.policy_router.PolicyRouter.pick` over the dataset's
   real indexes for every test question (after 5 warm-up picks), from the pick's own timers:
   `pick_ms_p95` / `_p50` = the pick itself (the policy's arm probabilities from the features
   + the ε-mixture + the draw); `features_ms_p95` / `_p50` = the featurizer (BM25, dense with
   the query encoder, graph retrievals + question features; in the Serve app they go through
   `SharedRetrievals`, so the chosen pipeline reuses them); `pick_total_ms_p95` = both;
   `pick_ms_p95_with_candidate`: the pick with LinUCB explored beside the router at
   `CANDIDATE_SHARE` (one more policy's probabilities per request);
   `pick_ms_p95_slowest_router`: the largest pick p95 over every router `select_router` tries
   (`PARAM_GRID`, timed the same way; per router in `details[ds]["pick_by_router"]`), so the
   latency claim holds whichever router valid chooses.
"""

from __future__ import annotations

import argparse
import sys
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.common import (  # noqa: E402
    cost_model_used,
    evaluator,
    make_meta,
    metric_row,
    plain_row,
    write_results,
)
from bench.headroom import matrices  # noqa: E402
from bench.ope_report import TITLE, markdown  # noqa: E402
from bench.policy import _delta_rows, _parts, arms  # noqa: E402
from rag.corpus.loaders import data_root  # noqa: E402
from rl.kernel.settings import TunerSettings  # noqa: E402
from rl.routing.base import RouterPolicy, one_hot  # noqa: E402
from rl.routing.decision_log import (  # noqa: E402
    epsilon_greedy_probs,
    log_epsilon_greedy,
    ope_error,
    true_value,
)
from rl.routing.features import QueryFeaturizer, conversation_views, feature_names  # noqa: E402
from rl.routing.portfolio_bandit import select_linucb  # noqa: E402
from rl.routing.router import PARAM_GRID, arm_features, select_router  # noqa: E402
from rl.stats.bootstrap import bootstrap_mean_ci  # noqa: E402
from rl.stats.headroom import best_static, oracle_choice, pick  # noqa: E402

NAME = "ope"
EPSILON = 0.1
N_DRAWS = 20
QUICK_DRAWS = 5
"""Seeded logs per cell with --quick (a smoke run of the synthetic world, never committed)."""
STREAM_ROUNDS = 100_000
HEADLINE = "supervised-router"
CANDIDATE_SHARE = 0.1
HEADLINE_LOG = "stream+candidate"
LOGS = (("one-pass", None, 0.0), ("stream", STREAM_ROUNDS, 0.0),
        ("one-pass+candidate", None, CANDIDATE_SHARE),
        ("stream+candidate", STREAM_ROUNDS, CANDIDATE_SHARE))
"""(name, rounds (None = each test query once), candidate share) of the simulated logs."""
ESTIMATORS = ("ips", "snips", "dr", "dr-trainq")


def load(ds: str, policy: TunerSettings, seed: int, search_json: Path | None = None
         ) -> dict[str, Any]:
    """bench/policy.py's arms, parts, matrices and features for `ds`."""
    ev, cost_source = evaluator(ds, policy)  # SciFact's train qrels included
    # conversational data: bench/policy.py's formulation arms and views
    views = conversation_views(ev.data.dataset.examples)
    configs = arms(ds, policy, search_json, views)
    parts = _parts(ev, seed)
    full = {s: matrices(ev, configs, s) for s in sorted({s for s, _ in parts.values()})}
    M = {role: {k: full[s][k][idx] for k in ("R", "Q", "T")} for role, (s, idx) in parts.items()}
    ex = {role: [ev.data.examples(s)[i] for i in idx] for role, (s, idx) in parts.items()}
    feat = QueryFeaturizer(ev.memo, policy.base_config(), views)
    X = {role: feat.matrix(e).astype(np.float64) for role, e in ex.items()}
    ev.memo.flush()
    return {"ev": ev, "cost_model": cost_source, "configs": configs, "M": M, "X": X,
            "examples": ex, "views": views, "feature_names": list(feature_names(views)),
            "n": {role: len(idx) for role, (_, idx) in parts.items()}}


def _ope_rows(ds: str, target: str, probs: np.ndarray, q_router: np.ndarray, X: np.ndarray,
              R: np.ndarray, greedy: np.ndarray, seed: int, log: str,
              n_rounds: int | None, candidate: np.ndarray | None = None,
              share: float = 0.0, draws: int = N_DRAWS) -> tuple[list[dict], dict]:
    """ope_abs_error and ci_coverage rows of every estimator for one target and log (length,
    and the candidate's probabilities and share when the logging policy explores one)."""
    truth = true_value(probs, R)
    errs: dict[str, list[float]] = {k: [] for k in ESTIMATORS}
    cover: dict[str, list[bool]] = {k: [] for k in ESTIMATORS}
    ests: dict[str, list[float]] = {k: [] for k in ESTIMATORS}
    for d in range(draws):
        rng = np.random.default_rng([seed, d, 7])
        logs = log_epsilon_greedy(X, R, greedy, EPSILON, rng, n_rounds,
                                  candidate_probs=candidate if share else None,
                                  candidate_share=share)
        out = ope_error(probs[logs.qidx], logs, truth, seed=d)
        out["dr-trainq"] = ope_error(probs[logs.qidx], logs, truth,
                                     q_hat=q_router[logs.qidx])["dr"]
        for k in ESTIMATORS:
            errs[k].append(out[k]["abs_error"])
            cover[k].append(out[k]["covered"])
            ests[k].append(out[k]["value"])
    rows = []
    min_prop = float(np.min(epsilon_greedy_probs(greedy, R.shape[1], EPSILON,
                                                 candidate if share else None, share)))
    for k in ESTIMATORS:
        system = k if (target == HEADLINE and log == HEADLINE_LOG and k != "dr-trainq") \
            else f"{k} {target} {log}"
        e = np.asarray(errs[k])
        ok = e[np.isfinite(e)]  # SNIPS is undefined on a log without any target action
        extra = {"target": target, "log": log, "n_rounds": int(n_rounds or len(X)),
                 "draws": draws, "undefined": int(e.size - ok.size), "true_value": truth,
                 "epsilon": EPSILON, "candidate_share": share, "min_propensity": min_prop}
        ci = bootstrap_mean_ci(ok, 10_000, seed) if ok.size > 1 else None
        rows.append({"dataset": ds, "system": system, "metric": "ope_abs_error",
                     "value": float(ok.mean()) if ok.size else float("nan"),
                     "ci_low": ci.ci_low if ci else None, "ci_high": ci.ci_high if ci else None,
                     "n": int(ok.size), **extra})
        rows.append({**plain_row(ds, system, "ci_coverage", float(np.mean(cover[k])), draws),
                     **extra})
    detail = {k: {"mean_estimate": float(np.nanmean(ests[k])),
                  "sd_estimate": float(np.nanstd(ests[k])),
                  "mean_abs_error": float(np.nanmean(errs[k]))} for k in ESTIMATORS}
    return rows, {"true_value": truth, "candidate_share": share, **detail}


def pick_latency(ds: str, data: dict, router, names: list[str], policy: TunerSettings,
                 seed: int, rows: list[dict], candidate=None, grid_routers=()
                 ) -> tuple[dict[str, float], list[dict]]:
    """`PolicyRouter.pick` over the real indexes for every test question (module doc, 3);
    `candidate`: a policy on the same arms, explored beside the router at CANDIDATE_SHARE for
    `pick_ms_p95_with_candidate`; `grid_routers`: the router of every `PARAM_GRID` entry,
    each timed the same way (`pick_ms_p95_slowest_router`). Returns (rows' values, grid)."""
    from rl.routing.base import LoadedPolicy
    from serving.policy_router import PolicyRouter

    configs = [c for _, c in data["configs"]]

    def loaded(pol, label: str) -> LoadedPolicy:
        return LoadedPolicy(pol, names, policy.base_config(), EPSILON,
                            data["feature_names"], type(pol).__name__, label)

    def cached_picks(served: LoadedPolicy, cand: LoadedPolicy | None = None) -> list[float]:
        """The pick's own ms per test question, features cached by `pr` (after 5 warm-ups)."""
        px = PolicyRouter(served, pr.featurizer.indexes, EPSILON, seed, cand,
                          CANDIDATE_SHARE if cand is not None else 0.0)
        px.featurizer = pr.featurizer
        for q, h in qs[:5]:
            px.pick(q + " warm", h)
        return [px.pick(q, h).decide_ms for q, h in qs]

    lp = loaded(RouterPolicy(router, configs), "bench")
    pr = PolicyRouter(lp, data["ev"].data.indexes, EPSILON, seed)
    # each test question with its conversation's earlier turns, as the Serve app gets them
    qs = [(e.question, e.history or None) for e in data["examples"]["test"]]
    for q, h in qs[:5]:
        pr.pick(q + " warm", h)
    picks = [pr.pick(q, h) for q, h in qs]
    dec = [p.decide_ms for p in picks]
    feat = [p.features_ms for p in picks]
    tot = [p.pick_ms for p in picks]
    out = {"pick_ms_p50": float(np.percentile(dec, 50)),
           "pick_ms_p95": float(np.percentile(dec, 95)),
           "features_ms_p50": float(np.percentile(feat, 50)),
           "features_ms_p95": float(np.percentile(feat, 95)),
           "pick_total_ms_p95": float(np.percentile(tot, 95))}
    if candidate is not None:
        dec_c = cached_picks(lp, loaded(candidate, "bench-candidate"))
        out["pick_ms_p50_with_candidate"] = float(np.percentile(dec_c, 50))
        out["pick_ms_p95_with_candidate"] = float(np.percentile(dec_c, 95))
    grid = []
    for params, r in zip(PARAM_GRID, grid_routers, strict=True):
        dec_g = cached_picks(loaded(RouterPolicy(r, configs), "bench-grid"))
        grid.append({**asdict(params), "tree_evals": sum(m.n_iter_ for m in r.models) * (
            r.n_arms if params.pooled else 1), "pick_ms_p95": float(np.percentile(dec_g, 95))})
    if grid:
        out["pick_ms_p95_slowest_router"] = max(g["pick_ms_p95"] for g in grid)
    for metric, v in out.items():
        rows.append(plain_row(ds, "policy-router", metric, v, len(qs)))
    return out, grid


def run_dataset(ds: str, policy: TunerSettings, seed: int, rows: list, details: dict,
                search_json: Path | None = None, latency: bool = True,
                draws: int = N_DRAWS) -> None:
    t0 = time.perf_counter()
    data = load(ds, policy, seed, search_json)
    M, X, configs = data["M"], data["X"], data["configs"]
    names = [n for n, _ in configs]
    m = len(configs)
    base = best_static(M["valid"]["R"])
    # B4: LinUCB from one ε-greedy pass over train, around train's own best static arm
    train_base = best_static(M["train"]["R"])
    rng = np.random.default_rng([seed, 1])
    tlog = log_epsilon_greedy(X["train"], M["train"]["R"], np.full(data["n"]["train"],
                                                                  train_base), EPSILON, rng)
    lin, tried = select_linucb(tlog.x, tlog.arm, tlog.reward, tlog.propensity, X["valid"],
                               M["valid"]["R"], [c for _, c in configs])
    router, sel = select_router(X["train"], M["train"]["R"], X["valid"], M["valid"]["R"],
                                M["train"]["T"], seed=seed,
                                arms=arm_features([c for _, c in configs]))
    T = M["test"]
    oracle = oracle_choice(T["R"])
    lin_ch = lin.act(X["test"])
    choices = {"best-static": np.full(len(oracle), base), "linucb": lin_ch}
    for system, ch in choices.items():
        for metric, mat in (("reward", T["R"]), ("quality", T["Q"]), ("tokens", T["T"])):
            rows.append(metric_row(ds, system, metric, pick(mat, ch), seed))
    rows.extend(_delta_rows(ds, "linucb", T, lin_ch, base, oracle, seed))
    # OPE on test
    greedy = np.full(len(oracle), base)
    q_router = router.predict(X["test"])
    targets = {"supervised-router": RouterPolicy(router, [c for _, c in configs]).probs(X["test"]),
               "linucb": lin.probs(X["test"]), "best-static": one_hot(greedy, m)}
    ope: dict[str, Any] = {}
    for target, probs in targets.items():
        for log, n_rounds, share in LOGS:
            r, det = _ope_rows(ds, target, probs, q_router, X["test"], T["R"], greedy, seed,
                               log, n_rounds, targets[HEADLINE], share, draws)
            rows.extend(r)
            ope[f"{target} {log}"] = det
    lat, lat_grid = pick_latency(ds, data, router, names, policy, seed, rows, candidate=lin,
                                 grid_routers=sel.routers) if latency else ({}, [])

    def used(ch: np.ndarray) -> dict[str, int]:
        u, c = np.unique(ch, return_counts=True)
        return {names[i]: int(k) for i, k in sorted(zip(u, c, strict=True), key=lambda x: -x[1])}

    lp = epsilon_greedy_probs(greedy, m, EPSILON)
    details[ds] = {
        "n": data["n"], "arms": names, "formulation_views": list(data["views"]),
        "n_features": len(data["feature_names"]), "best_static": names[base],
        "train_logging_arm": names[train_base], "min_propensity": float(lp.min()),
        "linucb": {"tried": tried, "chosen": {"l2": lin.model.l2, "beta": lin.beta},
                   "train_log_rounds": len(tlog), "test_arms": used(lin_ch),
                   "arm_rounds": {names[j]: int(c) for j, c in
                                  enumerate(np.bincount(tlog.arm, minlength=m)) if c}},
        "router": {"chosen": sel.tried[sel.best],
                   "test_arms": used(targets["supervised-router"].argmax(axis=1)),
                   "share_off_best_static": float(
                       (targets["supervised-router"].argmax(axis=1) != base).mean())},
        "ope": ope, "pick": lat, "pick_by_router": lat_grid, "cost_model": cost_model_used(data["ev"], data["cost_model"]),
        "wall_s": round(time.perf_counter() - t0, 1)}
    print(f"[{ds}] done in {details[ds]['wall_s']}s", flush=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true", help="the synthetic world only (< 2 min)")
    ap.add_argument("--datasets", default="hotpotqa,scifact,mtrag")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--no-latency", action="store_true", help="skip the pick-latency rows")
    a = ap.parse_args()
    datasets = ["synthetic"] if a.quick else a.datasets.split(",")
    policy = TunerSettings.defaults()
    rows: list[dict] = []
    details: dict[str, Any] = {}
    t0 = time.perf_counter()
    for ds in datasets:
        run_dataset(ds, policy, a.seed, rows, details, latency=not a.no_latency,
                    draws=QUICK_DRAWS if a.quick else N_DRAWS)
    files = {} if a.quick else {d: data_root() / d for d in datasets}
    meta = make_meta(a.seed, files, {
        "quick": a.quick, "wall_s": round(time.perf_counter() - t0, 1), "epsilon": EPSILON,
        "candidate_share": CANDIDATE_SHARE, "headline_log": HEADLINE_LOG,
        "draws": QUICK_DRAWS if a.quick else N_DRAWS, "stream_rounds": STREAM_ROUNDS,
        "target_ope_abs_error": 0.01,
        "base_config": policy.base_config().model_dump(mode="json"), "details": details})
    write_results(NAME, rows, meta, TITLE, markdown(meta, rows))


if __name__ == "__main__":
    main()
