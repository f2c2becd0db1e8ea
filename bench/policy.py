"""Per-query policies against the best static config: the supervised router (issue 19's B3)
and the per-segment lookup (B2), on HotpotQA, SciFact and MTRAG.

    python bench/policy.py                 # full: 3 datasets, train / valid / test
    python bench/policy.py --quick         # < 2 min: the synthetic world

Arms: the 30-config portfolio of `bench/headroom.py` (`PORTFOLIO`), plus, with `--search-json
FILE` (the results of a `bench/search.py` run), that run's best-known config
(`meta.details[<dataset>].best_known`). Every arm is evaluated on every query of train, valid
and test through the tuner's per-query tables (`TunerEvaluator.table`): reward =
`per_query_reward`, quality = αF + βR, cost = tokens. Latency is priced with the library's cost
model measured on this machine (`bench.common.evaluator`), stored in
`details[ds]["cost_model"]`. Features:
`rl.routing.features.QueryFeaturizer` over the memoised indexes with the policy's base config
(no gold).

Protocol (test is touched once, after every choice is made):
  * `best-static`: the arm with the best mean reward on valid;
  * `supervised-router`: per-arm gradient boosting, hyper-parameters
    (`rl.routing.router.PARAM_GRID`) chosen by grouped 4-fold cross-validation over train ∪
    valid (`select_router_cv`, margin 0: plain argmax), refitted on train ∪ valid;
  * `supervised-router-equal-cost`: the same router with a token price chosen on valid so
    that its mean tokens there stay at most best-static's, fitted on the cross-validation's
    out-of-fold predictions of the valid queries (the refitted router's own are in-sample
    there and priced too low: it overspent on test);
  * `per-segment-best`: the best arm per segment (HotpotQA type, SciFact gold-doc count, MTRAG
    domain × turn: `bench.headroom.segmentations`, dataset labels a serving policy would not
    have), chosen on train ∪ valid; unseen segments take the train ∪ valid best arm;
  * `per-query-oracle`: each test query's best arm (the upper bound).
  * `ppo-policy`: issue 19's per-query PPO policy (`bench/policy_ppo.py`: mixed action heads,
    PPO-Lagrangian under best-static's valid mean tokens, trained on train, checkpoint chosen
    on valid, 5 seeds). By default it starts from a behaviour-cloned warm start (`--ppo-warm`:
    the best static config, the router's train picks plain and at equal cost; the best clone
    on valid is iteration 0 of model selection). It picks configs outside the portfolio;
    their test outcomes come from the same lazy per-query evaluator. The oracle stays the
    portfolio's per-query oracle. `--ppo-budget-scales 1.0,0.75` adds `ppo-policy-budget0.75`
    (the same policy under 0.75 x the budget: the issue's cost route).
Synthetic (no train split): train and valid are the two halves of its valid split (seeded).

Rows on test: each system's `reward`, `quality`, `tokens` (mean, bootstrap 95% CI over
queries); `<system> - best-static` `delta_reward`, `delta_quality` (paired bootstrap 95% CI)
and `delta_cost_pct` (100·(mean tokens / best-static's − 1), paired bootstrap CI); and
`<system>` `headroom_captured` = mean(system − best-static) / mean(oracle − best-static),
paired bootstrap CI of the ratio. `ppo-policy` rows use its seed-averaged per-query values
(the CI is over test queries; per-seed values in `details[ds]["ppo"]`), plus
`ppo-policy - supervised-router` `delta_reward`.
"""

from __future__ import annotations

import argparse
import itertools
import json
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.common import (  # noqa: E402
    cost_model_used,
    evaluator,
    head_commit,
    make_meta,
    metric_row,
    write_results,
)
from bench.headroom import MAIN_SEGMENTS, matrices, segmentations  # noqa: E402
from bench.policy_ppo import SYSTEM as PPO  # noqa: E402
from bench.policy_ppo import (  # noqa: E402
    Part,
    Segment,
    run_ppo,
    segments,
    with_heads,
    with_train,
)
from bench.policy_report import TITLE, markdown  # noqa: E402
from rag.config import RAGConfig  # noqa: E402
from rag.corpus.loaders import data_root  # noqa: E402
from rag.types import conversation_of  # noqa: E402
from rl.kernel.settings import TunerSettings  # noqa: E402
from rl.routing.base import save_policy  # noqa: E402
from rl.routing.features import (  # noqa: E402
    FEATURE_NAMES,
    QueryFeaturizer,
    conversation_views,
    feature_names,
)
from rl.routing.portfolio import portfolio, with_formulations  # noqa: E402
from rl.routing.ppo_serving import PPOPortfolioPolicy, ResidualBase  # noqa: E402
from rl.routing.router import (  # noqa: E402
    CV_FOLDS,
    ROUTER_FEATURE_NAMES,
    SegmentLookup,
    arm_features,
    select_router_cv,
    stacked,
)
from rl.routing.settings import PPOPolicySettings  # noqa: E402
from rl.routing.train import role_indices  # noqa: E402
from rl.routing.warm_start import WarmStart  # noqa: E402
from rl.stats.headroom import best_static, group_folds, oracle_choice, pick  # noqa: E402
from rl.stats.rows import cost_pct, delta_row, ratio_row  # noqa: E402

