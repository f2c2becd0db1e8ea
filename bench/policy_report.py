"""The markdown of `bench/policy.py`: a summary per dataset and one table of test rows."""

from __future__ import annotations

from typing import Any

TITLE = ("Per-query policies vs the best static config: PPO policy, supervised router (B3), "
         "per-segment (B2)")
PPO = "ppo-policy"


def _fmt(r: dict | None, pct: bool = False) -> str:
    if r is None:
        return "–"
    v, lo, hi = r["value"], r.get("ci_low"), r.get("ci_high")
    f = "{:+.1f}" if pct else ("{:+.3f}" if "delta" in r["metric"] else "{:.3f}")
    if r["metric"] == "tokens":
        f = "{:.0f}"
    s = f.format(v)
    if lo is not None and hi is not None:
        g = f.replace("+", "")
        s += f" [{g.format(lo)}, {g.format(hi)}]"
    return s


def _get(rows: list[dict], ds: str, system: str, metric: str) -> dict | None:
    return next((r for r in rows if r["dataset"] == ds and r["system"] == system
                 and r["metric"] == metric), None)


def _folds(d: dict) -> list[dict]:
    """A dataset's protocols: its cross-fitted folds' details, or itself (committed splits)."""
    return d["crossfit"]["folds"] if d.get("crossfit") else [d]


def _has_ppo(d: dict) -> bool:
    return any(f.get("ppo") for f in _folds(d))


def _cv(r: dict) -> bool:
    """Whether the router was chosen by cross-validation over train ∪ valid (rule `cv`)."""
    return r.get("rule") == "cv"


def _chosen(r: dict) -> str:
    """How the router was chosen and how it scored there, against the static arm it keeps."""
    t = r["selection"][r["chosen"]]
    if _cv(r):
        return (f"chosen by {r['cv_folds']}-fold CV over train ∪ valid: max_iter "
                f"{t['max_iter']}, leaves {t['max_leaf_nodes']}, shrink {t['shrink']}, "
                f"margin {t['margin']:g} over `{r['static_arm']}`; CV reward "
                f"{r['cv_reward']:.3f} vs that arm's {r['cv_best_static_reward']:.3f}")
    return (f"chosen on valid: max_iter {t['max_iter']}, leaves {t['max_leaf_nodes']}, "
            f"shrink {t['shrink']}; valid reward {r['valid_reward']:.3f} vs best static "
            f"{r['valid_best_static_reward']:.3f}")


def _behind_static(r: dict) -> bool:
    """The router scored below the static arm where it was chosen (CV or valid)."""
    if _cv(r):
        return r["cv_reward"] < r["cv_best_static_reward"]
    return r["valid_reward"] < r["valid_best_static_reward"]


def _any_cv(meta: dict) -> bool:
    return any(_cv(f["router"]) for d in meta["details"].values() for f in _folds(d))


def _plain_cv(meta: dict) -> bool:
    """Every dataset's router chosen by CV with margin 0 alone, priced out of fold."""
    folds = [f for d in meta["details"].values() for f in _folds(d)]
    return bool(folds) and all(f["router"].get("margins") == [0.0] and
                               f["router"].get("price_on") == "valid, out of fold"
                               for f in folds)


def _test_arms(d: dict) -> dict[str, int]:
    """The router's test choices, summed over folds, most used first."""
    out: dict[str, int] = {}
    for f in _folds(d):
        for k, v in f["router"]["test_arms"].items():
            out[k] = out.get(k, 0) + v
    return dict(sorted(out.items(), key=lambda x: -x[1]))


