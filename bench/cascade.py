"""A policy that observes before it spends: the threshold cascade (`rl.routing.cascade`) on the
generated world and on the three real datasets.

    python bench/cascade.py            # world 5 seeds + hotpotqa, scifact, mtrag -> cascade.{json,md}
    python bench/cascade.py --quick    # world 1 seed + hotpotqa -> cascade.quick.*

Attempt signals are stored beside the evaluator's rows (`rl.routing.cascade.AttemptStore`):
a rerun answers only the questions no earlier run attempted.

Data per dataset and seed: `rl.routing.train.prepare` (the router's roles train / valid / test
and every portfolio arm's per-query rows from the evaluator's cache). Per cheap candidate
(`cheap_candidates`) its attempt is run on every role's questions (`attempt_signals`, with the
reference-free answer signals) and the cascade is chosen on train + valid (`select_cascade`);
stage 2 is any other arm or an abstention (`with_abstention`).

World (`synthetic-choices`): τ and the pair maximise valid reward (the reward prices tokens);
row `headroom_captured` of system `cascade-threshold` per seed and their mean, with the
definition and paired bootstrap of `bench.learners.headroom_captured`. Target (fixed before
the run): >= 0.70.
Real data: equal cost = the best static config's (highest valid reward) mean tokens on valid.
The operating point is chosen on valid, before the test split is scored: the cascade of the
highest valid quality within 75% of that budget when its valid quality is at least the best
static config's (the token-cut target), else the one of the highest valid quality within the
whole budget (the quality target). Rows `delta_quality` (paired bootstrap CI) and
`delta_tokens_pct` (ratio CI) of `cascade-threshold - best-static` on test, the escalation
rate on test, and on valid `escalation_auc`: the ROC AUC of the cascade's confidence for
"the cheap answer is as good as the strong one" (how well the observations separate the
questions that need escalation; 0.5 = not at all), beside the best single feature's.
Target on >= 2 of 3 datasets: quality CI low > 0 at <= equal cost, or tokens <= -25% at
non-inferior quality (quality CI low >= -0.01).
"""

from __future__ import annotations

import argparse
import contextlib
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.common import make_meta, plain_row, write_results  # noqa: E402
from bench.learners import headroom_captured  # noqa: E402
from rag.corpus.loaders import data_root  # noqa: E402
from rag.errors import ConfigError  # noqa: E402
from rl.kernel.settings import TunerSettings  # noqa: E402
from rl.routing.cascade import (  # noqa: E402
    TIE,
    cascade_inputs,
    outcomes,
    select_cascade,
    signal_names,
)
from rl.routing.train import prepare  # noqa: E402
from rl.stats.headroom import best_static  # noqa: E402
from rl.stats.rows import cost_pct, delta_row, ratio_row  # noqa: E402

NAME = "cascade"
TITLE = "A policy that observes before it spends: the threshold cascade"
WORLD = "synthetic-choices"
REAL = ("hotpotqa", "scifact", "mtrag")
SEEDS = (0, 1, 2, 3, 4)
HEADROOM_TARGET = 0.70
TOKENS_TARGET = -25.0
NONINFERIOR = -0.01
SYSTEM = "cascade-threshold"
CUT_BUDGET = 0.75
"""The token-cut operating point's budget, a share of equal cost (the -25% target)."""
EQUAL, CUT = "equal-cost", "cut25"
"""The two operating points' names (the one not chosen on valid is reported as
`cascade-threshold@<name> - best-static`, for reference only: the verdict is the chosen one's)."""


def run(dataset: str, settings: TunerSettings, work: Path, seed: int, budgeted: bool,
        log) -> dict[str, Any]:
    """One dataset and seed: the prepared rows, the best static arm, the chosen cascade and
    its test outcomes."""
    t0 = time.perf_counter()
    prep = prepare(dataset, settings, work / f"{dataset}-{seed}", seed=seed, log=log)
    static = best_static(prep.M["valid"]["R"])
    budget = float(prep.M["valid"]["T"][:, static].mean()) if budgeted else None
    M, names, Z = cascade_inputs(prep, budget, log)
    tv = {c: {r: z[r] for r in ("train", "valid")} for c, z in Z.items()}
    points = {EQUAL: select_cascade(M, tv, names, budget, seed)}
    point = EQUAL
    if budget is not None:  # the token-cut point, chosen where it keeps the static valid quality
        with contextlib.suppress(ConfigError):  # no cascade within it: equal cost only
            points[CUT] = select_cascade(M, tv, names, CUT_BUDGET * budget, seed)
        if CUT in points and (points[CUT].valid["quality"]
                              >= prep.M["valid"]["Q"][:, static].mean()):
            point = CUT
    cas = points[point]
    got = outcomes(M["test"], cas.cheap, cas.strong, esc := cas.escalate(Z[cas.cheap]["test"]))
    other = {k: outcomes(M["test"], c.cheap, c.strong, c.escalate(Z[c.cheap]["test"]))
             for k, c in points.items() if k != point}
    log(f"[{dataset} seed {seed}] best static {prep.names[static]}; cascade {cas.names[0]} -> "
        f"{cas.names[1]} at tau {cas.tau:.3f} ({point}), escalates {esc.mean():.2f} of test "
        f"({time.perf_counter() - t0:.0f} s)")
    return {"prep": prep, "static": static, "cascade": cas, "got": got, "escalated": esc,
            "budget": budget, "point": point, "other": other,
            "auc": escalation_auc(cas, M["valid"], Z[cas.cheap]["valid"],
                                  [*prep.feature_names, *signal_names(True)])}