NAME = "policy"
BASELINE = "best-static"
SYSTEMS = ("supervised-router", "supervised-router-equal-cost", "per-segment-best",
           "per-query-oracle")


def _search_meta(path: Path | None) -> dict:
    """The `meta` of `bench/search.py`'s results at `path` ({} for None); a missing file is
    the caller's error (`OSError`)."""
    return json.loads(Path(path).read_text()).get("meta", {}) if path else {}


def _best_known(meta: dict, ds: str) -> dict:
    return (meta.get("details", {}).get(ds) or {}).get("best_known") or {}


def search_best(ds: str, path: Path | None = None) -> RAGConfig | None:
    """The best-known config for `ds` in `bench/search.py`'s results at `path`, or None (no
    path, or none for `ds`)."""
    cfg = _best_known(_search_meta(path), ds).get("config")
    return RAGConfig.from_dict(cfg) if cfg else None


def search_best_provenance(ds: str, path: Path | None = None) -> dict | None:
    """Which config the `search-best-known` arm was, and where it came from (None without one):
    a search's best-known moves whenever it finds a better one, so a policy run
    records the one it used (its hash, valid reward, finder and the file's commit)."""
    meta = _search_meta(path)
    best = _best_known(meta, ds)
    if not best.get("config"):
        return None
    return {"config_hash": RAGConfig.from_dict(best["config"]).config_hash,
            "valid_reward": best.get("reward"), "method": best.get("method"),
            "seed": best.get("seed"), "file": str(path), "file_commit": meta.get("commit")}


def arms(ds: str, policy: TunerSettings, search_json: Path | None = None,
         formulations: Sequence[str] = ()) -> list[tuple[str, RAGConfig]]:
    """The headroom portfolio, plus the best-known config of the search results `search_json`
    when given and it has one for `ds`, plus
    (`formulations`: conversational data) the portfolio's arms with each other query
    formulation (`rl.routing.portfolio.with_formulations`; the best-known config as it is)."""
    out = portfolio(policy)
    best = search_best(ds, search_json)
    if best is not None and best.config_hash not in {c.config_hash for _, c in out}:
        out.append(("search-best-known", best))
    return with_formulations(out, formulations, skip={"search-best-known"})


def _parts(ev, seed: int, max_train: int | None = None) -> dict[str, tuple[str, np.ndarray]]:
    """role (train / valid / test) -> (split name, query indices into that split): the shipped
    router's roles (`rl.routing.train.role_indices`; a train split longer than `max_train` is a
    seeded random subset of that many queries)."""
    return role_indices(ev, seed, max_train)


def _delta_rows(ds: str, system: str, M: dict[str, np.ndarray], ch: np.ndarray, base: int,
                oracle: np.ndarray, seed: int) -> list[dict]:
    """`system - best-static` deltas and the system's headroom share (module docstring)."""
    got = {k: pick(M[k], ch) for k in ("R", "Q", "T")}
    return _delta_rows_of(ds, system, {k: M[k][:, base] for k in ("R", "Q", "T")}, got,
                          pick(M["R"], oracle), seed, system != "per-query-oracle")


def _delta_rows_of(ds: str, system: str, base: dict[str, np.ndarray],
                   got: dict[str, np.ndarray], oracle_r: np.ndarray, seed: int,
                   headroom: bool = True) -> list[dict]:
    """The same rows from per-query arrays {"R", "Q", "T"} of best-static (`base`) and of
    the system (`got`); `oracle_r`: the per-query oracle's rewards."""
    name = f"{system} - {BASELINE}"
    rows = [delta_row(ds, name, metric, base[k], got[k], seed)
            for metric, k in (("delta_reward", "R"), ("delta_quality", "Q"))]
    rows.append(ratio_row(ds, name, "delta_cost_pct", got["T"], base["T"], cost_pct, seed))
    if headroom:
        rows.append(ratio_row(ds, system, "headroom_captured", got["R"] - base["R"],
                              oracle_r - base["R"], lambda a, b: a / b, seed))
    return rows