def _crossfit_summary(ds: str, d: dict, rows: list[dict]) -> str:
    """A cross-fitted dataset: pooled rows, then what each fold chose."""
    g = lambda s, m: _get(rows, ds, s, m)  # noqa: E731
    c = d["crossfit"]
    folds = "; ".join(
        f"fold {i + 1}: train {f['n']['train']} / valid {f['n']['valid']} / test "
        f"{f['n']['test']}, best static `{f['best_static']}`, router ({_chosen(f['router'])})"
        for i, f in enumerate(c["folds"]))
    return " ".join([
        f"**{ds}** (cross-fitted: {c['k']} folds by {c['group']} over all {d['n']['test']} "
        f"queries of its train, valid and test splits, seed {c['seed']}; {len(d['arms'])} "
        f"arms). Every system is chosen afresh in each fold and acts once on that fold's "
        f"test queries, so each row below is over all {d['n']['test']} queries; "
        f"`best-static` is each fold's valid choice (test reward "
        f"{_fmt(g('best-static', 'reward'))}). Per fold: {folds}.",
        f"The supervised router gains "
        f"{_fmt(g('supervised-router - best-static', 'delta_reward'))} reward (quality "
        f"{_fmt(g('supervised-router - best-static', 'delta_quality'))}, tokens "
        f"{_fmt(g('supervised-router - best-static', 'delta_cost_pct'), True)}%) and captures "
        f"{_fmt(g('supervised-router', 'headroom_captured'))} of the per-query oracle's "
        f"headroom ({_fmt(g('per-query-oracle - best-static', 'delta_reward'))}); held to "
        f"each fold's best-static valid tokens: "
        f"{_fmt(g('supervised-router-equal-cost - best-static', 'delta_reward'))}. "
        f"Per-segment lookup ({c['folds'][0]['segments']['key']}, chosen per fold on train ∪ "
        f"valid): {_fmt(g('per-segment-best - best-static', 'delta_reward'))} reward.",
    ])


def _summary(ds: str, d: dict, rows: list[dict]) -> str:
    g = lambda s, m: _get(rows, ds, s, m)  # noqa: E731
    r = d["router"]
    parts = [
        f"**{ds}** (train {d['n']['train']} / valid {d['n']['valid']} / test {d['n']['test']} "
        f"queries{'; train and valid are halves of the valid split' if d['splits']['train'] == d['splits']['valid'] else ''}"
        f"; {len(d['arms'])} arms). Best static on valid: `{d['best_static']}` "
        f"(test reward {_fmt(g('best-static', 'reward'))}).",
        f"The supervised router ({_chosen(r)}) gains "
        f"{_fmt(g('supervised-router - best-static', 'delta_reward'))} reward on test "
        f"(quality {_fmt(g('supervised-router - best-static', 'delta_quality'))}, tokens "
        f"{_fmt(g('supervised-router - best-static', 'delta_cost_pct'), True)}%) and captures "
        f"{_fmt(g('supervised-router', 'headroom_captured'))} of the per-query oracle's "
        f"headroom ({_fmt(g('per-query-oracle - best-static', 'delta_reward'))}).",
        f"Held to best static's valid tokens (price {r['token_price']:.2e}/token): "
        f"{_fmt(g('supervised-router-equal-cost - best-static', 'delta_reward'))} reward, "
        f"tokens {_fmt(g('supervised-router-equal-cost - best-static', 'delta_cost_pct'), True)}%.",
        f"Per-segment lookup ({d['segments']['key']}, chosen on train ∪ valid): "
        f"{_fmt(g('per-segment-best - best-static', 'delta_reward'))} reward.",
    ]
    return " ".join(parts)


