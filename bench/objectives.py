"""Objectives as a user states them: what the tuner's operating point gains over the static
default on the test split, per objective, and how much of the best-known Pareto front a run's
own front covers.

Per dataset (synthetic, hotpotqa, scifact, mtrag): one local-asha search (the default searcher,
warm-started from the static default) under `--budget-x` full valid splits of
query-evaluations; its full-fidelity evaluations make the run's Pareto front (quality vs tokens
vs p95 on valid, `rl.tuner.pareto.build`). From that front each objective picks its operating
point by one-sided 95% bounds of paired differences with the default on valid
(`rl.kernel.objective.choose`): `min_cost` (cheapest config non-inferior in quality, margin
0.01) and `max_quality` (highest lower bound of Δ quality within the default's tokens and p95).
The pick is then compared with the default on the test split (paired bootstrap, 10k):

    min_cost     delta_quality (target: CI low >= -0.01 on all four datasets),
                 delta_tokens_pct (target: <= -20% on >= 2 of the 3 real datasets)
    max_quality  delta_quality (target: CI low > 0 on >= 1 real dataset), delta_tokens_pct
    local-asha   pareto_points (the run's front on valid), hypervolume_ratio (the run's front
                 vs the best-known front: the front of the union of every full-fidelity
                 evaluation made in this benchmark run for the dataset, i.e. the search's and
                 `--extra` uniformly drawn configs evaluated on the whole valid split)

quality = (αF + βR)/(α + β) per query with the dataset's F and R (configs/rl/tuner.yaml).

Context compression (`RAGConfig.context_budget`, pinned off in the default space) is opened as a
head with values `BUDGETS` only on the datasets whose F and R read the text handed to the
generator (`SEES_COMPRESSION`: support and answer F1). SciFact's recall@k / nDCG@10 and MTRAG's
recall@k are doc-level and its extractive support holds by construction, so a sentence the
compressor drops is invisible there: those searches keep whole passages, and a min_cost gain
on them comes from the other heads only.
Latency is priced by the library's cost model measured on this machine (`bench.common.evaluator`).
Budget 8 valid splits, 12 extra configs, seed 0 (`--quick`: synthetic, 4 and 4). A finished
dataset's part is kept under runs/objectives-parts/ and reused by the next full run with the same
budget and the same code (`part_key`), so a stopped run resumes.

    python bench/objectives.py            # ~20 min on 2 cores; writes bench/results/objectives.*
    python bench/objectives.py --quick    # synthetic only, small budget: objectives.quick.*
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.common import evaluator, make_meta, write_results  # noqa: E402
from rag.corpus.loaders import data_root  # noqa: E402
from rl.kernel.objective import COST, P95, QUALITY, columns, paired_deltas  # noqa: E402
from rl.kernel.settings import TunerSettings  # noqa: E402
from rl.kernel.space import ConfigSpace  # noqa: E402
from rl.tuner.pareto import build, hypervolume, nondominated  # noqa: E402

NAME = "objectives"
DATASETS = ("synthetic", "hotpotqa", "scifact", "mtrag")
REAL = ("hotpotqa", "scifact", "mtrag")
CONVERSATIONAL = ("mtrag",)
SEES_COMPRESSION = ("synthetic", "hotpotqa")
"""Datasets whose F and R (support, answer f1) can see what context compression drops."""
BUDGETS = (None, 24, 48)
"""`context_budget` values (tokens per passage) searched where compression is visible."""
KINDS = ("min_cost", "max_quality")
SEARCHER = "local-asha"
TARGETS = {"min_cost.delta_quality": "CI low >= -0.01 on all four datasets",
           "min_cost.delta_tokens_pct": "<= -20% on >= 2 of the 3 real datasets",
           "max_quality.delta_quality": "CI low > 0 on >= 1 real dataset"}


def _row(ds, system, metric, value, lo=None, hi=None, n=0) -> dict[str, Any]:
    def f(x):
        return None if x is None or not math.isfinite(x) else float(x)

    return {"dataset": ds, "system": system, "metric": metric, "value": f(value),
            "ci_low": f(lo), "ci_high": f(hi), "n": int(n)}


def reference_point(pts: np.ndarray) -> np.ndarray:
    """The hypervolume reference: the union's nadir (lowest quality, most tokens, highest
    p95) moved out by 10% of each axis's range (1e-6 when a range is 0)."""
    lo, hi = pts.min(axis=0), pts.max(axis=0)
    span = np.maximum(hi - lo, 1e-6)
    return np.array([lo[0] - 0.1 * span[0], hi[1] + 0.1 * span[1], hi[2] + 0.1 * span[2]])