def escalation_auc(cas, M_valid: dict[str, np.ndarray], Z_valid: np.ndarray,
                   names: list[str]) -> dict[str, Any]:
    """On valid: the share of questions whose cheap answer is as good as the strong one
    (Q_cheap >= Q_strong - TIE), the ROC AUC of the cascade's confidence for it, and the
    best single feature's AUC (max(AUC, 1 - AUC)) with its name; AUCs None when valid holds
    one class only."""
    from sklearn.metrics import roc_auc_score

    Q = M_valid["Q"]
    ok = Q[:, cas.cheap] >= Q[:, cas.strong] - TIE
    if ok.all() or not ok.any():
        return {"ok_rate": float(ok.mean()), "confidence": None, "best_feature": None}
    per = [roc_auc_score(ok, Z_valid[:, j]) for j in range(Z_valid.shape[1])]
    j = int(np.argmax([max(a, 1 - a) for a in per]))
    return {"ok_rate": float(ok.mean()),
            "confidence": float(roc_auc_score(ok, cas.confidence(Z_valid))),
            "best_feature": [names[j], float(max(per[j], 1 - per[j]))]}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="world 1 seed + hotpotqa; *.quick.*")
    ap.add_argument("--datasets", default=",".join(REAL),
                    help="real datasets, comma-separated ('' for the world only)")
    a = ap.parse_args()
    seeds = SEEDS[:1] if a.quick else SEEDS
    real = [d for d in a.datasets.split(",") if d][:1 if a.quick else None]
    settings = TunerSettings.defaults()
    rows: list[dict] = []
    detail: dict[str, Any] = {}
    t0 = time.perf_counter()

    def save(done: list[str]) -> None:  # after each dataset: a timed-out run keeps what it did
        meta = make_meta(0, {d: data_root() / d for d in done}, {
            "quick": a.quick, "seeds": list(seeds), "datasets": [WORLD, *done],
            "not_measured": [d for d in REAL if d not in done], "details": detail,
            "wall_s": round(time.perf_counter() - t0, 1)})
        write_results(NAME, rows, meta, TITLE, markdown(meta, rows))

    with tempfile.TemporaryDirectory(prefix="cascade-") as tmp:
        vals = []
        for s in seeds:
            r = run(WORLD, settings, Path(tmp), s, False, print)
            R = r["prep"].M["test"]["R"]
            v, lo, hi = headroom_captured(R, r["got"]["R"], r["static"], seed=s)
            vals.append(v)
            rows.append({"dataset": WORLD, "system": f"{SYSTEM}@seed{s}",
                         "metric": "headroom_captured", "value": v, "ci_low": lo, "ci_high": hi,
                         "n": len(R)})
            detail[f"{WORLD}@seed{s}"] = describe(r)
            print(f"[{WORLD} seed {s}] headroom_captured {v:.3f} [{lo:.3f}, {hi:.3f}]")
        rows.append(plain_row(WORLD, SYSTEM, "headroom_captured", float(np.mean(vals)),
                              len(seeds)))
        rows.append(plain_row(WORLD, SYSTEM, "seeds_meeting_target",
                              sum(v >= HEADROOM_TARGET for v in vals), len(seeds)))
        save([])
        for i, d in enumerate(real):
            r = run(d, settings, Path(tmp), 0, True, print)
            T = r["prep"].M["test"]
            base = {k: T[k][:, r["static"]] for k in ("Q", "T")}
            name, n0 = f"{SYSTEM} - best-static", len(rows)
            rows.append(delta_row(d, name, "delta_quality", base["Q"], r["got"]["Q"]))
            rows.append(ratio_row(d, name, "delta_tokens_pct", r["got"]["T"], base["T"],
                                  cost_pct))
            rows.append(plain_row(d, SYSTEM, "escalation_rate",
                                  float(r["escalated"].mean()), len(base["Q"])))
            for k, o in r["other"].items():  # the operating point not chosen, for reference
                rows.append(delta_row(d, f"{SYSTEM}@{k} - best-static", "delta_quality",
                                      base["Q"], o["Q"]))
                rows.append(ratio_row(d, f"{SYSTEM}@{k} - best-static", "delta_tokens_pct",
                                      o["T"], base["T"], cost_pct))
            if r["auc"]["confidence"] is not None:
                rows.append(plain_row(d, SYSTEM, "escalation_auc", r["auc"]["confidence"],
                                      len(r["prep"].parts["valid"][1])))
            detail[d] = describe(r)
            print(f"[{d}] " + "; ".join(f"{x['metric']} {x['value']:+.4f}" for x in rows[n0:]),
                  flush=True)
            save(real[:i + 1])