def _overall(meta: dict, rows: list[dict]) -> str:
    """One paragraph across datasets, from the rows (no hand-written numbers)."""
    dss = list(meta["details"])
    cap = ", ".join(f"{ds} {_fmt(_get(rows, ds, 'supervised-router', 'headroom_captured'))}"
                    for ds in dss)
    wins = [ds for ds in dss if (_get(rows, ds, "supervised-router - best-static",
                                      "delta_reward") or {}).get("ci_low", -1) > 0]
    below = [ds for ds, d in meta["details"].items()
             if all(_behind_static(f["router"]) for f in _folds(d))]
    text = (f"Share of the per-query oracle's headroom over the best static config that the "
            f"supervised router captures on test: {cap}. Its reward gain has a 95% CI above 0 "
            f"on {len(wins)} of {len(dss)} datasets{' (' + ', '.join(wins) + ')' if wins else ''}"
            ".")
    eq = [ds for ds in dss if (_get(rows, ds, "supervised-router-equal-cost - best-static",
                                    "delta_reward") or {}).get("ci_low", -1) > 0]
    if eq:
        text += (" Held to best static's valid tokens, the router's gain has a CI above 0 on "
                 + ", ".join(f"{ds} ({_fmt(_get(rows, ds, 'supervised-router-equal-cost - best-static', 'delta_reward'))})"  # noqa: E501
                             for ds in eq) + ".")
    caps = [(_get(rows, ds, "supervised-router", "headroom_captured") or {}).get("value", 0)
            for ds in dss]
    if max(caps, default=0) < 0.3:
        rest = [ds for ds in dss if ds not in wins]
        text += ((" Outside " + ", ".join(wins) + "," if wins and rest else "")
                 + (" these" if wins and rest else " These")
                 + " pre-answer features with a full-information regressor find little of "
                 "the room the oracle shows: either most of it is per-query outcome noise no "
                 "pre-answer signal predicts, or it needs stronger signals; this run does not "
                 "tell which.")
    ppo = [ds for ds in dss if _get(rows, ds, PPO + " - best-static", "delta_reward")]
    if ppo:
        d = {ds: _get(rows, ds, PPO + " - best-static", "delta_reward") for ds in ppo}
        v = {ds: _get(rows, ds, PPO + " - supervised-router", "delta_reward") for ds in ppo}
        text += (" The PPO policy's reward against the best static config: "
                 + ", ".join(f"{ds} {_fmt(d[ds])}" for ds in ppo)
                 + "; against the supervised router: "
                 + ", ".join(f"{ds} {_fmt(v[ds])}" for ds in ppo) + ".")
        above = [ds for ds in ppo if d[ds]["ci_low"] > 0]
        below_bs = [ds for ds in ppo if d[ds]["ci_high"] < 0]
        text += (f" Its reward CI is above best static's on {len(above)} of {len(ppo)} "
                 f"datasets{' (' + ', '.join(above) + ')' if above else ''} and below it on "
                 f"{len(below_bs)}{' (' + ', '.join(below_bs) + ')' if below_bs else ''}.")
        if any(v[ds]["value"] < -0.005 for ds in ppo):
            worse = [ds for ds in ppo if v[ds]["value"] < -0.005]
            text += (f" It trails the supervised router by more than 0.005 on "
                     f"{', '.join(worse)}, so the supervised router stays the default "
                     "per-query policy and PPO an option.")
    text += _rl_phase(meta)
    if below:
        text += (f" On {', '.join(below)} even the router scores below the static config "
                 f"where it was chosen; a deployment would keep the static config.")
    return text


def _seed_runs(meta: dict) -> list[dict]:
    """Every `ppo-policy` seed run's record, over datasets and folds."""
    return [x for d in meta["details"].values() for f in _folds(d)
            for x in (f.get("ppo") or {}).get("per_seed", [])]


def _kept_starts(meta: dict) -> str:
    """Where (nearly) every seed run kept its warm start, the targets met are the start's,
    not PPO's."""
    runs = _seed_runs(meta)
    moved = sum((x.get("best") or {}).get("iter", 0) > 0 for x in runs)
    if not runs or moved > len(runs) // 10:
        return ""
    if moved == 0:
        return (f" No seed run kept a PPO update (0 of {len(runs)}): every `ppo-policy` row "
                "is the warm start model selection kept (deferring to the router held to the "
                "budget, or the best static config), so a target met here is met by that "
                "start, not by what PPO learnt.")
    return (f" Only {moved} of {len(runs)} seed runs kept a PPO update; every other "
            "`ppo-policy` value is the warm start model selection kept (deferring to the "
            "router held to the budget, or the best static config), so a target met here is "
            "met mostly by that start, not by what PPO learnt (compare `ppo-policy - "
            "supervised-router-equal-cost`).")


def _rl_phase(meta: dict) -> str:
    """What PPO's own updates contributed: over every seed run (per fold), how many kept a
    checkpoint after iteration 0 (one that beat its warm start on valid under the selection
    rule) rather than the warm start itself, and which starts were kept."""
    runs = _seed_runs(meta)
    if not runs:
        return ""
    moved = sum(1 for x in runs if (x.get("best") or {}).get("iter", 0) > 0)
    starts: dict[str, int] = {}
    for x in runs:
        k = str(x.get("warm_start") or "cold start").split(":")[0]
        starts[k] = starts.get(k, 0) + 1
    kept = ", ".join(f"{k} {v}" for k, v in sorted(starts.items(), key=lambda t: -t[1]))
    return (f" PPO's own updates: {moved} of {len(runs)} seed runs (all datasets and folds) "
            f"kept a checkpoint from after its warm start; {len(runs) - moved} kept the start itself "
            f"(starts kept: {kept}), so where no checkpoint moved, the `ppo-policy` rows are "
            f"those of its start.")