def run_dataset(name: str, budget_x: float, n_extra: int, seed: int, log) -> dict[str, Any]:
    from rl.tuner.ask_tell import run_search
    from rl.tuner.plan import SearchPlan

    t0 = time.perf_counter()
    settings = TunerSettings.defaults()
    if name in SEES_COMPRESSION:
        settings = settings.model_copy(update={"discrete": settings.discrete.model_copy(
            update={"context_budget": BUDGETS})})
    ev, cm = evaluator(name, settings)
    space = ConfigSpace(settings, conversational=name in CONVERSATIONAL)
    valid, test = ev.slice.tune_split, ev.slice.holdout_split
    n_valid = len(ev.data.examples(valid))
    default = settings.base_config()
    ev.evaluate(default, valid)
    ev.evaluate(default, test)
    budget = int(round(budget_x * n_valid))
    log(f"[{name}] default evaluated ({time.perf_counter() - t0:.0f} s); {SEARCHER} search, "
        f"{budget} query-evaluations on {valid} (n = {n_valid})")
    res = run_search(ev, space, SearchPlan(SEARCHER, budget, seed, start=default))
    log(f"[{name}] search done ({time.perf_counter() - t0:.0f} s): "
        f"{ev.counters['queries_computed']} rows computed so far")
    picks, out = {}, {"dataset": name, "n_valid": n_valid, "n_test": len(ev.data.examples(test)),
                      "budget": budget, "cost_model": cm}
    for kind in KINDS:
        s = settings.model_copy(update={"objective": settings.objective.model_copy(
            update={"kind": kind})})
        p = build(ev, s, search_best=res.best_config, split=valid, seed=seed)
        picks[kind] = p
        log(f"[{name}] {kind}: {p.choice.key} ({'better' if p.choice.better else 'default'}: "
            f"{p.choice.reason}); front {len(p.front)} of {len(p.points)} full-fidelity points")
    front = picks["min_cost"]
    run_pts = {k: front.points[k] for k in front.front}
    rng = np.random.default_rng(seed + 1000)
    extra = [space.sample(rng) for _ in range(n_extra)]
    for i, cfg in enumerate(extra):
        ev.evaluate(cfg, valid)
        if (i + 1) % 5 == 0 or i + 1 == len(extra):
            log(f"[{name}] extra configs evaluated on the whole {valid} split: {i + 1}/"
                f"{len(extra)} ({time.perf_counter() - t0:.0f} s)")
    union = build(ev, settings, split=valid, seed=seed)  # every full-fidelity evaluation
    u = np.array(list(union.points.values()))
    best_known = u[nondominated(u)]
    ref = reference_point(u)
    hv_run = hypervolume(np.array(list(run_pts.values())), ref)
    hv_best = hypervolume(best_known, ref)
    rows = [_row(name, SEARCHER, "pareto_points", len(run_pts), n=len(front.points)),
            _row(name, SEARCHER, "hypervolume_ratio", hv_run / hv_best if hv_best else math.nan,
                 n=len(union.points))]
    details = {}
    for kind, p in picks.items():
        d = paired_deltas(columns(ev, ev.table(p.chosen, test)),
                          columns(ev, ev.table(default, test)), 10_000, seed, 0.95)
        q, tok, lat = d[QUALITY], d[COST], d[P95]
        b = tok.baseline
        rows += [_row(name, kind, "delta_quality", q.diff, q.ci_low, q.ci_high, q.n),
                 _row(name, kind, "delta_tokens_pct", 100 * tok.diff / b,
                      100 * tok.ci_low / b, 100 * tok.ci_high / b, tok.n),
                 _row(name, kind, "delta_p95_ms", lat.diff, lat.ci_low, lat.ci_high, lat.n)]
        details[kind] = {"chosen": p.choice.key, "better": p.choice.better,
                         "reason": p.choice.reason,
                         "config": p.chosen.model_dump(mode="json"),
                         "valid": {m: x.as_dict() for m, x in
                                   p.choice.deltas.get(p.choice.key, {}).items()},
                         "test": {m: x.as_dict() for m, x in d.items()}}
        log(f"[{name}] {kind} on {test}: Δ quality {q.diff:+.4f} [{q.ci_low:+.4f}, "
            f"{q.ci_high:+.4f}], tokens {100 * tok.diff / b:+.1f}%, p95 {lat.diff:+.1f} ms")
    out.update(rows=rows, picks=details, front=list(run_pts), n_full_fidelity=len(front.points),
               n_union=len(union.points), best_known_front=len(best_known),
               reference_point=ref.tolist(), hv_run=hv_run, hv_best_known=hv_best,
               search_query_evals=res.query_evals, wall_s=time.perf_counter() - t0)
    log(f"[{name}] front {len(run_pts)} points, hypervolume ratio "
        f"{rows[1]['value']:.3f} vs the best-known front ({len(best_known)} of "
        f"{len(union.points)}); {out['wall_s']:.0f} s")
    return out


