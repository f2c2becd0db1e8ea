"""Train the per-query PPO policy on a dataset and save it as a policy directory the Serve
app serves: `ragpilot router train --learner ppo` (the router alone is `rl.routing.train`).

    run = train_ppo_policy("synthetic", TunerSettings.defaults(), PPOPolicySettings.load(),
                           "runs/policy/synthetic-ppo", seeds=3)
    run.rows        # holdout rows: ppo-policy, the router it defers to, best static, default
    run.verdict     # "ppo-policy", "supervised-router" or "best-static" (module docstring)

The policy is a residual policy over the supervised router. Everything up to the router is
`rl.routing.train`'s (`prepare`: the roles, the portfolio, the lazy per-(config, query) rows
and the features; `fit_router`: the router chosen by grouped cross-validation over train ∪
valid). Then:

- the router's base is held to the token budget, best static's mean tokens on valid
  (`fit_token_price` on the valid queries' out-of-fold predictions: the
  `supervised-router-equal-cost` baseline);
- PPO's observation is the query features followed by the router's view of the query
  (`rl.routing.router.stacked`: out of fold on train ∪ valid, where the router was fitted:
  the cross-validation's own folds, so the defer start spends on valid what the price
  allows);
  a `defer` head hands a query to the router's pick, the other heads pick a config from the
  whole space (`configs/routing/ppo.yaml`), under the PPO-Lagrangian token constraint;
- each seed starts from the better on valid of two behaviour-cloned starts (defer everywhere,
  the best static config), trains on train and keeps its checkpoint best on valid
  (`PerQueryPPO.train`); the seed best on valid (`better_on_valid`) is the policy;
- the policy is fixed as the directory serves it (`PPOPortfolioPolicy` over its greedy configs
  on train ∪ valid and the router's arms: a holdout query whose greedy config is not an arm
  gets PPO's most probable arm, counted as `test_off_list`), and the holdout is read once: the
  served picks' per-query reward, quality and tokens against the router, best static and the
  default (paired bootstrap 95% CIs, `rl.routing.train.system_rows`).

Checkpoints and resume: each seed checkpoints every iteration under `ppo/seed<s>/checkpoints`
(`PerQueryPPO.train`); with `resume` the router (`ppo/router.pkl`) and every finished seed
(`ppo/seed<s>/policy`) are reused and an unfinished seed continues from its checkpoint,
provided the run is the same (`ppo/run.json`: corpus, queries per role, tuner and PPO
settings, arms, seed; otherwise a ConfigError naming `resume`). Each seed's
iterations are logged to MLflow (experiment `ppo-policy`) when a tracking URI is given.

Verdict (`ppo_verdict`; the report says why with the deltas it rests on): PPO is served only
where it earns its place over the router it defers to, the shipped default:
"supervised-router" when the router is significantly ahead of PPO, or when PPO adds nothing
significant over the router and the router's own gain over best static has a CI above 0
(e.g. a kept PPO that is its defer-everywhere start, the router's picks); "ppo-policy" when PPO
is significantly ahead of both, or ahead of best static where the router is not; else
"best-static". The directory is
written whatever the verdict: `policy.json` + `model.pkl` (`PPOPortfolioPolicy` over the
router's arms and PPO's greedy configs on train ∪ valid), `ppo/seed<s>/` (each seed's
checkpoints and saved policy) and `report.json` / `report.md`.
"""

from __future__ import annotations

import hashlib
import json
import pickle
import time
from collections.abc import Callable
from dataclasses import asdict
from pathlib import Path
from typing import Any

import numpy as np

from rag.config import RAGConfig
from rag.errors import ConfigError
from rl.routing.train import (
    RouterRun,
    counts_of,
    delta_rows,
    fit_router,
    markdown,
    prepare,
    system_rows,
    tv_oof,
)

SUBJECT = "ppo-policy"
BASE_SYSTEM = "supervised-router-equal-cost"
SYSTEMS = (SUBJECT, BASE_SYSTEM, "best-static", "static-default")
WARM_STARTS = ("defer-to-router", "best-static")


RUN_FILE = "run.json"
"""Under `<out>/ppo/`: what the seeds were trained on (`_check_resume`)."""