def _ppo_summary(ds: str, d: dict, rows: list[dict]) -> str:
    if d.get("crossfit"):
        return _crossfit_ppo_text(ds, d, rows, PPO)
    p = d.get("ppo")
    if not p:
        return ""
    return _ppo_text(ds, d, rows, p, PPO)


def _crossfit_ppo_text(ds: str, d: dict, rows: list[dict], system: str) -> str:
    """PPO on a cross-fitted dataset: pooled rows, then per fold its seeds' test means."""
    g = lambda s, m: _get(rows, ds, s, m)  # noqa: E731
    key = "ppo" if system == PPO else None
    ps = [(f.get(key) if key else (f.get("ppo_variants") or {}).get(system))
          for f in d["crossfit"]["folds"]]
    if not all(ps):
        return ""
    p0 = ps[0]
    per_fold = "; ".join(
        f"fold {i + 1} (budget {p['budget_tokens']:.0f} tokens): "
        + ", ".join(f"seed {x['seed']} {x['test_reward']:.3f} ({_start(x)}, pick iter "
                    f"{x['best']['iter']})" for x in p["per_seed"])
        for i, p in enumerate(ps))
    warm = (f"warm starts {', '.join(p0['warm_starts'])}, the better on valid kept"
            if p0.get("warm_starts") else "random initial policy")
    return (f"`{system}` on {ds} (per fold {len(p0['seeds'])} seeds × {p0['iters']} "
            f"iterations × {p0['batch']} queries; {warm}; token budget = that fold's "
            f"best-static valid mean): {_fmt(g(system + ' - best-static', 'delta_reward'))} "
            f"reward vs best static (quality "
            f"{_fmt(g(system + ' - best-static', 'delta_quality'))}, tokens "
            f"{_fmt(g(system + ' - best-static', 'delta_cost_pct'), True)}%), "
            f"{_fmt(g(system + ' - supervised-router', 'delta_reward'))} vs the supervised "
            f"router{_vs_base(g, system)}, headroom captured "
            f"{_fmt(g(system, 'headroom_captured'))}. Per fold, "
            f"test reward per seed: {per_fold}." + _base_text(ps)
            + (_clone_fidelity(d) if system == PPO else ""))


def _vs_base(g: Any, system: str) -> str:
    r = g(system + " - supervised-router-equal-cost", "delta_reward")
    return "" if r is None else f" ({_fmt(r)} vs the router held to the budget)"


def _base_text(ps: list[dict]) -> str:
    """A residual PPO's base (the router it defers to), per protocol: the router's reward on
    train out of fold (what PPO's defer head was trained against) and in sample, on valid
    and on test, and the share of test queries each seed deferred."""
    out = []
    for i, p in enumerate(ps):
        b = p.get("base")
        if not b:
            continue
        where = f"fold {i + 1}: " if len(ps) > 1 else ""
        deferred = ", ".join(f"{x.get('test_deferred', float('nan')):.0%}"
                             for x in p["per_seed"])
        out.append(f"{where}router reward train {b['train_oof_reward']:.3f} out of fold "
                   f"({b['train_insample_reward']:.3f} in sample), valid "
                   f"{b['valid_reward']:.3f}, test {b['test_reward']:.3f}; test queries "
                   f"deferred per seed {deferred}")
    if not out:
        return ""
    return (" Its base, `supervised-router-equal-cost` (the defer head's target): "
            + "; ".join(out) + ".")


def _clone_fidelity(d: dict) -> str:
    """How well the router's clone (PPO's warm start) reproduces the router: the share of train
    queries whose router pick PPO's heads can express, and the clone's valid reward against
    the router's, per protocol (first seed's records)."""
    out = []
    for f in _folds(d):
        p = f.get("ppo") or {}
        recs = [h for x in p.get("per_seed", [])[:1] for h in x["history"]
                if h["iter"] == 0 and h.get("start") == "supervised-router"]
        if recs and "expressible" in recs[0]:
            out.append(f"{recs[0]['expressible']:.0%} expressible, valid "
                       f"{recs[0]['valid_reward']:.3f} vs the router's "
                       f"{f['router']['valid_reward']:.3f}")
    if not out:
        return ""
    return (" The router's clone (the `supervised-router` warm start): " + "; ".join(out)
            + ". A pick is inexpressible when PPO's heads cannot set it (a rerank mix, a "
            "depth or k outside the heads' lists, or, before the normalisation head, a zscore "
            "or rrf hybrid); the clone then targets the nearest expressible config.")