WARM_STARTS = ("best-static", "supervised-router", "supervised-router-equal-cost",
               "defer-to-router")
BASES = ("router", "none")
DEFAULT_WARM = {"router": ("best-static", "defer-to-router"),
                "none": ("best-static", "supervised-router", "supervised-router-equal-cost")}
"""The warm starts tried when --ppo-warm is not given, per --ppo-base."""


@dataclass(frozen=True)
class PPORun:
    """How the bench runs the PPO policy: its warm starts (`WARM_STARTS`, or none), the
    `train` grid chosen on valid (first seed), the token budgets as multiples of
    best-static's valid mean (1.0 is `ppo-policy`; others are `ppo-policy-budget<x>`) and its
    base policy: "router" (a residual policy: a `defer` head hands a query to the supervised
    router held to the same budget, and the router's out-of-fold view of each query joins the
    observation, `stacked`) or "none" (PPO alone on the query features)."""

    warm: tuple[str, ...] = DEFAULT_WARM["router"]
    grid: tuple[dict[str, Any], ...] = ({},)
    budget_scales: tuple[float, ...] = (1.0,)
    base: str = "router"


def ppo_system(scale: float) -> str:
    return PPO if scale == 1.0 else f"{PPO}-budget{scale:g}"


def warm_starts(names: Sequence[str], configs: list[tuple[str, RAGConfig]], base: int,
                 R_valid: np.ndarray, T_valid: np.ndarray, cap_tokens: float,
                 router_train: dict[str, np.ndarray]) -> list[WarmStart]:
    """`best-static`: B1 (or, when B1's valid tokens exceed the budget, the best arm on valid
    within it); `supervised-router` / `supervised-router-equal-cost`: the router's picks on
    the training queries (plain, or with the token price that holds it to the budget on
    valid); `defer-to-router`: defer = 1 on every query (`router_train["defer-to-router"]`:
    the base picks, what the other heads learn)."""
    out = []
    for n in names:
        if n == "best-static":
            ok = np.flatnonzero(T_valid.mean(axis=0) <= cap_tokens * (1 + 1e-9))
            j = base if base in ok or not ok.size else ok[np.argmax(R_valid[:, ok].mean(0))]
            out.append(WarmStart(f"best-static:{configs[j][0]}", [configs[j][1]]))
        elif n in router_train:
            out.append(WarmStart(n, [configs[j][1] for j in router_train[n]],
                                 defer=n == "defer-to-router"))
        else:
            raise ValueError(f"unknown warm start {n!r} ({', '.join(WARM_STARTS)})")
    return out


def equal_quality_tokens(T: dict[str, np.ndarray], base: int
                         ) -> tuple[np.ndarray, np.ndarray]:
    """Per test query: the tokens of the cheapest arm whose quality is at least best-static's
    there, and best-static's tokens."""
    ok = T["Q"] >= T["Q"][:, [base]] - 1e-12
    return np.where(ok, T["T"], np.inf).min(axis=1), T["T"][:, base]


def equal_quality_summary(cheapest: np.ndarray, base_tokens: np.ndarray, seed: int
                          ) -> dict[str, Any]:
    """`delta_cost_pct` of the per-query cheapest equal-quality arm against best static, with
    its paired bootstrap CI."""
    r = ratio_row("", "", "", cheapest, base_tokens, cost_pct, seed)
    return {"delta_cost_pct": r["value"], "ci_low": r["ci_low"], "ci_high": r["ci_high"]}


def equal_quality_oracle(T: dict[str, np.ndarray], base: int, seed: int) -> dict[str, Any]:
    """Per test query the cheapest arm whose quality is at least best-static's there: the
    most tokens any portfolio policy could save at no per-query quality loss (an upper bound
    on the cost route of the acceptance)."""
    return equal_quality_summary(*equal_quality_tokens(T, base), seed)


def crossfit_parts(ev, k: int, seed: int) -> list[dict[str, list[Segment]]]:
    """`k` cross-fitted folds over every query of the data's train, tune and holdout splits:
    conversations (`conversation_of`) are shuffled (seeded) and dealt to the fold with the
    fewest queries so far; fold f is test once, fold f+1 (mod k) its valid, the rest its
    train. Every query is in exactly one test fold and no conversation straddles roles."""
    if k < 3:
        raise ValueError(f"cross-fitting needs k >= 3 folds (test, valid, train), got {k}")
    names = list(dict.fromkeys(s for s in ("train", ev.slice.tune_split,
                                           ev.slice.holdout_split) if s in ev.data.splits))
    groups: dict[str, list[tuple[str, int]]] = {}
    for s in names:
        for i, e in enumerate(ev.data.examples(s)):
            groups.setdefault(conversation_of(e), []).append((s, i))
    if len(groups) < k:
        raise ValueError(f"{len(groups)} conversations cannot fill {k} folds")
    labels = [g for g, qs in groups.items() for _ in qs]
    fold_of = dict(zip(labels, group_folds(labels, k, seed).tolist(), strict=True))

    def role(folds: set[int]) -> list[Segment]:
        out = []
        for s in names:
            idx = sorted(i for g, qs in groups.items() if fold_of[g] in folds
                         for s_, i in qs if s_ == s)
            if idx:
                out.append((s, np.asarray(idx, dtype=int)))
        return out

    return [{"train": role(set(range(k)) - {f, (f + 1) % k}), "valid": role({(f + 1) % k}),
             "test": role({f})} for f in range(k)]