ROUTER_FILE = "router.pkl"
"""Under `<out>/ppo/`: the router and its cross-validation record, reused on resume."""


def _queries_hash(prep: Any) -> str:
    """16 hex of sha256 over each role's query ids, in order."""
    h = hashlib.sha256()
    for role, (split, idx) in prep.parts.items():
        ids = [str(prep.ev.data.examples(split)[int(i)].id) for i in idx]
        h.update(f"{role}\x1f{split}\x1f{chr(31).join(ids)}\x1e".encode())
    return h.hexdigest()[:16]


def _check_resume(path: Path, fingerprint: dict[str, Any], resume: bool) -> bool:
    """With `resume`, a ConfigError naming `resume` unless `path` records the same run;
    then record this run. True when resuming a recorded run (nothing recorded: nothing to
    resume, a fresh start)."""
    same = False
    if resume and path.is_file():
        before = json.loads(path.read_text())
        diff = sorted(k for k in fingerprint if before.get(k) != fingerprint[k])
        if diff:
            raise ConfigError("resume", f"{path.parent} was trained on another run (its "
                                        f"{', '.join(diff)} differ): train into a new --out, "
                                        "or drop --resume to retrain here")
        same = True
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(fingerprint, indent=1) + "\n")
    return same


def train_ppo_policy(dataset: str, settings: Any, ppo: Any, out: str | Path, *, seed: int = 0,
                     seeds: int | None = None, iters: int | None = None,
                     max_train: int | None = None,
                     extra: list[tuple[str, RAGConfig]] | None = None,
                     resume: bool = False, tracking_uri: str | None = None,
                     log: Callable[[str], None] = print, overwrite: bool = False) -> RouterRun:
    """Train, choose, check and save the residual PPO policy of `dataset` (module docstring)
    with the tuner `settings` (reward, base config, space) and the PPO settings `ppo`
    (`PPOPolicySettings`); `seeds`: how many of `ppo.train.seeds` to train (default all),
    `iters`: PPO iterations per seed (default `ppo.train.iters`); a value below 1 is a
    ConfigError naming it. `seed`, `max_train`, `extra`: as `rl.routing.train.prepare`;
    `resume`, `tracking_uri`: module docstring; `overwrite`: as `train_router_policy` (a
    resumed run, one with a record under `out`/ppo, replaces its own policy)."""
    from rl.kernel.space import is_conversational
    from rl.routing.base import save_policy
    from rl.routing.heads import HeadLayout
    from rl.routing.ppo_policy import Checkpointing, PerQueryPPO, RoleData
    from rl.routing.ppo_serving import PPOPortfolioPolicy, ResidualBase
    from rl.routing.router import CV_FOLDS, stacked
    from rl.routing.selection import better_on_valid
    from rl.routing.warm_start import WarmStart
    from rl.routing.worlds import EvaluatorWorld
    from rl.stats.headroom import best_static, pick

    all_seeds = list(ppo.train.seeds)
    if seeds is not None and not 1 <= seeds <= len(all_seeds):
        raise ConfigError("seeds", f"must be 1..{len(all_seeds)} (ppo_policy.train.seeds has "
                                   f"{len(all_seeds)}), got {seeds}")
    if iters is not None and iters < 1:
        raise ConfigError("iters", f"must be >= 1, got {iters}")
    ppo = ppo.with_heads(defer=True)
    if iters is not None:
        ppo = ppo.with_train(iters=iters, eval_every=min(ppo.train.eval_every, iters))
    prep = prepare(dataset, settings, out, seed=seed, max_train=max_train, extra=extra,
                   log=log, overwrite=overwrite,
                   resumable=resume and (Path(out) / "ppo" / RUN_FILE).is_file())
    ev, out, names, configs, M, X = prep.ev, prep.out, prep.names, prep.configs, prep.M, prep.X
    fingerprint = {"data": ev.data.name, "corpus": ev.data.dataset.corpus.fingerprint(),
                   "queries": _queries_hash(prep), "seed": seed, "max_train": max_train,
                   "tuner": settings.model_dump(mode="json"),
                   "arms": [c.config_hash for c in configs], "ppo": ppo.model_dump(mode="json")}
    resumed = _check_resume(out / "ppo" / RUN_FILE, fingerprint, resume)
    t0 = time.perf_counter()
    router_file = out / "ppo" / ROUTER_FILE
    if resumed and router_file.is_file():  # the same run: its router, not a second CV
        router, sel = pickle.loads(router_file.read_bytes())
        log(f"  router: reused ({router_file})")
    else:
        router, sel = fit_router(prep, seed, log)
        router_file.write_bytes(pickle.dumps((router, sel)))
    static = best_static(M["valid"]["R"])
    budget_tokens = float(M["valid"]["T"][:, static].mean())
    # priced on the valid queries' out-of-fold predictions (the refitted router's own are
    # in-sample there), the same scores PPO's view of the router shows on train and valid
    oof = tv_oof(prep, router, sel, seed)
    price = router.fit_token_price(None, M["valid"]["T"], budget_tokens,
                                   scores=oof[len(X["train"]):])
    # the router's view: out of fold where it was fitted (train, valid), its own on test
    Xo, base_arms = stacked(router, price, static, X, M,
                            {r: prep.groups[r] for r in ("train", "valid")}, configs, seed,
                            oof=oof)
    bases = {role: [configs[j] for j in a] for role, a in base_arms.items()}
    worlds = {role: EvaluatorWorld(ev, split, idx) for role, (split, idx) in prep.parts.items()}
    layout = HeadLayout(ppo.heads, ev.policy, is_conversational(ev.data.dataset.examples))
    budget = budget_tokens / worlds["train"].cost_ref
    cap = budget * (1 + ppo.lagrange.slack)
    warm = [WarmStart("defer-to-router", [configs[j] for j in base_arms["train"]], defer=True),
            WarmStart(f"best-static:{names[static]}", [configs[static]])]
    pol, per_seed = None, []
    for s in all_seeds[:seeds]:
        t1 = time.perf_counter()
        seed_dir = out / "ppo" / f"seed{s}"
        if resume and (seed_dir / "policy" / "policy.json").is_file():
            cand, reused = PerQueryPPO.load(seed_dir / "policy"), True
            log(f"  [ppo seed {s}] finished before: reused ({seed_dir / 'policy'})")
        else:
            cand, reused = PerQueryPPO.create(layout, ppo, Xo["train"]), False
            cand.train(RoleData(worlds["train"], Xo["train"], bases["train"]),
                       RoleData(worlds["valid"], Xo["valid"], bases["valid"]), budget,
                       seed=s, warm=warm,
                       checkpointing=Checkpointing(seed_dir / "checkpoints", resume),
                       tracking_uri=tracking_uri, run_name=f"ppo-policy-{ev.data.name}-seed{s}",
                       log=lambda m, s=s: log(f"  [ppo seed {s}] {m}"))
            cand.save(seed_dir / "policy")
        per_seed.append({"seed": s, "best": cand.meta["best"],
                         "warm_start": cand.meta.get("warm_start"), "lambda_final": cand.lam,
                         "reused": reused, "wall_s": round(time.perf_counter() - t1, 1)})
        if pol is None or better_on_valid(cand.meta["best"], pol.meta["best"], cap):
            pol = cand
    # what the directory serves: PPO over a fixed arm list (its greedy configs on train ∪
    # valid, the router's arms); the holdout, read once, scores exactly that
    served = PPOPortfolioPolicy(pol, prep.X_tv, ResidualBase(router, configs, price, static))
    cfgs = [served.arms[a] for a in served.act(X["test"])]
    off_list, served.off_list = served.off_list, 0  # a served-request counter: saved at 0
    outs = worlds["test"].outcomes(cfgs)
    test = M["test"]
    n_test = len(test["R"])
    got = {SUBJECT: {"R": np.array([o.reward for o in outs]),
                     "Q": np.array([o.quality for o in outs]),
                     "T": np.array([o.cost for o in outs]) * worlds["test"].cost_ref}}
    for system, ch in ((BASE_SYSTEM, base_arms["test"]),
                       ("best-static", np.full(n_test, static)),
                       ("static-default", np.zeros(n_test, dtype=int))):
        got[system] = {k: pick(test[k], ch) for k in ("R", "Q", "T")}
    rows = system_rows(ev.data.name, got, seed, SUBJECT)
    rows += delta_rows(ev.data.name, got, BASE_SYSTEM, ["best-static"], seed)  # its own gain
    verdict, reason = ppo_verdict(rows)
    known = {c.config_hash: n for n, c in zip(names, configs, strict=True)}
    save_policy(served, out, base_config=settings.base_config(),
                names=[known.get(c.config_hash, f"ppo-{c.config_hash}") for c in served.arms],
                feature_names=prep.feature_names, kind="ppo")
    deferred = pol.deferred(Xo["test"])
    record = {"seeds": [p["seed"] for p in per_seed], "per_seed": per_seed,
              "chosen_seed": pol.meta["seed"], "warm_start": pol.meta.get("warm_start"),
              "warm_starts": list(WARM_STARTS), "iters": ppo.train.iters,
              "batch": ppo.train.batch, "heads": list(layout.names),
              "budget_tokens": budget_tokens, "token_price": price,
              "oof_folds": CV_FOLDS,
              "valid_reward": pol.meta["best"]["valid_reward"],
              "router_valid_reward": float(pick(M["valid"]["R"], base_arms["valid"]).mean()),
              "test_deferred": float(np.mean(deferred)),
              "distinct_test_configs": len({c.config_hash for c in cfgs}),
              "served_arms": len(served.arms), "test_off_list": off_list, "train_s": round(time.perf_counter() - t0, 1)}
    run = RouterRun(out, names, {r: len(i) for r, (_, i) in prep.parts.items()}, names[static],
                    {"params": asdict(router.params), "token_price": price,
                     "equal_cost": True, "valid_reward": record["router_valid_reward"],
                     "best_static_valid_reward": float(M["valid"]["R"][:, static].mean()),
                     "selection": "cv", "margin": router.margin,
                     "static_arm": names[router.static_arm],
                     "cv_reward": sel.tried[sel.best]["cv_reward"],
                     "cv_static_reward": float(prep.tv("R")[:, router.static_arm].mean())},
                    rows, verdict,
                    counts_of([known.get(c.config_hash, f"ppo-{c.config_hash}") for c in cfgs]),
                    SYSTEMS, prep.warnings, record, reason)
    (out / "report.json").write_text(json.dumps(run.to_dict(), indent=1) + "\n")
    (out / "report.md").write_text(markdown(run, prep.dataset))
    return run