def describe(r: dict[str, Any]) -> dict[str, Any]:
    """What a run chose, for the results' meta."""
    cas, p = r["cascade"], r["prep"]
    return {"n": {k: len(i) for k, (_, i) in p.parts.items()}, "best_static": p.names[r["static"]],
            "cheap": cas.names[0], "strong": cas.names[1], "tau": cas.tau, "valid": cas.valid,
            "budget": r["budget"], "test_escalated": float(r["escalated"].mean()),
            "operating_point": r.get("point"), "valid_auc": r.get("auc")}


def verdict(rows: list[dict], d: str) -> tuple[bool, str]:
    """Whether dataset `d` meets the real-data target, and the margins."""
    q, t = (next(x for x in rows if x["dataset"] == d and x["metric"] == m
                 and x["system"] == f"{SYSTEM} - best-static")
            for m in ("delta_quality", "delta_tokens_pct"))
    gain = q["ci_low"] > 0 and t["value"] <= 0
    cut = t["value"] <= TOKENS_TARGET and q["ci_low"] >= NONINFERIOR
    return gain or cut, (f"quality CI low {q['ci_low']:+.4f} (needs > 0); tokens "
                         f"{t['value']:+.1f}% (margin {t['value'] - TOKENS_TARGET:+.1f} pts "
                         f"to {TOKENS_TARGET:.0f}%)")


def markdown(meta: dict[str, Any], rows: list[dict]) -> str:
    det = meta["details"]
    out = [f"Targets fixed before the run: world `headroom_captured` >= {HEADROOM_TARGET:.2f} "
           f"per seed; real data (test split, equal cost = best static's valid tokens) on >= 2 "
           f"of 3: quality CI low > 0 at <= equal cost, or tokens <= {TOKENS_TARGET:.0f}% at "
           f"quality CI low >= {NONINFERIOR}.", "",
           "| dataset | seed | best static | cheap -> strong | tau | test escalated | "
           "headroom_captured [95% CI] | margin |", "|---|---|---|---|---|---|---|---|"]
    for x in rows:
        if x["metric"] == "headroom_captured" and "@" in x["system"]:
            seed = x["system"].split("@seed")[1]
            d = det[f"{x['dataset']}@seed{seed}"]
            out.append(f"| {x['dataset']} | {seed} | `{d['best_static']}` | `{d['cheap']}` -> "
                       f"`{d['strong']}` | {d['tau']:.3f} | {d['test_escalated']:.2f} | "
                       f"{x['value']:.3f} [{x['ci_low']:.3f}, {x['ci_high']:.3f}] | "
                       f"{x['value'] - HEADROOM_TARGET:+.3f} |")
    k = next(x for x in rows if x["metric"] == "seeds_meeting_target")
    out += ["", f"{int(k['value'])} of {k['n']} seeds reach the world target.", "",
            "| dataset | best static | cheap -> strong | operating point | tau | test escalated | "
            "delta_quality [95% CI] | delta_tokens_pct [95% CI] | target | valid: cheap as good | "
            "escalation_auc | best single feature (AUC) |",
            "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    met = 0
    for d in meta["datasets"][1:]:
        q, t = (next(x for x in rows if x["dataset"] == d and x["metric"] == m
                     and x["system"] == f"{SYSTEM} - best-static")
                for m in ("delta_quality", "delta_tokens_pct"))
        ok, why = verdict(rows, d)
        met += ok
        e = det[d]
        auc = e["valid_auc"]
        best = (f"`{auc['best_feature'][0]}` ({auc['best_feature'][1]:.3f})"
                if auc["best_feature"] else "-")
        out.append(f"| {d} | `{e['best_static']}` | `{e['cheap']}` -> `{e['strong']}` | "
                   f"{e['operating_point']} | {e['tau']:.3f} | {e['test_escalated']:.2f} | "
                   f"{q['value']:+.4f} [{q['ci_low']:+.4f}, {q['ci_high']:+.4f}] | "
                   f"{t['value']:+.1f}% [{t['ci_low']:+.1f}, {t['ci_high']:+.1f}] | "
                   f"{'met' if ok else 'missed: ' + why} | {auc['ok_rate']:.2f} | "
                   f"{'-' if auc['confidence'] is None else format(auc['confidence'], '.3f')} | "
                   f"{best} |")
    ref = [x for x in rows if "@" in x["system"] and x["metric"].startswith("delta_")]
    if ref:
        out += ["", "The operating point not chosen on valid, for reference (the verdict is the "
                    "chosen one's):", ""]
        out += [f"- {x['dataset']} `{x['system']}` {x['metric']} {x['value']:+.4f} "
                f"[{x['ci_low']:+.4f}, {x['ci_high']:+.4f}]" for x in ref]
    out += ["", f"Real-data target met on {met} of {len(meta['datasets']) - 1} datasets "
                f"measured (needs 2 of 3); not measured: {', '.join(meta['not_measured']) or 'none'}."]
    return "\n".join(out) + "\n"


if __name__ == "__main__":
    main()