def part_key() -> str:
    """A version of what a dataset's part depends on: the code that computes rows
    (`rows_version`), the search and the choice (`rl.tuner.ask_tell`, `rl.tuner.pareto` and
    what they import) and this file; a part made by other code is not reused."""
    from rl.common.fingerprint import code_fingerprint
    from rl.kernel.evaluator import ROWS_STOP, rows_version

    return code_fingerprint(("rl.tuner.ask_tell", "rl.tuner.pareto"), ROWS_STOP,
                            [rows_version(), Path(__file__).read_text(encoding="utf-8")])


def verdicts(rows: list[dict]) -> list[str]:
    """Each target against the rows, met or missed with its margin."""
    get = {(r["dataset"], r["system"], r["metric"]): r for r in rows}
    out = []
    ds = sorted({r["dataset"] for r in rows}, key=DATASETS.index)
    real = [d for d in ds if d in REAL]
    lows = {d: get[(d, "min_cost", "delta_quality")]["ci_low"] for d in ds}
    worst = min(lows, key=lambda d: lows[d])
    out.append(f"- min_cost delta_quality CI low ≥ −0.01 on all of {', '.join(ds)}: "
               + ("met" if all(v >= -0.01 for v in lows.values()) else "MISSED")
               + f" (lowest {lows[worst]:+.4f} on {worst}, margin {lows[worst] + 0.01:+.4f})")
    pct = {d: get[(d, "min_cost", "delta_tokens_pct")]["value"] for d in real}
    hit = [d for d in real if pct[d] <= -20]
    second = sorted(pct.values())[1] if len(pct) >= 2 else math.nan
    out.append("- min_cost delta_tokens_pct ≤ −20% on ≥ 2 of the real datasets: "
               + ("met" if len(hit) >= 2 else "MISSED") + f" ({len(hit)} of {len(real)}: "
               + ", ".join(f"{d} {pct[d]:+.1f}%" for d in real)
               + f"; second best {second:+.1f}%, margin {-20 - second:+.1f} points)")
    mq = {d: get[(d, "max_quality", "delta_quality")]["ci_low"] for d in real}
    best = max(mq, key=lambda d: mq[d]) if mq else None
    out.append("- max_quality delta_quality CI low > 0 on ≥ 1 real dataset: "
               + ("met" if any(v > 0 for v in mq.values()) else "MISSED")
               + (f" (highest CI low {mq[best]:+.4f} on {best}, margin {mq[best]:+.4f})"
                  if best else ""))
    return out