def _start(x: dict) -> str:
    """The warm start PPO began from and its valid reward (iteration 0), if any."""
    h0 = [h for h in x["history"] if h["iter"] == 0 and h.get("start") == x.get("warm_start")]
    if not h0:
        return "cold start"
    return f"start {x['warm_start']} (valid {h0[0]['valid_reward']:.3f})"


def _ppo_text(ds: str, d: dict, rows: list[dict], p: dict, system: str) -> str:
    g = lambda s, m: _get(rows, ds, s, m)  # noqa: E731
    seeds = "; ".join(f"seed {x['seed']}: test reward {x['test_reward']:.3f}, tokens "
                      f"{x['test_tokens']:.0f}, {_start(x)}, valid pick iter "
                      f"{x['best']['iter']} ({x['best']['valid_reward']:.3f})"
                      + (f" with {x['hp']}" if x.get("hp") else "")
                      + f", λ {x['lambda_final']:.2f}, {x['distinct_test_configs']} configs, "
                      f"{x['wall_s']:.0f}s" for x in p["per_seed"])
    sub = d.get("n_train_split")
    notes = []
    if sub and sub > d["n"]["train"]:
        notes.append(f"train is a seeded subset of {d['n']['train']} of the {sub} train "
                     "queries (`--max-train`, the row budget of the shared machine; the router "
                     "and per-segment table use the same subset)")
    if p.get("seeds_not_run"):
        notes.append(f"seeds {p['seeds_not_run']} were not run: the time box "
                     "(`--ppo-deadline`) passed before they could start")
    note = (" Note: " + "; ".join(notes) + ".") if notes else ""
    warm = (f"warm starts {', '.join(p['warm_starts'])}, the better on valid kept"
            if p.get("warm_starts") else "random initial policy")
    grid = f"; per-seed grid {p['grid']} chosen on valid" if len(p.get("grid", [])) > 1 else ""
    return (f"`{system}` on {ds} ({len(p['seeds'])} seeds × {p['iters']} iterations × "
            f"{p['batch']} queries; {warm}{grid}; token budget {p['budget_tokens']:.0f}): "
            f"{_fmt(g(system + ' - best-static', 'delta_reward'))} reward vs best static "
            f"(quality {_fmt(g(system + ' - best-static', 'delta_quality'))}, tokens "
            f"{_fmt(g(system + ' - best-static', 'delta_cost_pct'), True)}%), "
            f"{_fmt(g(system + ' - supervised-router', 'delta_reward'))} vs the supervised "
            f"router{_vs_base(g, system)}, headroom captured "
            f"{_fmt(g(system, 'headroom_captured'))}. Per seed: "
            f"{seeds}.{note}" + _base_text([p])
            + (_clone_fidelity(d) if system == PPO else ""))