def _rows_of(M: dict[str, dict[str, np.ndarray]], part: Part) -> dict[str, np.ndarray]:
    """A role's (queries × arms) R, Q, T from the per-split matrices `M`, in `part`'s order."""
    return {k: np.vstack([M[s][k][idx] for s, idx in segments(part)]) for k in ("R", "Q", "T")}


def role_data(ev, parts: dict[str, Part], full: dict[str, dict[str, np.ndarray]],
              Xs: dict[str, dict[int, np.ndarray]]) -> tuple[dict, dict, dict]:
    """Per role (train / valid / test), in `parts`' query order: its (queries × arms) R, Q, T
    (`_rows_of`), its feature matrix (from `_features`' `Xs`) and its examples."""
    M = {role: _rows_of(full, part) for role, part in parts.items()}
    X = {role: np.vstack([Xs[s][int(i)] for s, idx in segments(part) for i in idx])
         for role, part in parts.items()}
    examples = {role: [ev.data.examples(s)[i] for s, idx in segments(part) for i in idx]
                for role, part in parts.items()}
    return M, X, examples


@dataclass
class FoldResult:
    """One train / valid / test protocol's test outcomes: per system the per-query arrays
    {"R", "Q", "T"} (test order), the oracle's rewards, the details."""

    got: dict[str, dict[str, np.ndarray]]
    oracle_r: np.ndarray
    eq_oracle: tuple[np.ndarray, np.ndarray]
    """Per test query: the cheapest equal-quality arm's tokens, best-static's tokens."""
    details: dict[str, Any]


def served_policy_dir(pol, reference: np.ndarray, residual: ResidualBase | None,
                      names: list[str], base_config: RAGConfig, views: Sequence[str],
                      out: Path) -> Path:
    """Write a trained PPO policy as a policy directory `ragpilot serve` loads
    (`rl.routing.ppo_serving.PPOPortfolioPolicy` over its greedy configs on `reference`, the
    raw features of its train and valid queries, plus the router's arms when residual)."""
    served = PPOPortfolioPolicy(pol, reference, residual)
    known = {} if residual is None else {c.config_hash: n for n, c in
                                         zip(names, residual.arms, strict=True)}
    return save_policy(served, out, base_config=base_config,
                       names=[known.get(c.config_hash, f"ppo-{c.config_hash}")
                              for c in served.arms],
                       feature_names=feature_names(views))