def markdown(parts: list[dict], rows: list[dict], args) -> str:
    lines = [
        "Per dataset: one local-asha search warm-started from the static default, "
        f"{args.budget_x:g} valid splits of query-evaluations (seed {args.seed}); its "
        "full-fidelity evaluations make the run's Pareto front on valid; each objective picks "
        "from it by one-sided 95% bounds of paired differences with the default on valid; the "
        "pick vs the default on **test** (paired bootstrap, 10k resamples, 95% CI). quality = "
        "(αF + βR)/(α + β) with the dataset's F and R. Targets were fixed before the run.", "",
        "**Best-known front**: the front of the union of every full-fidelity evaluation made in "
        f"this run for the dataset: the search's, plus {args.extra} configs drawn uniformly "
        "from the space and evaluated on the whole valid split. hypervolume_ratio = hypervolume "
        "of the run's front / hypervolume of the best-known front in (quality ↑, tokens ↓, "
        "p95 ↓), reference point = the union's nadir moved out by 10% of each axis's range.",
        "", "**Context compression** (`context_budget`, tokens kept per passage: "
        f"{', '.join('off' if b is None else str(b) for b in BUDGETS)}) is searched only on "
        f"{', '.join(SEES_COMPRESSION)}, whose F and R (support, answer F1) read the text "
        "handed to the generator. SciFact (recall@k, nDCG@10) and MTRAG (support of an "
        "extractive answer, recall@k) cannot see a dropped sentence, so their searches keep "
        "whole passages: a gain there comes from the other heads.",
        "", "## Targets", "", *verdicts(rows), "",
        "| dataset | system | metric | value | 95% CI | n |", "|---|---|---|---|---|---|"]
    for r in rows:
        ci = "" if r["ci_low"] is None else f"[{r['ci_low']:+.4f}, {r['ci_high']:+.4f}]"
        v = r["value"]
        lines.append(f"| {r['dataset']} | {r['system']} | {r['metric']} | "
                     f"{'—' if v is None else f'{v:+.4f}' if 'delta' in r['metric'] else f'{v:.4g}'}"
                     f" | {ci} | {r['n']} |")
    lines += ["", "## Picks", "", "| dataset | objective | config | chosen because |",
              "|---|---|---|---|"]
    for p in parts:
        for kind, d in p["picks"].items():
            c = d["config"]
            desc = (f"`{d['chosen']}` {c['variant']} k={c['k']} rerank={c['rerank']} "
                    f"context_budget={c.get('context_budget')}" if d["better"] else "the default")
            lines.append(f"| {p['dataset']} | {kind} | {desc} | {d['reason']} |")
    lines += ["", "| dataset | valid n | test n | budget (query-evals) | full-fidelity configs "
              "(search) | union | best-known front | wall s |", "|---|---|---|---|---|---|---|---|"]
    lines += [f"| {p['dataset']} | {p['n_valid']} | {p['n_test']} | {p['budget']} | "
              f"{p['n_full_fidelity']} | {p['n_union']} | {p['best_known_front']} | "
              f"{p['wall_s']:.0f} |" for p in parts]
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true", help="synthetic only, small budget")
    ap.add_argument("--datasets", default=",".join(DATASETS))
    args = ap.parse_args()
    args.budget_x, args.extra, args.seed = (4.0, 4, 0) if args.quick else (8.0, 12, 0)
    if args.quick:
        args.datasets = "synthetic"
    datasets = args.datasets.split(",")
    log = lambda m: print(m, flush=True)  # noqa: E731
    parts_dir = Path("runs/objectives-parts")
    parts = []
    for d in datasets:
        # a dataset's finished part is kept, so a stopped run resumes and datasets can run in
        # parallel processes (each its own --datasets) before one call assembles them all
        f = parts_dir / f"{d}-b{args.budget_x:g}-e{args.extra}-s{args.seed}-{part_key()}.json"
        if f.exists() and not args.quick:
            log(f"[{d}] reusing {f}")
            parts.append(json.loads(f.read_text()))
            continue
        parts.append(run_dataset(d, args.budget_x, args.extra, args.seed, log))
        if not args.quick:
            parts_dir.mkdir(parents=True, exist_ok=True)
            f.write_text(json.dumps(parts[-1], default=str))
    rows = [r for p in parts for r in p["rows"]]
    for r in rows:  # a ratio of volumes: three decimals say all it can
        if r["metric"] == "hypervolume_ratio" and r["value"] is not None:
            r["value"] = round(r["value"], 3)
    meta = make_meta(args.seed, {d: data_root() / d for d in datasets if d != "synthetic"},
                     {"quick": args.quick, "searcher": SEARCHER, "budget_x": args.budget_x,
                      "extra": args.extra, "targets": TARGETS,
                      "context_budget": {"values": BUDGETS, "datasets": SEES_COMPRESSION},
                      "details": {p["dataset"]: {k: v for k, v in p.items() if k != "rows"}
                                  for p in parts}})
    write_results(NAME, rows, meta, "Objectives: the operating point vs the static default",
                  markdown(parts, rows, args))


if __name__ == "__main__":
    main()