def _acceptance(meta: dict, rows: list[dict]) -> list[str]:
    """Issue 19's pre-registered targets for ppo-policy, each met or missed with its margin."""
    dss = [ds for ds, d in meta["details"].items() if _has_ppo(d)]
    if not dss:
        return []
    out = ["## Acceptance (issue 19, pre-registered; ppo-policy)", "",
           "| dataset | Δreward vs best static (target: CI low > 0 and Δ ≥ +0.02; or Δquality "
           "CI low ≥ −0.005 and Δcost ≤ −25%) | vs router (≥ −0.005) | headroom captured "
           "(≥ 0.30) |", "|---|---|---|---|"]
    wins = 0
    for ds in dss:
        dr = _get(rows, ds, PPO + " - best-static", "delta_reward")
        dq = _get(rows, ds, PPO + " - best-static", "delta_quality")
        dc = _get(rows, ds, PPO + " - best-static", "delta_cost_pct")
        vr = _get(rows, ds, PPO + " - supervised-router", "delta_reward")
        hc = _get(rows, ds, PPO, "headroom_captured")
        a = dr["ci_low"] > 0 and dr["value"] >= 0.02
        b = dq["ci_low"] >= -0.005 and dc["value"] <= -25
        wins += a or b
        first = (f"{'met' if a or b else 'missed'}: Δ {_fmt(dr)} (margin to +0.02: "
                 f"{dr['value'] - 0.02:+.3f}; CI low {dr['ci_low']:+.3f}); Δquality CI low "
                 f"{dq['ci_low']:+.3f}, Δcost {dc['value']:+.1f}% (margin to −25%: "
                 f"{dc['value'] + 25:+.1f} pts)")
        second = (f"{'met' if vr['value'] >= -0.005 else 'missed'}: {_fmt(vr)} (margin "
                  f"{vr['value'] + 0.005:+.3f})")
        third = (f"{'met' if hc['value'] >= 0.30 else 'missed'}: {_fmt(hc)} (margin "
                 f"{hc['value'] - 0.30:+.3f})")
        out.append(f"| {ds} | {first} | {second} | {third} |")
    crossfit = [ds for ds in dss if meta["details"][ds].get("crossfit")]
    out += ["", f"The first target asks for ≥ 2 of 3 datasets: met on {wins} of {len(dss)}. "
            "Nothing here was tuned on test"
            + (f" ({', '.join(crossfit)}: cross-fitted, each query tested by the fold that "
               "did not train or choose on it)" if crossfit else "")
            + (", except the checkpoint rule, chosen after the previous run's SciFact test "
               "read (see above)" if _selection(meta) else "") + "." + _kept_starts(meta),
            ""]
    variants = sorted({s for d in meta["details"].values() for f in _folds(d)
                       for s in (f.get("ppo_variants") or {})})
    for v in variants:
        out += [f"The cost route by `{v}` (the same PPO policy trained under a lower token "
                "budget; an exploratory system, not the pre-registered `ppo-policy`): "
                "Δquality CI low ≥ −0.005 and Δcost ≤ −25% against best static.", "",
                "| dataset | Δquality | Δcost % | Δreward | route met |", "|---|---|---|---|---|"]
        for ds in dss:
            dq = _get(rows, ds, v + " - best-static", "delta_quality")
            dc = _get(rows, ds, v + " - best-static", "delta_cost_pct")
            dr = _get(rows, ds, v + " - best-static", "delta_reward")
            if dq is None:
                continue
            ok = dq["ci_low"] >= -0.005 and dc["value"] <= -25
            out.append(f"| {ds} | {_fmt(dq)} (CI low margin {dq['ci_low'] + 0.005:+.3f}) | "
                       f"{_fmt(dc, True)} (margin {dc['value'] + 25:+.1f} pts) | {_fmt(dr)} | "
                       f"{'met' if ok else 'missed'} |")
        out.append("")
    return out


def _protocol(meta: dict) -> str:
    """How each dataset's train / valid / test were formed: committed splits or folds."""
    out = []
    for ds, d in meta["details"].items():
        if d.get("crossfit"):
            c = d["crossfit"]
            out.append(f"{ds} is cross-fitted ({c['k']} folds by {c['group']}, seed "
                       f"{c['seed']}: its splits are pooled, each fold is test once with the "
                       f"next fold as valid and the rest as train, and its rows are over all "
                       f"{d['n']['test']} queries, each acted on by a policy that neither "
                       "trained nor chose on it).")
        elif ds == "mtrag":
            out.append(f"MTRAG's train split ({d['n']['train']} queries) is used as is (not "
                       "cross-fitted: the committed splits).")
    return (" ".join(out) + " ") if out else ""


def _formulations(meta: dict) -> str:
    """Which datasets' routers also chose the query formulation (conversational data)."""
    out = []
    for ds, d in meta["details"].items():
        views = d.get("formulation_views") or []
        if views:
            out.append(f"On {ds} (conversational) every non-abstaining portfolio arm is also an "
                       f"arm with the {' and '.join(f'`{v}`' for v in views)} query "
                       f"formulations ({len(d['arms'])} arms: "
                       "`rl.routing.portfolio.with_formulations`), and the features add the "
                       "retrieval features on each of those formulations and their "
                       f"differences ({d['n_features']} columns: "
                       "`rl.routing.features.conversation_views`), the design the retired "
                       "router_formulation study chose on train ∪ valid with test unread "
                       "(docs/results.md).")
    return (" ".join(out) + " ") if out else ""