def _fold(ds: str, ev, configs: list[tuple[str, RAGConfig]], parts: dict[str, Part],
          full: dict[str, dict[str, np.ndarray]], Xs: dict[str, dict[int, np.ndarray]],
          seed: int, ppo: PPOPolicySettings | None, ppo_out: Path | None,
          ppo_deadline: float | None, ppo_run: PPORun, views: Sequence[str] = ()
          ) -> FoldResult:
    """Every system chosen on `parts`' train and valid, acted once on its test (the protocol
    of the module docstring). `Xs[split][i]`: query i's features."""
    names = [n for n, _ in configs]
    M, X, examples = role_data(ev, parts, full, Xs)
    base = best_static(M["valid"]["R"])
    budget = float(M["valid"]["T"][:, base].mean())
    tv = {"X": np.vstack([X["train"], X["valid"]]),
          **{k: np.vstack([M["train"][k], M["valid"][k]]) for k in ("R", "T")}}
    tv_groups = [conversation_of(e) for e in examples["train"] + examples["valid"]]
    router, sel = select_router_cv(tv["X"], tv["R"], tv["T"], tv_groups, seed=seed,
                                   arms=arm_features([c for _, c in configs]))
    plain = router.choose(X["test"], 0.0)
    # priced on valid, where the budget is measured (best static alone spends exactly it),
    # by the out-of-fold predictions: the refitted router's own are in-sample there
    oof_valid = sel.oof[len(X["train"]):]
    price = router.fit_token_price(None, M["valid"]["T"], budget, scores=oof_valid)
    eq = router.choose(X["test"], price)
    key = MAIN_SEGMENTS.get(ds, "type")
    seg_labels = {role: segmentations(ds, ex)[key] for role, ex in examples.items()}
    both = np.vstack([M["train"]["R"], M["valid"]["R"]])
    lookup = SegmentLookup().fit(both, seg_labels["train"] + seg_labels["valid"])
    seg = lookup.choose(seg_labels["test"])
    T = M["test"]
    oracle = oracle_choice(T["R"])
    choices = {BASELINE: np.full(len(oracle), base), "static-default": np.zeros_like(oracle),
               "supervised-router": plain, "supervised-router-equal-cost": eq,
               "per-segment-best": seg, "per-query-oracle": oracle}
    got = {system: {k: pick(T[k], ch) for k in ("R", "Q", "T")}
           for system, ch in choices.items()}
    ppo_details = {}
    for scale in ppo_run.budget_scales if ppo is not None else ():
        system = ppo_system(scale)
        cap = scale * budget
        price_s = router.fit_token_price(None, M["valid"]["T"], cap, scores=oof_valid)
        picks = {"supervised-router": router.choose(X["train"], 0.0),
                 "supervised-router-equal-cost": router.choose(X["train"], price_s)}
        X_ppo, bases, settings = X, None, ppo
        if ppo_run.base == "router":
            groups = {r: [conversation_of(e) for e in examples[r]] for r in ("train", "valid")}
            X_ppo, base_arms = stacked(router, price_s, base, X, M, groups,
                                       [c for _, c in configs], seed, oof=sel.oof)
            bases = {role: [configs[j][1] for j in arms_] for role, arms_ in base_arms.items()}
            picks["defer-to-router"] = base_arms["train"]
            settings = with_heads(ppo, defer=True)
        warm = warm_starts(ppo_run.warm, configs, base, M["valid"]["R"], M["valid"]["T"], cap,
                           picks)
        kept: list = []
        got[system], ppo_details[system] = run_ppo(
            ev, parts, X_ppo, cap, settings, list(ppo.train.seeds),
            None if ppo_out is None else ppo_out / system, ppo_deadline, warm,
            ppo_run.grid, system, keep=kept, base=bases)
        if ppo_out is not None:  # each seed's policy as a directory the Serve app loads
            residual = (None if bases is None else
                        ResidualBase(router, [c for _, c in configs], price_s, base))
            for p_seed, pol in zip(ppo_details[system]["seeds"], kept, strict=True):
                served_policy_dir(pol, np.vstack([X["train"], X["valid"]]), residual, names,
                                  ev.policy.base_config(), views,
                                  ppo_out / system / f"seed{p_seed}" / "served")
        ppo_details[system]["budget_scale"] = scale
        if bases is not None:
            b_test = pick(T["R"], base_arms["test"])
            ppo_details[system]["base"] = {
                "policy": "supervised-router-equal-cost", "token_price": price_s,
                "oof_folds": CV_FOLDS, "features": list(ROUTER_FEATURE_NAMES),
                "train_oof_reward": float(pick(M["train"]["R"], base_arms["train"]).mean()),
                "train_insample_reward": float(pick(M["train"]["R"], picks[
                    "supervised-router-equal-cost"]).mean()),
                "valid_reward": float(pick(M["valid"]["R"], base_arms["valid"]).mean()),
                "test_reward": float(b_test.mean())}

    def used(ch: np.ndarray) -> dict[str, int]:
        u, c = np.unique(ch, return_counts=True)
        return {names[i]: int(k) for i, k in sorted(zip(u, c, strict=True), key=lambda x: -x[1])}

    eq_tokens = equal_quality_tokens(T, base)
    details = {
        "n": {role: len(ex) for role, ex in examples.items()},
        "splits": {role: "+".join(s for s, _ in segments(part)) for role, part in parts.items()},
        "arms": names, "best_static": names[base], "token_budget": budget,
        "router": {"rule": "cv", "selection": sel.tried, "chosen": sel.best,
                   "token_price": price, "static_arm": names[router.static_arm],
                   "margin": router.margin, "margins": sorted({t["margin"] for t in sel.tried}),
                   "price_on": "valid, out of fold", "cv_folds": CV_FOLDS,
                   "cv_reward": sel.tried[sel.best]["cv_reward"],
                   "cv_best_static_reward": float(tv["R"][:, router.static_arm].mean()),
                   "valid_reward": float(pick(M["valid"]["R"], router.choose(X["valid"], 0.0))
                                         .mean()),
                   "valid_best_static_reward": float(M["valid"]["R"][:, base].mean()),
                   "test_arms": used(plain), "test_arms_equal_cost": used(eq)},
        "segments": {"key": key, "table": {s: names[j] for s, j in lookup.table.items()},
                     "fallback": names[lookup.fallback]},
        "ppo": ppo_details.get(PPO), "ppo_variants": {k: v for k, v in ppo_details.items()
                                                       if k != PPO},
        "equal_quality_oracle": equal_quality_summary(*eq_tokens, seed),
    }
    return FoldResult(got, pick(T["R"], oracle), eq_tokens, details)