def ppo_verdict(rows: list[dict[str, Any]]) -> tuple[str, str]:
    """(verdict, reason) from the holdout rows' `delta_reward` CIs (module docstring): PPO
    against the router it defers to, PPO and the router against best static."""
    def d(system: str) -> dict[str, Any]:
        for r in rows:
            if r["system"] == system and r["metric"] == "delta_reward":
                return r
        raise ValueError(f"no {system!r} delta_reward row: the verdict rests on it")

    vs_router, vs_static = d(f"{SUBJECT} - {BASE_SYSTEM}"), d(f"{SUBJECT} - best-static")
    router = d(f"{BASE_SYSTEM} - best-static")

    def said(name: str, r: dict[str, Any]) -> str:
        return f"{name} {r['value']:+.4f} [{r['ci_low']:+.4f}, {r['ci_high']:+.4f}]"

    ppo_router, ppo_static = said("PPO − router", vs_router), said("PPO − best static", vs_static)
    router_static = said("router − best static", router)
    if vs_router["ci_high"] < 0:
        return "supervised-router", f"it is ahead of the PPO policy ({ppo_router})"
    if vs_router["ci_low"] > 0 and vs_static["ci_low"] > 0:
        return SUBJECT, f"it is ahead of the router ({ppo_router}) and of best static ({ppo_static})"
    if router["ci_low"] > 0:
        return "supervised-router", (f"PPO adds nothing significant over it ({ppo_router}), and "
                                     f"its own gain over best static has a CI above 0 "
                                     f"({router_static}): the simpler policy")
    if vs_static["ci_low"] > 0:
        return SUBJECT, (f"its gain over best static has a CI above 0 ({ppo_static}) and the "
                         f"router's does not ({router_static})")
    return "best-static", f"{ppo_static}; {router_static}"