def _residual(meta: dict) -> str:
    """What PPO is built on (`meta.ppo_run.base`): alone, or a residual policy over the
    router."""
    if ((meta.get("ppo_run") or {}).get("base") or "none") != "router":
        return ""
    folds = sorted({((f.get("ppo") or {}).get("base") or {}).get("oof_folds", 5)
                    for d in meta["details"].values() for f in _folds(d)})
    return ("Here PPO is a residual policy over the supervised router (`--ppo-base router`): "
            "a `defer` head hands a query to `supervised-router-equal-cost` (the router held "
            "to the same token budget), its other heads act only when it does not defer, and "
            "its observation adds the router's view of the query (predicted reward of its pick "
            "and of the best static arm, their gap, the pick's margin, tokens and "
            "descriptors: `rl.routing.router.router_features`). On train that view and the "
            f"base picks come from routers fitted out of fold ({'/'.join(map(str, folds))} "
            "folds grouped by conversation"
            + ("; the router's own cross-validation folds, whose predictions its token price "
               "is fitted on" if folds == [4] else "")
            + "), so PPO learns against the router as good as it is on new "
            "queries. Warm starts: defer everywhere (own heads cloned to the router's "
            "out-of-fold picks) and the best static config. The previous design, PPO alone "
            "on the query features, is `bench/results/policy-standalone.json` (commit "
            "869309b). ")


def _selection(meta: dict) -> str:
    """The checkpoint rule the run used (`ppo_policy.train.selection`) and where it came from."""
    rule = ((meta.get("ppo_settings") or {}).get("train") or {}).get("selection", "mean")
    if rule != "evidence":
        return ""
    return ("A checkpoint replaces that start (or an earlier checkpoint) only when the paired "
            "bootstrap 95% CI of its per-query gain on valid is above 0 (`train.selection: "
            "evidence`). That rule was adopted after the previous run (commit 9f06db7), in "
            "which two SciFact seeds kept checkpoints ahead on valid by +0.003 and +0.009 and "
            "behind on test by 0.02–0.04: SciFact's PPO rows are not untouched by test. ")