def system_rows(ds: str, got: dict[str, dict[str, np.ndarray]], oracle_r: np.ndarray,
                seed: int) -> list[dict]:
    """The rows of the module docstring from per-query test arrays per system (one
    protocol's, or cross-fitted folds' concatenated: then `best-static` is each fold's)."""
    rows = []
    for system, arr in got.items():
        for metric, k in (("reward", "R"), ("quality", "Q"), ("tokens", "T")):
            rows.append(metric_row(ds, system, metric, arr[k], seed))
    ppos = [s for s in got if s == PPO or s.startswith(PPO + "-budget")]
    for system in (*SYSTEMS, *ppos):
        rows.extend(_delta_rows_of(ds, system, got[BASELINE], got[system], oracle_r, seed,
                                   system != "per-query-oracle"))
    for system in ppos:
        for other in ("supervised-router", "supervised-router-equal-cost"):
            rows.append(delta_row(ds, f"{system} - {other}", "delta_reward", got[other]["R"],
                                  got[system]["R"], seed))
    return rows


def _features(ev, policy: TunerSettings, all_parts: list[dict[str, Part]],
              formulations: Sequence[str] = ()) -> dict[str, dict[int, np.ndarray]]:
    """Features of every query some role uses, per split (each query featurised once), with
    the retrieval features on each of `formulations` too (`QueryFeaturizer`)."""
    feat = QueryFeaturizer(ev.memo, policy.base_config(), formulations)
    need: dict[str, set[int]] = {}
    for parts in all_parts:
        for part in parts.values():
            for s, idx in segments(part):
                need.setdefault(s, set()).update(int(i) for i in idx)
    out = {}
    for s, idx in need.items():
        order = sorted(idx)
        X = feat.matrix([ev.data.examples(s)[i] for i in order])
        out[s] = dict(zip(order, X, strict=True))
    ev.memo.flush()
    return out


def run_dataset(ds: str, policy: TunerSettings, seed: int, rows: list, details: dict,
                search_json: Path | None = None, ppo: PPOPolicySettings | None = None,
                ppo_out: Path | None = None, max_train: int | None = None,
                ppo_deadline: float | None = None, ppo_run: PPORun | None = None,
                folds: int = 1) -> None:
    """All systems on `ds`; `ppo`: the PPO policy's settings (None: no `ppo-policy` rows);
    `ppo_run`: its warm starts, grid and budgets (`PPORun`). `folds` > 1: cross-fitted
    (`crossfit_parts`: every query is test once, in its fold; the rows are over all of them
    and `details[ds]["crossfit"]` holds each fold's choices); else the committed splits."""
    t0 = time.perf_counter()
    commit = head_commit()  # the code that runs (HEAD may move meanwhile)
    run = ppo_run or PPORun()
    ev, cost_source = evaluator(ds, policy)
    # conversational data: formulation arms and views (bench/router_formulation.py's design)
    views = conversation_views(ev.data.dataset.examples)
    configs = arms(ds, policy, search_json, views)
    all_parts = crossfit_parts(ev, folds, seed) if folds > 1 else [_parts(ev, seed, max_train)]
    split_names = sorted({s for parts in all_parts for part in parts.values()
                          for s, _ in segments(part)})
    full = {s: matrices(ev, configs, s) for s in split_names}
    t1 = time.perf_counter()
    Xs = _features(ev, policy, all_parts, views)
    feat_s = time.perf_counter() - t1
    results = []
    for f, parts in enumerate(all_parts):
        out = (None if ppo_out is None else
               ppo_out / ds / (f"fold{f}" if folds > 1 else ""))
        results.append(_fold(ds, ev, configs, parts, full, Xs, seed, ppo, out, ppo_deadline,
                             run, views))
        if folds > 1:
            print(f"[{ds}] fold {f + 1}/{folds} done", flush=True)
    got = {system: {k: np.concatenate([r.got[system][k] for r in results])
                    for k in ("R", "Q", "T")} for system in results[0].got}
    rows.extend(system_rows(ds, got, np.concatenate([r.oracle_r for r in results]), seed))
    if folds > 1:
        eq = equal_quality_summary(*(np.concatenate([r.eq_oracle[j] for r in results])
                                     for j in (0, 1)), seed)
        d = {"crossfit": {"k": folds, "seed": seed, "group": "conversation",
                          "folds": [r.details for r in results]},
             "n": {"test": int(len(got[BASELINE]["R"]))}, "arms": results[0].details["arms"],
             "equal_quality_oracle": eq}
    else:
        d = results[0].details
    details[ds] = {
        **d,
        "n_train_split": len(ev.data.examples("train")) if "train" in ev.data.splits else None,
        "search_best_known": ("search-best-known" in d["arms"]
                              and search_best_provenance(ds, search_json)),
        "formulation_views": list(views), "n_features": len(feature_names(views)),
        "part_commit": commit,
        "features_s": round(feat_s, 1), "wall_s": round(time.perf_counter() - t0, 1),
        "counters": dict(ev.counters), "cost_model": cost_model_used(ev, cost_source),
    }
    print(f"[{ds}] done in {details[ds]['wall_s']}s (features {feat_s:.1f}s)", flush=True)


