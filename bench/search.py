"""Search benchmark (issue 18): which searcher finds a good static config for the fewest
query-evaluations, on the full config space (>= 10^6 configs), HotpotQA, SciFact and MTRAG.

    python bench/search.py                 # 3 datasets x 6 searchers x 5 seeds, one process
    python bench/search.py --jobs 3        # the same, one process per dataset
    python bench/search.py --quick         # < 2 min: synthetic, 2 seeds, small budget
    python bench/search.py --jobs 3 --searchers tpe-asha,tpe --seeds 20 --budget-x 24 \
        --parts-dir runs/search-b --cost-models-from OLD.json --best-known-from OLD.json
                                           # the committed run's parts (OLD.json: an earlier
                                           # search.json; each part grows seed by seed)
    python bench/search.py --from-parts runs/search-b[,runs/search-c] --searchers tpe-asha,tpe
                                           # assemble search.json/.md from parts (merged per
                                           # dataset: searchers and seed ranges run apart)

Searchers (each seed is an independent search with budget = --budget-x full valid splits of
query-evaluations; the one search protocol, `rl.tuner.ask_tell.run_search`, drives the
searchers and ASHA of `rl.tuner.searchers` in this process):
  random          uniform configs, each on the full valid split
  tpe             Optuna TPE (Ray Tune's OptunaSearch) with the gates as constraints, full split
  tpe-asha        the same + ASHA over rungs 25 -> 75 -> full (trials stopped early are told
                  to TPE as pruned)
  local-asha      local search from the start point (`rl.tuner.searchers.LocalSearch`) + the
                  same ASHA: the project's default searcher
  hyperopt        HyperOpt TPE (Ray Tune's HyperOptSearch), full split
  ppo             the RLlib PPO tuner as a static searcher: 25-query batches per step, its
                  recommendation scored on the full split at the end (charged)
Warm start (the product's: `ragpilot tune` evaluates the static default as its first trial
unless `--cold-start`): every searcher's first evaluation is the static default on the full
valid split, charged like any trial; PPO (which has no start point) is charged the same
evaluation first and keeps the default when its pick scores lower. `--cold-start` drops it
for every searcher.
Per dataset: best-known = the best full-valid reward any trial of any searcher reached (with its
provenance; `--best-known-from` adds an earlier run's best-known, re-evaluated here, and a
secondary ratio against 99% of it, a target fixed before the run); the static default's
reward; per searcher and seed: best full-fidelity reward found, query-evaluations and
seconds (the cost model's pipeline time of the queries evaluated) to reach 99% of
best-known, gap closed ((found - default) / (best-known - default)) and regret (best-known -
found), with bootstrap CIs over seeds; the final incumbent on the test split vs the default,
quality (alpha F + beta R) and cost (tokens, p95) apart.
Acceptance row: {"system": <the default searcher, local-asha>, "metric":
"evals_to_99pct_ratio_vs_tpe"} = median query-evaluations to 99% of best-known of the default
searcher / of tpe (<= 1/3 is the target; every other searcher gets the same row); a seed that
never reaches it within its budget counts as the budget (censored). `bench/search_stats.py` says
when a median with censored seeds is exact and when the ratio is only a bound; the row carries
`bound` (measured | upper | lower | undetermined), `verdict` (met | missed | undetermined) and
how many seeds of each searcher reached the target.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.common import (  # noqa: E402
    CONVERSATIONAL,
    RESULTS,
    bootstrap_ci,
    make_meta,
    plain_row,
    write_results,
)
from bench.search_stats import (  # noqa: E402
    TARGET_RATIO,
    censored_median,
    median_ratio,
    merge_parts,
    ratio_ci,
    reach,
)
from rag.config import RAGConfig  # noqa: E402
from rag.corpus.loaders import data_root  # noqa: E402
from rag.errors import ConfigError  # noqa: E402
from rl.common.data import TuningData  # noqa: E402
from rl.kernel.evaluator import TunerEvaluator  # noqa: E402
from rl.kernel.settings import TunerSettings  # noqa: E402
from rl.kernel.space import ConfigSpace  # noqa: E402
from rl.tuner.ask_tell import DEFAULT_SEARCHER, RUNG_KEYS, run_search  # noqa: E402

NAME = "search"
SEARCHERS = ("random", "tpe", "tpe-asha", "local-asha", "hyperopt", "ppo")
"""What the full run compares."""
DATASETS = ("hotpotqa", "scifact", "mtrag")
PPO_BATCH = 25


def _ppo(ev, settings, budget: int, seed: int, start=None) -> dict[str, Any]:
    """PPO as a static searcher under a query-evaluation budget: trains on 25-query batches
    while the budget holds one more iteration and the full-split scoring of its pick.
    `start` (warm start): the static default is evaluated first on the full split (charged)
    and stays the recommendation when the pick scores lower on it."""
    from rl.tuner.ppo import PPOTuner

    split = ev.slice.tune_split
    n_total = len(ev.data.examples(split))
    s = settings.with_overrides(episode={"length": settings.episode.length,
                                         "batch_size": PPO_BATCH})
    curve, trials, spent, seconds = [], [], 0, 0.0
    best: tuple[float, Any] | None = None

    def score(cfg) -> None:
        nonlocal spent, seconds, best
        full = float(ev.evaluate(cfg, split).reward)
        spent += n_total
        seconds += float(np.nansum(ev.table(cfg, split)["latency_ms"])) / 1000.0
        trials.append({"config_hash": cfg.config_hash, "config": cfg.model_dump(mode="json"),
                       "rungs": [{"n": n_total, "reward": full, "full": True}]})
        if best is None or full > best[0]:
            best = (full, cfg)
        curve.append({"query_evals": spent, "seconds": None, "best_full": best[0]})

    if start is not None:
        score(start)
    tuner = PPOTuner(ev, s, seed=seed)
    step = s.ppo.train_batch_size * PPO_BATCH
    reserve = s.episode.length * PPO_BATCH + n_total  # read-out + scoring the pick
    room = budget - spent
    if step + reserve > room:
        raise ConfigError("budget", f"{budget} query-evaluations hold no PPO iteration "
                                    f"({step} + {reserve} for the read-out and scoring the pick"
                                    f"{f' + {spent} for the warm start' if spent else ''})")
    try:
        res = tuner._run(lambda it, hist: (len(hist) * PPO_BATCH + step + reserve) <= room)
    finally:
        tuner.stop()
    spent += res.evaluations * PPO_BATCH
    # the batches' pipeline seconds are not kept per step: priced as the pick's mean row
    pick = res.best_config
    score(pick)
    lat = ev.table(pick, split)["latency_ms"]
    seconds += float(np.nansum(lat)) / n_total * res.evaluations * PPO_BATCH
    return {"best_config": best[1], "best_reward": best[0], "query_evals": spent,
            "curve": curve, "trials": trials, "seconds": seconds}


def _summary(rep) -> dict[str, float]:
    """What the results keep of an EvalReport: reward, F, R, tokens, p95."""
    return {k: float(getattr(rep, k)) for k in
            ("reward", "faithfulness", "relevancy", "cost", "p95_latency_ms")}


def pinned_cost_model(ev, space, out: Path, n_samples: int = 4000) -> Path:
    """Measure every cost-model component the space's configs can need (the ones still missing
    from the shared model: `CostModel` measures on first use) and copy the model to `out`, which
    the dataset's processes then price with: parts run apart (searchers or seed ranges in
    separate processes) must price alike, and a component two processes measured at the same
    moment would not be."""
    from rl.kernel.cost_model import CostModel

    rng = np.random.default_rng(0)
    names: set[str] = set()
    for _ in range(n_samples):
        c = space.sample(rng)
        names.update(CostModel.retrieval_names(c))
        names.add(CostModel.generate_name(c))
        if (rr := CostModel.rerank_name(c)) is not None:
            names.add(rr)
        if c.mmr_lambda is not None and c.mmr_lambda < 1.0:
            names.add(f"mmr:dense-{c.dense_index}")
    for name in sorted(names):
        ev.cost_model.component(name)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(ev.cost_model.to_dict(), indent=1, sort_keys=True))
    return out


def best_known_of(runs: dict[str, list[dict[str, Any]]], earlier: dict[str, Any] | None = None
                  ) -> dict[str, Any]:
    """The best full-fidelity reward of every trial of every run, with its provenance; `earlier`
    (an earlier run's best-known, re-evaluated here) counts when it is higher."""
    best: tuple[float, dict[str, Any] | None] = (-np.inf, None)
    if earlier is not None:
        best = (earlier["reward"], {k: v for k, v in earlier.items() if k != "reward"})
    for method, rs in runs.items():
        for r in rs:
            for t in r["trials"]:
                for g in t["rungs"]:
                    if g.get("full") and g["reward"] > best[0]:
                        best = (g["reward"], {"method": method, "seed": r["seed"],
                                              "config_hash": t["config_hash"],
                                              "config": t["config"]})
    return {"reward": best[0], **(best[1] or {})}


def run_dataset(name: str, settings: TunerSettings, seeds: list[int], budget_x: float,
                searchers: tuple[str, ...], log, warm_start: bool = True,
                cost_model: Path | None = None, save=None, best_known_from: str | None = None
                ) -> dict[str, Any]:
    """Every searcher on `name`, seed by seed (seed-major: a run stopped early keeps whole
    seeds of every searcher); `save(part)` after each seed (a part file grows as it runs)."""
    t0 = time.perf_counter()
    ev = TunerEvaluator(TuningData.open(name), settings, cost_model=cost_model)
    space = ConfigSpace(settings, conversational=name in CONVERSATIONAL)
    split, hold = ev.slice.tune_split, ev.slice.holdout_split
    n_total = len(ev.data.examples(split))
    budget = int(round(budget_x * n_total))
    default = settings.base_config()
    start = default if warm_start else None
    d_valid, d_test = ev.evaluate(default, split), ev.evaluate(default, hold)
    runs: dict[str, list[dict[str, Any]]] = {m: [] for m in searchers}
    earlier = None
    if best_known_from is not None:  # an earlier run's best-known, re-evaluated under this run
        saved = json.loads(Path(best_known_from).read_text())["meta"]["details"][name]
        cfg = RAGConfig.from_dict(saved["best_known"]["config"])
        earlier = {"reward": float(ev.evaluate(cfg, split).reward), "method": "earlier-run",
                   "seed": None, "config_hash": cfg.config_hash,
                   "config": cfg.model_dump(mode="json"),
                   "source": f"{best_known_from}: {saved['best_known'].get('method')} seed "
                             f"{saved['best_known'].get('seed')}, reward there "
                             f"{saved['best_known']['reward']:.6f}"}
        log(f"[{name}] earlier best-known {cfg.config_hash}: {earlier['reward']:.6f} here "
            f"({earlier['source']})")

    def part() -> dict[str, Any]:
        return {"dataset": name, "n_valid": n_total, "n_test": len(ev.data.examples(hold)),
                "budget": budget, "space_size": space.size(),
                "seeds": sorted({r["seed"] for rs in runs.values() for r in rs}),
                "default": {"valid": _summary(d_valid), "test": _summary(d_test),
                            "config_hash": default.config_hash},
                "best_known": best_known_of(runs, earlier), "earlier_best": earlier,
                "weights": {"alpha": settings.reward_weights.alpha,
                            "beta": settings.reward_weights.beta},
                "runs": runs, "cost_model": ev.cost_model.to_dict(), "warm_start": warm_start,
                "gate_rule": "expected" if settings.gate_expected else "point",
                "wall_s": time.perf_counter() - t0}

    for seed in seeds:
        for method in searchers:
            t1, rows0 = time.perf_counter(), ev.counters["queries_computed"]
            if method == "ppo":
                r = _ppo(ev, settings, budget, seed, start)
            else:
                res = run_search(ev, space, method, budget, seed, split, start=start)
                r = {"best_config": res.best_config, "best_reward": res.best_reward,
                     "query_evals": res.query_evals, "seconds": res.seconds, "curve": res.curve,
                     "trials": [{"config_hash": t.config.config_hash,
                                 "config": t.config.model_dump(mode="json"),
                                 "rungs": [{k: g[k] for k in (*RUNG_KEYS, "n", "full")}
                                           for g in t.rungs]} for t in res.trials]}
            cfg = r.pop("best_config")  # each pick vs the default on the test split
            r["test"] = _summary(ev.evaluate(cfg, hold))
            r["best_config_hash"] = cfg.config_hash
            r.update(wall_s=time.perf_counter() - t1, seed=seed, budget=budget,
                     rows_computed=ev.counters["queries_computed"] - rows0)
            runs[method].append(r)
            log(f"[{name}] {method} seed {seed}: best {r['best_reward']:.4f} after "
                f"{r['query_evals']} query-evals ({r['wall_s']:.0f} s wall, "
                f"{r['rows_computed']} rows computed)")
        if save is not None:
            save(part())
    return part()


# ---- rows ---------------------------------------------------------------------------------------
def _row(ds, system, metric, values, note=None):
    x = np.asarray([v for v in values if v is not None and np.isfinite(v)], dtype=np.float64)
    lo, hi = bootstrap_ci(x) if x.size else (float("nan"), float("nan"))
    row = {"dataset": ds, "system": system, "metric": metric,
           "value": float(np.mean(x)) if x.size else float("nan"), "ci_low": lo, "ci_high": hi,
           "n": int(x.size)}
    if note:
        row["note"] = note
    return row


def _median_ci(values, seed: int = 0) -> tuple[float, float, float]:
    from rl.stats.bootstrap import bootstrap_statistic

    x = np.asarray(values, dtype=np.float64)
    if x.size < 2:
        return float(np.median(x)), float(np.median(x)), float(np.median(x))
    meds = bootstrap_statistic(lambda idx: np.median(x[idx], axis=1), x.size, 10_000, seed)
    return float(np.median(x)), float(np.percentile(meds, 2.5)), float(np.percentile(meds, 97.5))


def target_of(best_known: float) -> float:
    """99% of best-known (for a negative best-known: 1% of its size below it)."""
    return 0.99 * best_known if best_known > 0 else best_known - 0.01 * abs(best_known)


def rows_for(part: dict[str, Any]) -> tuple[list[dict], dict[str, Any]]:
    ds, runs = part["dataset"], part["runs"]
    bk, d = part["best_known"]["reward"], part["default"]["valid"]["reward"]
    target = target_of(bk)
    rows = [plain_row(ds, "best-known", "reward", bk, 1),
            plain_row(ds, "static-default", "reward", d, 1),
            plain_row(ds, "space", "configs", part["space_size"], 1)]
    summary: dict[str, Any] = {}
    w = part["weights"]
    qual = lambda t: w["alpha"] * t["faithfulness"] + w["beta"] * t["relevancy"]  # noqa: E731
    dt = part["default"]["test"]
    for method, rs in runs.items():
        budgets = [float(r.get("budget", part["budget"])) for r in rs]
        evals = [reach(r["curve"], target, b) for r, b in zip(rs, budgets, strict=True)]
        cm = censored_median(evals, budgets)
        counted = [e if e is not None else b for e, b in zip(evals, budgets, strict=True)]
        _, lo, hi = _median_ci(counted)
        budget_txt = "/".join(str(int(b)) for b in sorted(set(budgets)))
        rows.append({"dataset": ds, "system": method, "metric": "evals_to_99pct",
                     "value": cm["median"], "ci_low": lo, "ci_high": hi, "n": cm["n"],
                     "reached": cm["reached"], "censored": cm["censored"],
                     "median_exact": cm["exact"], "budget": budget_txt,
                     "note": f"median over seeds; {cm['reached']} of {cm['n']} seeds reached 99% "
                             f"of best-known within the budget ({budget_txt}); the others count "
                             f"as the budget, so the median is "
                             f"{'exact' if cm['exact'] else 'a lower bound'}"})
        secs = [reach(r["curve"], target, b, "seconds") for r, b in zip(rs, budgets, strict=True)]
        if method != "ppo" and any(v is not None for v in secs):
            sm = censored_median(secs, [float(r["seconds"]) for r in rs])
            rows.append({"dataset": ds, "system": method, "metric": "seconds_to_99pct",
                         "value": sm["median"], "ci_low": None, "ci_high": None, "n": sm["n"],
                         "reached": sm["reached"], "median_exact": sm["exact"],
                         "note": "median over seeds, cost-model pipeline seconds; a seed that "
                                 "never reached it counts as the seconds its search spent"})
        found = [r["best_reward"] for r in rs]
        rows.append(_row(ds, method, "best_found_reward", found))
        if bk > d:
            rows.append(_row(ds, method, "gap_closed", [(f - d) / (bk - d) for f in found
                                                          if f is not None]))
        rows.append(_row(ds, method, "regret", [bk - f for f in found if f is not None]))
        rows.append(_row(ds, method, "holdout_delta_reward",
                         [r["test"]["reward"] - dt["reward"] for r in rs]))
        rows.append(_row(ds, method, "holdout_delta_quality",
                         [qual(r["test"]) - qual(dt) for r in rs]))
        rows.append(_row(ds, method, "holdout_delta_tokens",
                         [r["test"]["cost"] - dt["cost"] for r in rs]))
        rows.append(_row(ds, method, "holdout_delta_p95_ms",
                         [r["test"]["p95_latency_ms"] - dt["p95_latency_ms"] for r in rs]))
        # what a search cost here (for sizing a run; depends on the machine's load and on which
        # rows earlier searches had already computed)
        rows.append(_row(ds, method, "wall_s_per_search", [r.get("wall_s") for r in rs],
                         "wall seconds per search on this machine, nice 10, shared cores"))
        if all("rows_computed" in r for r in rs):
            rows.append(_row(ds, method, "rows_computed_per_search",
                             [r["rows_computed"] for r in rs],
                             "rows not in the cache when the search asked (incl. its pick on "
                             "the test split)"))
        summary[method] = {**cm, "counted": counted, "seeds": [r["seed"] for r in rs]}
    for i, m in enumerate([m for m in summary if m != "tpe"] if "tpe" in summary else []):
        rows.append(ratio_row(ds, m, summary[m], summary["tpe"]))
        if part.get("earlier_best"):
            rows += fixed_target_rows(part, m, with_tpe=i == 0)
    return rows, summary


def ratio_row(ds: str, m: str, a: dict[str, Any], b: dict[str, Any]) -> dict[str, Any]:
    """Searcher `m`'s median query-evaluations to 99% of best-known over plain TPE's (`a`, `b`:
    `censored_median` of each plus the counted evals and seeds). The acceptance row is the
    default searcher's."""
    ratio = median_ratio(a, b)
    lo, hi = ratio_ci(a["counted"], b["counted"], paired=a["seeds"] == b["seeds"])
    return {"dataset": ds, "system": m,
            "metric": "evals_to_99pct_ratio_vs_tpe", "value": ratio["value"],
            "ci_low": lo, "ci_high": hi, "n": min(a["n"], b["n"]),
            "bound": ratio["bound"], "verdict": ratio["verdict"],
            "target": TARGET_RATIO, "margin": ratio["margin"],
            "reached": {m: a["reached"], "tpe": b["reached"]},
            "seeds": {m: a["n"], "tpe": b["n"]},
            "note": f"median {m} / median tpe; target <= 0.333; seeds "
                    f"that reached 99% of best-known: {m} "
                    f"{a['reached']}/{a['n']}, tpe {b['reached']}/{b['n']}; value is "
                    + {"measured": "measured (both medians exact)",
                       "upper": "an upper bound (tpe's median is censored)",
                       "lower": f"a lower bound ({m}'s median is censored)",
                       "undetermined": "undetermined (both medians censored)"}[ratio["bound"]]
                    + "; CI: bootstrap over seeds (paired by seed when both ran the same "
                      "seeds), censored seeds at their budget"}


def fixed_target_rows(part: dict[str, Any], m: str = DEFAULT_SEARCHER, with_tpe: bool = True
                      ) -> list[dict]:
    """The same ratio (searcher `m` over tpe) against a target fixed before the run: 99% of
    the earlier run's best-known (re-evaluated here). Best-known over this run's own searches
    is a maximum over every seed of every searcher, so it rises with the number of seeds (on a
    100-query split partly by noise), and each seed's target with it; a fixed reference does
    not move. `with_tpe`: also tpe's own row (once per dataset)."""
    ds, eb = part["dataset"], part["earlier_best"]
    target = target_of(eb["reward"])
    med = {}
    for s in (m, "tpe"):
        rs = part["runs"][s]
        budgets = [float(r.get("budget", part["budget"])) for r in rs]
        evals = [reach(r["curve"], target, b) for r, b in zip(rs, budgets, strict=True)]
        med[s] = {**censored_median(evals, budgets), "seeds": [r["seed"] for r in rs],
                  "counted": [e if e is not None else b
                              for e, b in zip(evals, budgets, strict=True)]}
    return [{"dataset": ds, "system": s, "metric": "evals_to_99pct_of_earlier_best",
             "value": x["median"], "ci_low": None, "ci_high": None, "n": x["n"],
             "reached": x["reached"], "median_exact": x["exact"], "target": target}
            for s, x in med.items() if s == m or with_tpe] + [
        ratio_row(ds, m, med[m], med["tpe"])
        | {"metric": "evals_to_99pct_of_earlier_best_ratio_vs_tpe", "target": target,
           "note": f"secondary (not the acceptance row): target fixed before the run, 99% of "
                   f"{eb['reward']:.4f} ({eb.get('source')})"}]


# ---- plots and markdown -------------------------------------------------------------------------
def plot(part: dict[str, Any], out: Path, name: str = NAME) -> list[str]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    paths = []
    bk = part["best_known"]["reward"]
    for axis in ("query_evals", "seconds"):
        fig, ax = plt.subplots(figsize=(7, 4))
        for method, rs in part["runs"].items():
            pts = [(p[axis], p["best_full"]) for r in rs for p in r["curve"]
                   if p["best_full"] is not None and p.get(axis) is not None]
            if not pts:
                continue
            xs = np.unique([x for x, _ in pts])
            grid = np.linspace(xs.min(), xs.max(), 60)
            curves = []
            for r in rs:
                c = [(p[axis], p["best_full"]) for p in r["curve"]
                     if p["best_full"] is not None and p.get(axis) is not None]
                if not c:
                    continue
                cx, cy = np.array(c).T
                curves.append([cy[cx <= g].max() if np.any(cx <= g) else np.nan for g in grid])
            arr = np.array(curves, dtype=np.float64)
            ax.plot(grid, np.nanmedian(arr, axis=0), label=method)
        ax.axhline(bk, color="k", ls=":", lw=1, label="best-known")
        ax.axhline(0.99 * bk, color="grey", ls="--", lw=1, label="99% of best-known")
        ax.axhline(part["default"]["valid"]["reward"], color="r", ls="-.", lw=1, label="default")
        ax.set_xlabel("query-evaluations" if axis == "query_evals" else
                      "pipeline seconds (cost model)")
        ax.set_ylabel("best full-valid reward (median over seeds)")
        ax.set_title(f"{part['dataset']}: best found vs {axis.replace('_', '-')}")
        ax.legend(fontsize=7)
        fig.tight_layout()
        p = out / f"{name}-{part['dataset']}-{axis}.png"
        fig.savefig(p, dpi=110)
        plt.close(fig)
        paths.append(p.name)
    return paths


def markdown(parts: list[dict[str, Any]], rows: list[dict], commands: list[str] | None = None
             ) -> str:
    by = {(r["dataset"], r["system"], r["metric"]): r for r in rows}
    warm = {p.get("warm_start", False) for p in parts}
    out = ["Commands: " + "; ".join(f"`{c}`" for c in commands), ""] if commands else []
    out += ["Start: " + ("**warm** — every searcher's first evaluation is the static default on "
                         "the full valid split, charged like any trial (what `ragpilot tune` "
                         "does unless `--cold-start`); PPO, which has no start point, is charged "
                         "the same evaluation and keeps the default when its pick scores lower."
                         if warm == {True} else "**cold** (`--cold-start`): no searcher starts "
                         "from the static default." if warm == {False} else "mixed"),
            "", "Gates: " + ("**expected** (`--gate-expected`, `TunerSettings.gate_expected`): "
                             "each F and R gate costs its probability of failing on a new batch "
                             "of as many queries, so every reward below is the expected reward "
                             "on new queries, not the point one of search.md."
                             if {p.get("gate_rule", "point") for p in parts} == {"expected"}
                             else "**point** (the default): a failed F or R gate costs λ."),
            "", "Evals to 99%: median over seeds of the query-evaluations spent when the best "
                "full-valid reward first reached 99% of best-known; a seed that never did within "
                "its budget counts as the budget (censored), so a median over ≥ half censored "
                "seeds is only a lower bound (`bench/search_stats.py`).", ""]
    ran = {m for p in parts for m in p["runs"]}
    if missing := [m for m in SEARCHERS if m not in ran]:
        out += [f"Searchers not in this run: {', '.join(missing)}.", ""]
    for part in parts:
        ds = part["dataset"]
        bk = part["best_known"]
        cm_meta = part["cost_model"].get("meta", {})
        out += [f"## {ds}", "",
                f"Cost model (latency; `rl.kernel.cost_model`): measured "
                f"{cm_meta.get('measured_at', '?')} on `{cm_meta.get('machine', '?')}`, one model "
                f"for every process of this dataset.", "",
                f"Valid split {part['n_valid']} queries, test {part['n_test']}; space "
                f"{part['space_size']:,} configs.",
                f"Best-known reward {bk['reward']:.4f} (found by "
                + (f"an earlier run — {bk.get('source')}, re-evaluated here —"
                   if bk.get("method") == "earlier-run" else
                   f"{bk.get('method')} seed {bk.get('seed')}")
                + f", config `{bk.get('config_hash')}`); 99% of it: "
                f"{target_of(bk['reward']):.4f}; static default "
                f"{part['default']['valid']['reward']:.4f}.", "",
                "| searcher | seeds | budget (query-evals) | reached 99% | evals to 99% (median "
                "[CI]) | best found | gap closed | regret | test Δ reward | test Δ quality | "
                "test Δ tokens | test Δ p95 ms | wall s / search |",
                "|---|---|---|---|---|---|---|---|---|---|---|---|---|"]

        def f(m, metric, fmt="{:+.4f}", ds=ds):
            r = by.get((ds, m, metric))
            if r is None or not np.isfinite(r["value"]):
                return "–"
            s = fmt.format(r["value"])
            if r.get("ci_low") is not None and np.isfinite(r["ci_low"]):
                s += f" [{fmt.format(r['ci_low'])}, {fmt.format(r['ci_high'])}]"
            return s

        for m in part["runs"]:
            e = by.get((ds, m, "evals_to_99pct"), {})
            ev = f(m, "evals_to_99pct", "{:.0f}")
            if e and not e.get("median_exact", True):
                ev = "≥ " + ev
            out.append(f"| {m} | {e.get('n', '–')} | {e.get('budget', '–')} | "
                       f"{e.get('reached', '–')}/{e.get('n', '–')} | {ev} | "
                       f"{f(m, 'best_found_reward', '{:.4f}')} | {f(m, 'gap_closed', '{:.2f}')} | "
                       f"{f(m, 'regret', '{:.4f}')} | {f(m, 'holdout_delta_reward')} | "
                       f"{f(m, 'holdout_delta_quality')} | "
                       f"{f(m, 'holdout_delta_tokens', '{:+.0f}')} | "
                       f"{f(m, 'holdout_delta_p95_ms', '{:+.1f}')} | "
                       f"{f(m, 'wall_s_per_search', '{:.0f}')} |")
        tgt = target_of(bk["reward"])
        out += ["", "Seeds at 99% of best-known by a share of the budget (the same searches read "
                    "at earlier points; a run with that smaller budget gives the same curve up "
                    "to it):", ""]
        for m, rs in part["runs"].items():
            b = min(float(r.get("budget", part["budget"])) for r in rs)
            got = [sum(reach(r["curve"], tgt, f * b) is not None for r in rs)
                   for f in (0.25, 0.5, 0.75, 1.0)]
            splits = [f"{f * b / part['n_valid']:.0f}" for f in (0.25, 0.5, 0.75, 1.0)]
            out.append(f"- {m}: " + ", ".join(f"{g}/{len(rs)} by {x} splits"
                                             for g, x in zip(got, splits, strict=True)))
        for m in [m for m in part["runs"] if m != "tpe"]:
            ratio = by.get((ds, m, "evals_to_99pct_ratio_vs_tpe"))
            if not ratio:
                continue
            sign = {"measured": "", "upper": "≤ ", "lower": "≥ ", "undetermined": "~ "}[
                ratio["bound"]]
            verdict = {"met": f"met (margin {ratio['margin']:+.3f})",
                       "missed": f"**missed** by {-ratio['margin']:.3f}",
                       "undetermined": "not decided by this run"}[ratio["verdict"]]
            ci = (f" [{ratio['ci_low']:.3f}, {ratio['ci_high']:.3f}]"
                  if ratio.get("ci_low") is not None and np.isfinite(ratio["ci_low"]) else "")
            role = ("the project's default searcher: the acceptance row" if m == DEFAULT_SEARCHER
                    else "not the default searcher")
            out += ["", f"**{m} / tpe query-evaluations to 99% of best-known: "
                        f"{sign}{ratio['value']:.3f}**{ci} ({role}) — target ≤ 0.333: "
                        f"{verdict}. {ratio['note']}."]
            if m == DEFAULT_SEARCHER and ratio["verdict"] == "undetermined":
                out += ["", sizing(part, by)]
            fixed = by.get((ds, m, "evals_to_99pct_of_earlier_best_ratio_vs_tpe"))
            if fixed and bk.get("method") != "earlier-run":  # else the same as the row above
                sign = {"measured": "", "upper": "≤ ", "lower": "≥ ", "undetermined": "~ "}[
                    fixed["bound"]]
                out += ["", f"Secondary, against a target fixed before this run (99% of the "
                            f"earlier run's best-known, {fixed['target']:.4f}; best-known above "
                            f"is the best of all runs and rises with every seed): {m} / tpe "
                            f"{sign}{fixed['value']:.3f} ({fixed['verdict']}; seeds that "
                            f"reached it: {m} {fixed['reached'][m]}/{fixed['seeds'][m]}, "
                            f"tpe {fixed['reached']['tpe']}/{fixed['seeds']['tpe']})."]
        out += ["", f"![{ds} curve](search-{ds}-query_evals.png)", ""]
    return "\n".join(out)


def sizing(part: dict[str, Any], by: dict) -> str:
    """What a run that decides the ratio needs, from this run's reach counts and its measured
    wall seconds per query-evaluation (rows computed or read, on this machine's load)."""
    ds, n = part["dataset"], part["n_valid"]
    a = by[(ds, DEFAULT_SEARCHER, "evals_to_99pct")]
    rate = {m: float(np.mean([r["wall_s"] / r["query_evals"] for r in part["runs"][m]]))
            for m in (DEFAULT_SEARCHER, "tpe")}
    b_tpe = max(float(r.get("budget", part["budget"])) for r in part["runs"]["tpe"])
    if a["median_exact"]:
        need_a, need_t = a["value"], 3 * a["value"]
        head = (f"{DEFAULT_SEARCHER}'s median is measured ({a['value']:.0f} query-evaluations), "
                f"so TPE needs a budget of at least 3× that, {need_t:.0f} "
                f"({need_t / n:.0f} full splits; this run gave it {b_tpe / n:.0f}): if fewer "
                f"than half of its seeds reach the target by then, the target is met")
    else:
        need_a = float(max(float(r.get("budget", part["budget"]))
                           for r in part["runs"][DEFAULT_SEARCHER]))
        need_t = 3 * need_a
        head = (f"{DEFAULT_SEARCHER} reached the target on {a['reached']} of {a['n']} seeds "
                f"within {need_a / n:.0f} full splits, so its median needs a larger budget "
                f"than that, and TPE at least 3× it (> {need_t / n:.0f} splits)")
    hours = 20 * (need_a * rate[DEFAULT_SEARCHER] + need_t * rate["tpe"]) / 3600
    return (f"Sizing: {head}. 20 seeds of both at those budgets take "
            f"{'at least ' if not a['median_exact'] else ''}{hours:.0f} h of one process here "
            f"(at this run's {rate[DEFAULT_SEARCHER] * 1000:.0f} / {rate['tpe'] * 1000:.0f} ms "
            f"wall per query-evaluation for {DEFAULT_SEARCHER} / tpe, cached rows included).")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--seeds", type=int, default=5, help="seeds per searcher")
    ap.add_argument("--seed-start", type=int, default=0, help="first seed (seed ranges run apart)")
    ap.add_argument("--budget-x", type=float, default=12.0,
                    help="budget per search, in full valid splits of query-evaluations")
    ap.add_argument("--datasets", default=",".join(DATASETS))
    ap.add_argument("--searchers", default=",".join(SEARCHERS))
    ap.add_argument("--cold-start", action="store_true",
                    help="no searcher starts from the static default (default: every one does, "
                         "as `ragpilot tune` does)")
    ap.add_argument("--gate-expected", action="store_true",
                    help="search the expected reward (TunerSettings.gate_expected); writes "
                         "search_gate_expected.json/.md")
    ap.add_argument("--jobs", type=int, default=1, help="datasets in parallel processes")
    ap.add_argument("--parts-dir", default="runs/bench-search-parts",
                    help="where --jobs writes one part per dataset (and the pinned cost models)")
    ap.add_argument("--cost-models-from", default=None,
                    help="with --jobs: price with the cost models a results JSON stored "
                         "(meta.details.<dataset>.cost_model) instead of measuring them now")
    ap.add_argument("--best-known-from", default=None,
                    help="a results JSON of an earlier run: its best-known configs are "
                         "re-evaluated and count towards best-known (with that provenance)")
    ap.add_argument("--part-out", default=None, help=argparse.SUPPRESS)
    ap.add_argument("--cost-model", default=None, help=argparse.SUPPRESS)
    ap.add_argument("--from-parts", default=None,
                    help="assemble results from the part files in these folders (comma-separated;"
                         " merged per dataset)")
    ap.add_argument("--command", action="append", default=None,
                    help="with --from-parts: the command that wrote a part (listed in the .md)")
    args = ap.parse_args()
    datasets = ["synthetic"] if args.quick else args.datasets.split(",")
    seeds = list(range(args.seed_start, args.seed_start + (2 if args.quick else args.seeds)))
    budget_x = 8.0 if args.quick else args.budget_x
    searchers = tuple(args.searchers.split(","))
    warm = not args.cold_start
    settings = TunerSettings.defaults().model_copy(update={"gate_expected": args.gate_expected})
    name = f"{NAME}_gate_expected" if args.gate_expected else NAME
    log = lambda m: print(m, flush=True)  # noqa: E731
    cm = Path(args.cost_model) if args.cost_model else None
    if args.part_out:  # a child of --jobs: one dataset, written to a part file
        out = Path(args.part_out)

        def save(part: dict[str, Any]) -> None:
            tmp = out.with_suffix(".tmp")
            tmp.write_text(json.dumps(part, default=str))
            tmp.replace(out)

        save(run_dataset(datasets[0], settings, seeds, budget_x, searchers, log, warm, cm, save,
                         args.best_known_from))
        return
    dirs = [Path(d) for d in args.from_parts.split(",")] if args.from_parts else []
    if args.jobs > 1 and not dirs:
        parts_dir = Path(args.parts_dir)
        parts_dir.mkdir(parents=True, exist_ok=True)
        procs = []
        for d in datasets:
            # the cost model every process of this dataset prices with, measured here once
            pinned = parts_dir / f"cost-model-{d}.json"
            if not pinned.exists() and args.cost_models_from:
                saved = json.loads(Path(args.cost_models_from).read_text())
                pinned.write_text(json.dumps(saved["meta"]["details"][d]["cost_model"],
                                             indent=1, sort_keys=True))
            if not pinned.exists():  # (each dataset's process starts as soon as it has one)
                ev = TunerEvaluator(TuningData.open(d), settings)
                pinned_cost_model(ev, ConfigSpace(settings, conversational=d in CONVERSATIONAL),
                                  pinned)
                del ev
            procs.append(subprocess.Popen(
                [sys.executable, __file__, "--datasets", d, "--seeds", str(args.seeds),
                 "--seed-start", str(args.seed_start), "--budget-x", str(budget_x),
                 "--searchers", ",".join(searchers), "--part-out", str(parts_dir / f"{d}.json"),
                 "--cost-model", str(pinned)] + (["--quick"] if args.quick else [])
                + (["--best-known-from", args.best_known_from] if args.best_known_from else [])
                + (["--cold-start"] if args.cold_start else [])
                + (["--gate-expected"] if args.gate_expected else [])))
        for p in procs:
            if p.wait() != 0:
                raise SystemExit(f"a dataset process failed (exit {p.returncode})")
        dirs = [parts_dir]
    if dirs:
        files = [f for d in dirs for f in sorted(d.glob("*.json"))
                 if not f.name.startswith("cost-model-")]
        parts = merge_parts([json.loads(f.read_text()) for f in files])
        parts = [p for d in datasets for p in parts if p["dataset"] == d]
    else:
        parts = [run_dataset(d, settings, seeds, budget_x, searchers, log, warm,
                             best_known_from=args.best_known_from) for d in datasets]
    rows, pngs = [], []
    for part in parts:
        r, _ = rows_for(part)
        rows += r
        if not args.quick:
            pngs += plot(part, RESULTS, name)
    meta = make_meta(0, {d: data_root() / d for d in datasets if d != "synthetic"},
                     {"quick": args.quick, "warm_start": sorted({bool(p.get("warm_start"))
                                                                 for p in parts}),
                      "seeds": {p["dataset"]: {m: [r["seed"] for r in rs]
                                               for m, rs in p["runs"].items()} for p in parts},
                      "budgets": {p["dataset"]: {m: sorted({r.get("budget", p["budget"])
                                                            for r in rs})
                                                 for m, rs in p["runs"].items()} for p in parts},
                      "searchers": sorted({m for p in parts for m in p["runs"]}),
                      "default_searcher": DEFAULT_SEARCHER, "parts": [str(d) for d in dirs],
                      "commands": args.command,
                      "rungs": [25, 75, "full"], "plots": pngs,
                      "details": {p["dataset"]: {k: v for k, v in p.items() if k != "runs"}
                                  for p in parts},
                      "runs": {p["dataset"]: {m: [{k: v for k, v in r.items() if k != "trials"}
                                                  for r in rs] for m, rs in p["runs"].items()}
                               for p in parts}})
    write_results(name, rows, meta, "Search benchmark: query-evaluations to a good static config",
                  markdown(parts, rows, args.command))


if __name__ == "__main__":
    main()