def markdown(meta: dict, rows: list[dict]) -> str:
    def _arm(ds: str, prov: object) -> str:  # a bool in runs before the provenance was kept
        return f"{ds} `{prov['config_hash']}`" if isinstance(prov, dict) else ds

    covered = ", ".join(_arm(d, x["search_best_known"]) for d, x in meta["details"].items()
                        if x.get("search_best_known"))
    out = [
        "Rows are on the test split (touched once, after every choice was made): mean per "
        "query with a bootstrap 95% CI; `X - best-static` rows are paired bootstrap CIs over "
        "test queries; `delta_cost_pct` = 100·(mean tokens / best-static's − 1); "
        "`headroom_captured` = mean(X − best-static) / mean(oracle − best-static). Reward = "
        "the tuner's per-query reward (quality − latency and token cost, no batch gates). "
        "Arms: the 30-config portfolio of `bench/headroom.py`"
        + (f" plus, on the datasets it covers ({covered or 'none'}), the best-known config of "
           f"`bench/search.py` (`search-best-known`, read from {meta['search_json']})."
           if meta.get(
            "search_json") else "; no search results were given (`--search-json`), "
           "so issue 19's B1 (the searchers' best-known static config) is not among the arms "
           "and `best-static` is the portfolio's best on valid.")
        + ((" The router's hyper-parameters are chosen by grouped 4-fold cross-validation "
            "over train ∪ valid and it is refitted on both (`rl.routing.router."
            "select_router_cv` with margin 0: plain argmax, ties to the best static arm of "
            "train ∪ valid; the rule the design study below chose); its token price holds "
            "its mean tokens on valid to best static's there, fitted on the cross-"
            "validation's out-of-fold predictions of the valid queries (the refitted "
            "router's own are in-sample there: a price fitted on them let the router "
            "overspend on test); `best-static` " if _plain_cv(meta) else
            " The router's hyper-parameters and switching margin are chosen by grouped "
            "4-fold cross-validation over train ∪ valid and it is refitted on both "
            "(`rl.routing.router.select_router_cv`: it keeps the best static arm of train ∪ "
            "valid unless its predicted gain over it exceeds the margin); its token price "
            "holds its mean tokens on valid to best static's there (on train ∪ valid a price "
            "sent every HotpotQA query to the cheapest arm, because best static itself spends "
            "more on train than on valid); `best-static` ")
           + "stays the valid split's choice. The rule replaced selection on valid after a "
           "design study on train ∪ valid only, test unread (the retired router_selection "
           "study, docs/results.md)" if _any_cv(meta) else " The router is fitted on train, its "
           "hyper-parameters and token price chosen on valid")
        + "; the per-segment table uses dataset labels (HotpotQA type, MTRAG domain × "
        "turn) that a serving policy would not have. "
        + _protocol(meta)
        + _formulations(meta)
        + "`ppo-policy` (issue 19, `rl.routing.ppo_policy`): RLlib PPO with mixed action heads "
        "(variant incl. graph, k, rerank depth, generator arm, fusion weight, MMR λ, abstain "
        "threshold; query formulation on MTRAG), no-op heads masked out of the loss, trained "
        "on train under a PPO-Lagrangian bound on mean tokens (best-static's on valid), "
        "checkpoint chosen on valid by realised reward among those within the bound; test "
        "touched once. Where the run names warm starts (`meta.ppo_run.warm`), the module is "
        "first behaviour-cloned (`rl.routing.warm_start`) to each of them — the best static "
        "config, the supervised router's picks on train (plain and held to the budget) — the "
        "clone best on valid is where PPO starts, and it is model selection's iteration 0, so "
        "the kept policy is never worse on valid than that start. "
        + _residual(meta)
        + _selection(meta)
        + "It picks configs outside "
        "the portfolio, scored by the same lazy "
        "per-query evaluator; the oracle stays the portfolio's per-query oracle, so its "
        "`headroom_captured` can exceed 1. Its rows are over the seed-averaged per-query "
        "values (CIs over test queries); per-seed values are listed below.",
        "",
        "## What it says",
        "",
    ]
    out += [_overall(meta, rows), ""]
    for ds, d in meta["details"].items():
        if d.get("crossfit"):
            out += [_crossfit_summary(ds, d, rows), "", _ppo_summary(ds, d, rows), ""]
            for system in sorted({s for f in _folds(d) for s in (f.get("ppo_variants") or {})}):
                out += [_crossfit_ppo_text(ds, d, rows, system), ""]
        else:
            out += [_summary(ds, d, rows), ""]
            if d.get("ppo"):
                out += [_ppo_summary(ds, d, rows), ""]
            for system, p in (d.get("ppo_variants") or {}).items():
                out += [_ppo_text(ds, d, rows, p, system), ""]
        eq = d.get("equal_quality_oracle")
        if eq:
            out += [f"Equal-quality oracle on {ds} (per test query the cheapest arm whose "
                    f"quality is at least best static's there): tokens "
                    f"{eq['delta_cost_pct']:+.1f}% [{eq['ci_low']:+.1f}, {eq['ci_high']:+.1f}] "
                    "against best static, the most any portfolio policy could save at no "
                    "quality loss on any query.", ""]
    out += _acceptance(meta, rows)
    variants = sorted({s for d in meta["details"].values() for f in _folds(d)
                       for s in (f.get("ppo_variants") or {})})
    systems = ["static-default", "best-static", PPO, *variants, "supervised-router",
               "supervised-router-equal-cost", "per-segment-best", "per-query-oracle"]
    for ds in meta["details"]:
        out += [f"## {ds}", "", "| system | reward | quality | tokens |", "|---|---|---|---|"]
        for s in systems:
            out.append(f"| {s} | " + " | ".join(_fmt(_get(rows, ds, s, m))
                                                  for m in ("reward", "quality", "tokens"))
                       + " |")
        out += ["", "| comparison | delta_reward | delta_quality | delta_cost_pct | "
                "headroom_captured |", "|---|---|---|---|---|"]
        for s in systems[2:]:
            name = f"{s} - best-static"
            out.append(f"| {name} | {_fmt(_get(rows, ds, name, 'delta_reward'))} | "
                       f"{_fmt(_get(rows, ds, name, 'delta_quality'))} | "
                       f"{_fmt(_get(rows, ds, name, 'delta_cost_pct'), True)} | "
                       f"{_fmt(_get(rows, ds, s, 'headroom_captured'))} |")
        for s in [PPO, *variants]:
            for other in ("supervised-router", "supervised-router-equal-cost"):
                vr = _get(rows, ds, f"{s} - {other}", "delta_reward")
                if vr is not None:
                    out.append(f"| {s} - {other} | {_fmt(vr)} | – | – | – |")
        arms = _test_arms(meta["details"][ds])
        top = ", ".join(f"`{k}` {v}" for k, v in list(arms.items())[:6])
        out += ["", f"Router's test choices (top 6 of {len(arms)} arms used): {top}.", ""]
    return "\n".join(out)