def _deadline(hhmm: str | None) -> float | None:
    """Epoch seconds of HH:MM UTC today, or None."""
    if not hhmm:
        return None
    import datetime as dt

    h, m = (int(x) for x in hhmm.split(":"))
    now = dt.datetime.now(dt.UTC)
    return now.replace(hour=h, minute=m, second=0, microsecond=0).timestamp()


def _ppo_settings(a: argparse.Namespace) -> PPOPolicySettings:
    """configs/routing/ppo.yaml with the command line's overrides (--quick: 1 seed, 3 iters)."""
    s = PPOPolicySettings.load()
    train: dict[str, Any] = {}
    if a.quick:
        train = {"iters": 3, "seeds": (0,), "eval_every": 3}
    if a.ppo_iters:
        train["iters"] = a.ppo_iters
    if a.ppo_seeds:
        train["seeds"] = tuple(int(x) for x in a.ppo_seeds.split(","))
    if train:
        s = with_train(s, **train)
    return s


def _ppo_run(a: argparse.Namespace) -> PPORun:
    """--ppo-warm, --ppo-grid ("lr=3e-4,1e-3;entropy_coeff=0,0.01": every combination) and
    --ppo-budget-scales from the command line (exit 2 naming the flag on a bad value)."""
    try:
        if a.ppo_base not in BASES:
            raise ValueError(f"--ppo-base {a.ppo_base!r}: one of {', '.join(BASES)}")
        text = ",".join(DEFAULT_WARM[a.ppo_base]) if a.ppo_warm is None else a.ppo_warm
        warm = tuple(w for w in text.split(",") if w and w != "none")
        if "defer-to-router" in warm and a.ppo_base != "router":
            raise ValueError("the defer-to-router warm start needs --ppo-base router")
        grid: tuple[dict[str, Any], ...] = ({},)
        if a.ppo_grid:
            axes = [(k.strip(), [float(x) for x in v.split(",")])
                    for k, v in (part.split("=", 1) for part in a.ppo_grid.split(";"))]
            grid = tuple(dict(zip([k for k, _ in axes], vals, strict=True))
                         for vals in itertools.product(*[v for _, v in axes]))
            for g in grid:
                with_train(PPOPolicySettings(), **g)
        scales = tuple(float(x) for x in a.ppo_budget_scales.split(","))
        if any(x <= 0 for x in scales):
            raise ValueError("budget scales must be > 0")
        bad = set(warm) - set(WARM_STARTS)
        if bad:
            raise ValueError(f"unknown warm start {sorted(bad)} ({', '.join(WARM_STARTS)})")
    except Exception as e:  # noqa: BLE001 - any parse error is the user's flag
        print(f"error: --ppo-warm/--ppo-grid/--ppo-budget-scales/--ppo-base: {e}",
              file=sys.stderr)
        raise SystemExit(2) from e
    return PPORun(warm, grid, scales, a.ppo_base)


def _crossfit(text: str) -> dict[str, int]:
    """--crossfit "mtrag=5,scifact=4" -> {dataset: folds} ("none": {}); exit 2 naming the
    flag on a bad value."""
    if text.strip() in ("", "none"):
        return {}
    try:
        out = {}
        for item in text.split(","):
            ds, k = item.split("=", 1)
            out[ds.strip()] = int(k)
            if out[ds.strip()] < 3:
                raise ValueError(f"{item!r}: K must be >= 3 (test, valid and train folds)")
    except ValueError as e:
        print(f"error: --crossfit: {e} (expected DATASET=K[,...] or none)", file=sys.stderr)
        raise SystemExit(2) from e
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true", help="the synthetic world only (< 2 min)")
    ap.add_argument("--datasets", default="hotpotqa,scifact,mtrag")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--search-json", type=Path, default=None,
                    help="a bench/search.py results JSON written by a search run (under runs/), "
                         "whose best-known config per dataset joins the arms (default: none)")
    ap.add_argument("--no-ppo", action="store_true", help="skip the ppo-policy system")
    ap.add_argument("--ppo-iters", type=int, default=None,
                    help="PPO iterations per seed (default: configs/routing/ppo.yaml)")
    ap.add_argument("--ppo-seeds", default=None, help="comma-separated seeds (default: yaml)")
    ap.add_argument("--ppo-base", default="router",
                    help="router: PPO is a residual policy over the supervised router held to "
                         "its budget (a defer head; the router's out-of-fold view joins the "
                         "observation); none: PPO alone on the query features")
    ap.add_argument("--ppo-warm", default=None,
                    help="behaviour-cloning warm starts of the PPO policy, the best on valid "
                         "is used: " + ", ".join(WARM_STARTS) + ", or none (a random start); "
                         "default: " + "; ".join(f"{k}: {','.join(v)}"
                                                 for k, v in DEFAULT_WARM.items()))
    ap.add_argument("--ppo-grid", default=None,
                    help='PPO train settings tried per seed, chosen on valid, e.g. '
                         '"lr=3e-4,1e-3;entropy_coeff=0,0.01" (every combination)')
    ap.add_argument("--ppo-budget-scales", default="1.0",
                    help="token budgets as multiples of best-static's valid mean: 1.0 is "
                         "ppo-policy, another x adds the system ppo-policy-budget<x>")
    ap.add_argument("--ppo-out", type=Path, default=None,
                    help="where the PPO checkpoints and saved policies go, each seed's "
                         "policy also as a directory the Serve app loads "
                         "(DIR/<dataset>/ppo-policy/seed<s>/served; default: none)")
    ap.add_argument("--ppo-deadline", default=None,
                    help="HH:MM (UTC, today): start no PPO seed after it (the shared machine's "
                         "time box; the seeds run are listed in the details)")
    ap.add_argument("--max-train", type=int, default=None,
                    help="use a seeded subset of this many train queries (the row budget)")
    ap.add_argument("--crossfit", default="mtrag=5",
                    help="datasets evaluated by cross-fitted folds instead of their committed "
                         "splits, as DATASET=K[,...] (K >= 3), or none (issue 19: MTRAG is "
                         "small)")
    a = ap.parse_args()
    datasets = ["synthetic"] if a.quick else a.datasets.split(",")
    policy = TunerSettings.defaults()
    ppo = None if a.no_ppo else _ppo_settings(a)
    ppo_run = _ppo_run(a)
    crossfit = _crossfit(a.crossfit)
    unknown = sorted(set(crossfit) - set(datasets))
    if unknown and a.crossfit != ap.get_default("crossfit"):
        print(f"error: --crossfit: {unknown} not among the datasets run "
              f"({', '.join(datasets)}): nothing would be cross-fitted", file=sys.stderr)
        raise SystemExit(2)
    rows: list[dict] = []
    details: dict[str, Any] = {}
    t0 = time.perf_counter()
    for ds in datasets:
        run_dataset(ds, policy, a.seed, rows, details, a.search_json, ppo, a.ppo_out,
                    a.max_train, _deadline(a.ppo_deadline), ppo_run,
                    folds=crossfit.get(ds, 1))
    files = {} if a.quick else {d: data_root() / d for d in datasets}
    meta = make_meta(a.seed, files, {
        "quick": a.quick, "wall_s": round(time.perf_counter() - t0, 1),
        "crossfit": {ds: d["crossfit"]["k"] for ds, d in details.items() if d.get("crossfit")},
        "base_config": policy.base_config().model_dump(mode="json"),
        "features": list(FEATURE_NAMES),
        "ppo_settings": None if ppo is None else ppo.model_dump(mode="json"),
        "ppo_run": None if ppo is None else {"warm": list(ppo_run.warm), "base": ppo_run.base,
                                             "grid": list(ppo_run.grid),
                                             "budget_scales": list(ppo_run.budget_scales)},
        "search_json": str(a.search_json) if a.search_json else None,
        "reward": {"weights": policy.reward_weights.model_dump(mode="json", by_alias=True),
                   "cost_ref_tokens": policy.cost_ref_tokens},
        "details": details})
    write_results(NAME, rows, meta, TITLE, markdown(meta, rows))


if __name__ == "__main__":
    main()
