"""Headroom study: how much room a per-query (or per-segment) config policy has over the best
static config, on HotpotQA, SciFact and MTRAG.

    python bench/headroom.py                 # full: 3 datasets, valid (tune) + test (check)
    python bench/headroom.py --quick         # < 2 min: the synthetic world

A fixed portfolio of configs (`PORTFOLIO`: the static default plus 29 spread over retriever,
k, fusion weight and normalisation, MMR, cosine rerank and the two prompts, each made from the
policy's base config) is evaluated on every query of the dataset's tune split (`valid`) and,
as a check, its holdout (`test`), through the tuner's own per-query tables
(`TunerEvaluator.table`; latency priced with the cost model measured on this machine,
`bench.common.evaluator`, recorded in `details[ds]["cost_model"]`). Per query:
reward = `TunerEvaluator.per_query_reward` (no batch gates), quality = `RewardSpec.quality` of the evaluator's F and R (αF + βR), cost = tokens.
From the (queries × configs) matrices (`rl.stats.headroom`), rows (reward units unless said):

  * `best-static` / `static-default`: mean per-query reward, quality and tokens;
  * `per-query-oracle` `headroom`: mean per-query max − mean of the best static config, with
    a paired bootstrap 95% CI over queries (best static fixed); `delta_quality`,
    `delta_tokens`: the same for the oracle's choices' quality and tokens;
  * `per-query-oracle-equal-cost`: the oracle held to the best static config's mean tokens
    (max reward − mu·tokens per query, mu by bisection);
  * `per-query-oracle-mean-latency`: the oracle's headroom when every query of a config is
    charged the config's mean latency (the oracle cannot pick timing noise);
  * `per-segment-best[:key]`: best config per segment − the best static, in-sample; and
    `per-segment-best-crossfit[:key]`: chosen per segment (and the static one) on half the
    queries and scored on the other half (2-fold, stratified, averaged over 10 fold draws);
    on test also `per-segment-best-transfer`: both chosen on valid, scored on test. Segments:
    HotpotQA question type, SciFact gold docs (1 vs >1), MTRAG domain × turn (first / later)
    and each alone;
  * `rung-25`, `rung-75` `fidelity_spearman`: Spearman over the portfolio of the mean reward
    on 25 (75) random queries vs the full split, mean over 20 subsets with a CI over subsets;
    `rung-*-batch`: the same with the batch reward a searcher sees (gates, p95, mean cost).
Rows carry `split`; test rows' systems end in `@test`. `meta.portfolio` lists every config.
"""

from __future__ import annotations

import argparse
import sys
import time
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
    write_results,
)
from rag.config import RAGConfig  # noqa: E402
from rag.corpus.loaders import data_root  # noqa: E402
from rl.kernel.reward import PII_COLUMN  # noqa: E402
from rl.kernel.settings import TunerSettings  # noqa: E402
from rl.routing.portfolio import PORTFOLIO, portfolio  # noqa: E402
from rl.stats.bootstrap import bootstrap_mean_ci, paired_bootstrap  # noqa: E402
from rl.stats.headroom import (  # noqa: E402
    best_static,
    crossfit_segment_gain,
    equal_cost_oracle,
    oracle_choice,
    pick,
    rung_spearman,
    segment_choice,
    segment_values,
)

NAME = "headroom"
RUNGS = (25, 75)
N_SUBSETS = 20
CROSSFIT_REPEATS = 10
MAIN_SEGMENTS = {"hotpotqa": "type", "scifact": "gold_docs", "mtrag": "domain+turn",
                 "synthetic": "type"}
"""The segmentation behind the unsuffixed `per-segment-best` rows."""


def segmentations(dataset: str, examples) -> dict[str, list[str]]:
    """Segment labels per query, by segmentation name (the first is the main one)."""
    if dataset == "mtrag":
        dom = [str((e.metadata or {}).get("collection")) for e in examples]
        turn = ["first" if str((e.metadata or {}).get("turn")) == "1" else "later"
                for e in examples]
        return {"domain+turn": [f"{d}/{t}" for d, t in zip(dom, turn, strict=True)],
                "domain": dom, "turn": turn}
    if dataset == "scifact":
        return {"gold_docs": ["1" if len(e.gold_passage_ids) <= 1 else ">1" for e in examples]}
    return {"type": [e.category for e in examples]}


def matrices(ev, configs: list[tuple[str, RAGConfig]], split: str) -> dict[str, Any]:
    """(queries × configs) reward R, quality Q (αF+βR) and tokens T, R with each config's
    mean latency in place of the query's (Rm), and the tables."""
    spec = ev.reward_spec()
    tabs, cols = [], {"R": [], "Rm": [], "Q": [], "T": []}
    for i, (name, cfg) in enumerate(configs, 1):
        t0 = time.perf_counter()
        cached = ev.is_cached(cfg, split)
        tab = ev.table(cfg, split)
        tabs.append(tab)
        cols["R"].append(ev.per_query_reward(tab))
        cols["Q"].append(ev.per_query_quality(tab))
        # the same reward with the config's mean latency for every query: no timing noise
        F, Rel = ev.quality(tab)
        lat = np.full_like(tab["latency_ms"], tab["latency_ms"].mean())
        cols["Rm"].append(np.asarray(spec.per_query(F, Rel, lat, tab["tokens"],
                                                    tab.get(PII_COLUMN)), dtype=np.float64))
        cols["T"].append(tab["tokens"])
        print(f"  [{ev.data.name}/{split}] {i:2d}/{len(configs)} {name:28s} "
              f"{'cached' if cached else f'{time.perf_counter() - t0:6.1f}s'}", flush=True)
    return {k: np.column_stack(v) for k, v in cols.items()} | {"tabs": tabs}


def _diff_row(ds: str, split: str, system: str, metric: str, a, b, seed: int) -> dict:
    """Mean of b − a per query with a paired bootstrap 95% CI (10k resamples)."""
    r = paired_bootstrap(a, b, seed=seed)
    return {"dataset": ds, "split": split, "system": system, "metric": metric,
            "value": r.mean_diff, "ci_low": r.ci_low, "ci_high": r.ci_high, "n": r.n}


def _mean_row(ds: str, split: str, system: str, metric: str, values, seed: int) -> dict:
    v = np.asarray(values, dtype=np.float64)
    return {**metric_row(ds, system, metric, v[np.isfinite(v)], seed), "split": split}


def study(ds: str, split: str, M: dict[str, Any], names: list[str], segs: dict[str, list[str]],
          ev, seed: int, transfer: dict | None = None) -> tuple[list[dict], dict]:
    """Rows and details of one dataset split from its matrices `M` (see the module
    docstring); `transfer` (test only): the valid split's best column and segment choices."""
    R, Q, T = M["R"], M["Q"], M["T"]
    sfx = "" if split == "valid" else f"@{split}"
    best = best_static(R)
    rows = []
    for system, j in (("static-default", 0), ("best-static", best)):
        for metric, X in (("reward", R), ("quality", Q), ("tokens", T)):
            rows.append(_mean_row(ds, split, system + sfx, metric, X[:, j], seed))
    oracle = oracle_choice(R)
    budget = float(T[:, best].mean())
    eq, mu = equal_cost_oracle(R, T, budget)
    for system, ch in (("per-query-oracle", oracle), ("per-query-oracle-equal-cost", eq)):
        for metric, X in (("headroom", R), ("delta_quality", Q), ("delta_tokens", T)):
            rows.append(_diff_row(ds, split, system + sfx, metric, X[:, best], pick(X, ch),
                                  seed))
    Rm = M["Rm"]
    bm = best_static(Rm)
    rows.append(_diff_row(ds, split, "per-query-oracle-mean-latency" + sfx, "headroom",
                          Rm[:, bm], Rm.max(axis=1), seed))
    seg_detail = {}
    for key, labels in segs.items():
        tag = "" if key == MAIN_SEGMENTS.get(ds, key) else f":{key}"
        choice = segment_choice(R, labels)
        rows.append(_diff_row(ds, split, f"per-segment-best{tag}{sfx}", "headroom",
                              R[:, best], segment_values(R, labels, choice), seed))
        gain = crossfit_segment_gain(R, labels, 2, CROSSFIT_REPEATS, seed)
        b = bootstrap_mean_ci(gain, seed=seed)
        rows.append({"dataset": ds, "split": split, "system": f"per-segment-best-crossfit{tag}"
                     f"{sfx}", "metric": "headroom", "value": b.mean_diff,
                     "ci_low": b.ci_low, "ci_high": b.ci_high, "n": b.n})
        lab = np.asarray(labels)
        seg_detail[key] = {s: {"n": int((lab == s).sum()), "best": names[c],
                               "gain_in_sample": float((R[lab == s, c]
                                                        - R[lab == s, best]).mean())}
                           for s, c in choice.items()}
        if transfer is not None and key in transfer["segments"]:
            vb = transfer["best"]
            vals = segment_values(R, labels, transfer["segments"][key], fallback=vb)
            rows.append(_diff_row(ds, split, f"per-segment-best-transfer{tag}{sfx}",
                                  "headroom", R[:, vb], vals, seed))
    if transfer is not None:
        for metric, X in (("reward", R), ("quality", Q), ("tokens", T)):
            rows.append(_mean_row(ds, split, "valid-best-static" + sfx, metric,
                                  X[:, transfer["best"]], seed))
    spec = ev.reward_spec()

    def batch_score(idx: np.ndarray) -> np.ndarray:
        return np.array([spec.reward(ev.summarize(tab, idx))[0] for tab in M["tabs"]])

    n = R.shape[0]
    for m in RUNGS:
        if m >= n:
            continue
        rows.append(_mean_row(ds, split, f"rung-{m}{sfx}", "fidelity_spearman",
                              rung_spearman(R, m, N_SUBSETS, seed), seed))
        rows.append(_mean_row(ds, split, f"rung-{m}-batch{sfx}", "fidelity_spearman",
                              rung_spearman(R, m, N_SUBSETS, seed, batch_score), seed))
    used, counts = np.unique(oracle, return_counts=True)
    full_batch = batch_score(np.arange(n))
    detail = {
        "n": int(n), "best_static": names[best], "equal_cost_mu": mu,
        "token_budget": budget,
        "best_static_ties_oracle": float(np.mean(R[:, best] >= R.max(axis=1) - 1e-12)),
        "oracle_configs": {names[u]: int(c) for u, c in
                           sorted(zip(used, counts, strict=True), key=lambda x: -x[1])},
        "batch_reward": {nm: float(full_batch[j]) for j, nm in enumerate(names)},
        "mean_reward": {nm: float(R[:, j].mean()) for j, nm in enumerate(names)},
        "segments": seg_detail,
        "choices": {"best": best, "segments": {k: segment_choice(R, v)
                                               for k, v in segs.items()}},
    }
    return rows, detail


TITLE = "Headroom: per-query and per-segment config choice vs the best static config"
ORDER = ("static-default", "best-static", "valid-best-static", "per-query-oracle",
         "per-query-oracle-equal-cost", "per-query-oracle-mean-latency", "per-segment-best", "per-segment-best-crossfit",
         "per-segment-best-transfer", "rung-25", "rung-25-batch", "rung-75", "rung-75-batch")


def _fmt(r: dict | None, digits: int = 3) -> str:
    if r is None:
        return "–"
    d = 0 if r["metric"] in ("tokens", "delta_tokens") else digits
    s = f"{r['value']:+.{d}f}" if r["metric"].startswith(("delta", "headroom")) \
        else f"{r['value']:.{d}f}"
    if r.get("ci_low") is not None:
        s += f" [{r['ci_low']:.{d}f}, {r['ci_high']:.{d}f}]"
    return s


def _base(system: str) -> tuple[str, str]:
    """(system without '@split', segmentation tag or '')."""
    name = system.split("@")[0]
    head, _, tag = name.partition(":")
    return head, tag


def _sort_key(key: tuple[str, str]) -> tuple[int, str, str]:
    head, tag = _base(key[0])
    return (ORDER.index(head) if head in ORDER else len(ORDER), tag, key[1])


def _table(ds: str, rows: list[dict]) -> str:
    cells: dict[tuple[str, str], dict[str, dict]] = {}
    for r in rows:
        if r["dataset"] == ds:
            cells.setdefault((r["system"].split("@")[0], r["metric"]), {})[r["split"]] = r
    out = ["| system | metric | valid (tune split) | test (check) |", "|---|---|---|---|"]
    for key in sorted(cells, key=_sort_key):
        c = cells[key]
        out.append(f"| {key[0]} | {key[1]} | {_fmt(c.get('valid'))} | {_fmt(c.get('test'))} |")
    return "\n".join(out)


def _get(rows: list[dict], ds: str, system: str, metric: str, split: str = "valid"
         ) -> dict | None:
    sys_name = system if split == "valid" else f"{system}@{split}"
    for r in rows:
        if (r["dataset"], r["system"], r["metric"], r["split"]) == (ds, sys_name, metric, split):
            return r
    return None


def _v(r: dict | None, fmt: str = "+.3f") -> str:
    return "n/a" if r is None else format(r["value"], fmt)


def _ci(r: dict | None, d: int = 3) -> str:
    if r is None or r.get("ci_low") is None:
        return ""
    return f" [{r['ci_low']:.{d}f}, {r['ci_high']:.{d}f}]"


def reading(ds: str, meta: dict[str, Any], rows: list[dict]) -> str:
    """A short plain-language reading of one dataset; every number comes from `rows`."""
    det = meta.get("details", {}).get(ds, {}).get("valid", {})
    seg = meta.get("main_segments", {}).get(ds, "segment")
    g = lambda *a: _get(rows, ds, *a)  # noqa: E731
    best, dflt = g("best-static", "reward"), g("static-default", "reward")
    h, dq, dt = (g("per-query-oracle", m) for m in ("headroom", "delta_quality",
                                                    "delta_tokens"))
    he, dqe, dte = (g("per-query-oracle-equal-cost", m) for m in ("headroom", "delta_quality",
                                                                  "delta_tokens"))
    hm = g("per-query-oracle-mean-latency", "headroom")
    s, sc = g("per-segment-best", "headroom"), g("per-segment-best-crossfit", "headroom")
    ht = _get(rows, ds, "per-query-oracle", "headroom", "test")
    st = _get(rows, ds, "per-segment-best-transfer", "headroom", "test")
    rel = "" if h is None or best is None or best["value"] == 0 else \
        f" ({100 * h['value'] / abs(best['value']):.0f}% of the best static reward)"
    ties = det.get("best_static_ties_oracle")
    return (
        f"**{ds}** (valid, {det.get('n', '?')} queries). The best static config of the "
        f"portfolio is `{det.get('best_static', '?')}` (mean per-query reward {_v(best, '.3f')}; "
        f"the static default {_v(dflt, '.3f')}). A per-query oracle, which picks each "
        f"query's best config after seeing its outcome, gains {_v(h)}{_ci(h)} per query"
        f"{rel}: quality {_v(dq)}, tokens {_v(dt, '+.0f')}"
        + ("" if ties is None else f"; the best static config is already the best choice "
                                   f"for {100 * ties:.0f}% of the queries")
        + f". Held to the best static config's mean tokens it gains {_v(he)}{_ci(he)} "
        f"(quality {_v(dqe)}, tokens {_v(dte, '+.0f')}); charged each config's mean latency (no "
        f"timing noise to pick) it gains {_v(hm)}{_ci(hm)}. Choosing one config per {seg} gains "
        f"{_v(s)} in-sample but {_v(sc)}{_ci(sc)} cross-fitted (chosen on half the queries, "
        f"scored on the other half); chosen on valid and scored on test, {_v(st)}{_ci(st)}. "
        f"On test the oracle's headroom is {_v(ht)}{_ci(ht)}. Ranking the portfolio on 25 "
        f"random queries agrees with the full split at Spearman "
        f"{_v(g('rung-25', 'fidelity_spearman'), '.2f')} "
        f"(75 queries: {_v(g('rung-75', 'fidelity_spearman'), '.2f')}); with the batch reward "
        f"a searcher sees (gates, p95) {_v(g('rung-25-batch', 'fidelity_spearman'), '.2f')} / "
        f"{_v(g('rung-75-batch', 'fidelity_spearman'), '.2f')}.")


def summary(datasets: list[str], rows: list[dict]) -> str:
    """One paragraph over all datasets; every number comes from `rows`."""
    def vals(system: str, split: str = "valid") -> list[tuple[str, dict]]:
        return [(ds, r) for ds in datasets
                if (r := _get(rows, ds, system, "headroom", split)) is not None]

    def span(pairs: list[tuple[str, dict]]) -> str:
        return ", ".join(f"{ds} {r['value']:+.3f}" for ds, r in pairs) or "n/a"

    oracle, eq = vals("per-query-oracle"), vals("per-query-oracle-equal-cost")
    cross = [(ds, r) for ds in datasets for r in rows
             if r["dataset"] == ds and r["split"] == "valid" and r["metric"] == "headroom"
             and r["system"].startswith("per-segment-best-crossfit")]
    none_above = all(r["ci_low"] is not None and r["ci_low"] <= 0.0 for _, r in cross)
    seg = ("no segmentation tried gains anything once cross-fitted (no CI lies above 0): "
           "the room is per query, so a policy needs per-query features, not segment labels"
           if cross and none_above else
           "some segmentations keep a cross-fitted gain (see the `-crossfit` rows)")
    def rho(system: str) -> str:
        return ", ".join(f"{ds} {r['value']:.2f}" for ds in datasets
                         if (r := _get(rows, ds, system, "fidelity_spearman")) is not None) \
            or "n/a"

    return (f"How much room a per-query policy has, in reward per query on the tune split "
            f"(per-query oracle minus the best static config): {span(oracle)}; held to the "
            f"static config's token budget: {span(eq)}; on test: "
            f"{span(vals('per-query-oracle', 'test'))}. By contrast {seg}. Fidelity rungs "
            f"(Spearman of the portfolio's 25-query ranking with the full split's): by mean "
            f"per-query reward {rho('rung-25')}; by the gated batch reward a searcher sees "
            f"{rho('rung-25-batch')} (75 queries: {rho('rung-75-batch')}).")


def markdown(meta: dict[str, Any], rows: list[dict]) -> str:
    datasets = list(dict.fromkeys(r["dataset"] for r in rows))
    port = meta.get("portfolio", [])
    parts = [
        f"Portfolio: {len(port)} configs from the policy's base config (`meta.portfolio`); "
        "the first is the static default. Reward per query = the tuner's per-query reward "
        "(quality − γ·latency − δ·tokens, no batch gates); quality = αF + βR; headroom rows "
        "are per-query means in reward units with a paired bootstrap 95% CI over queries "
        "(the best static config held fixed). `-crossfit` = the per-segment choice and the "
        "static choice it is compared with both made on one half of the queries and scored "
        "on the other (2-fold, stratified by segment, mean over "
        f"{meta.get('crossfit_repeats', '?')} fold draws; its baseline is this cross-fitted "
        "static choice, not the in-sample best, so it can exceed the in-sample row); "
        "`-transfer` = both chosen on valid, scored on test; `:key` = another segmentation than the main one; `rung-m` = "
        f"Spearman over the portfolio, m queries vs the full split, mean over "
        f"{meta.get('n_subsets', '?')} subsets with a CI over subsets.",
        "",
        "## What it says",
        "",
        "The oracle numbers are upper bounds: the oracle chooses after seeing each query's "
        "outcome, and with latency in the reward it also profits from timing noise, which the "
        "quality and token deltas do not contain. The cross-fitted and valid→test rows are "
        "what a policy that learns from data could expect.",
        "",
    ]
    parts += [summary(datasets, rows), ""]
    parts += [reading(ds, meta, rows) + "\n" for ds in datasets]
    for ds in datasets:
        parts += [f"## {ds}", "", _table(ds, rows), ""]
    if port:
        parts += ["## Portfolio", "", "| # | name | hash | overrides of the base config |",
                  "|---|---|---|---|"]
        parts += [f"| {i} | {p['name']} | `{p['config_hash']}` | "
                  f"{', '.join(f'{k}={v}' for k, v in p['overrides'].items()) or '(base)'} |"
                  for i, p in enumerate(port)]
    return "\n".join(parts)


def run_dataset(ds: str, policy: TunerSettings, seed: int, rows: list, details: dict) -> None:
    t0 = time.perf_counter()
    ev, cost_source = evaluator(ds, policy)
    configs = portfolio(policy)
    names = [n for n, _ in configs]
    details[ds] = {}
    transfer = None
    for split in (ev.slice.tune_split, ev.slice.holdout_split):
        examples = ev.data.examples(split)
        M = matrices(ev, configs, split)
        r, d = study(ds, split, M, names, segmentations(ds, examples), ev, seed, transfer)
        transfer = d.pop("choices")
        rows.extend(r)
        details[ds][split] = d
    details[ds]["wall_s"] = round(time.perf_counter() - t0, 1)
    details[ds]["cost_model"] = cost_model_used(ev, cost_source)
    details[ds]["counters"] = dict(ev.counters)
    print(f"[{ds}] done in {details[ds]['wall_s']}s", flush=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true", help="the synthetic world only (< 2 min)")
    ap.add_argument("--datasets", default="hotpotqa,scifact,mtrag")
    ap.add_argument("--seed", type=int, default=0)
    a = ap.parse_args()
    datasets = ["synthetic"] if a.quick else a.datasets.split(",")
    policy = TunerSettings.defaults()
    rows: list[dict] = []
    details: dict[str, Any] = {}
    t0 = time.perf_counter()
    for ds in datasets:
        run_dataset(ds, policy, a.seed, rows, details)
    files = {} if a.quick else {d: data_root() / d for d in datasets}
    meta = make_meta(a.seed, files, {
        "quick": a.quick, "wall_s": round(time.perf_counter() - t0, 1),
        "base_config": policy.base_config().model_dump(mode="json"),
        "portfolio": [{"name": n, "config_hash": c.config_hash, "overrides": dict(o)}
                      for (n, c), (_, o) in zip(portfolio(policy), PORTFOLIO, strict=True)],
        "reward": {"weights": policy.reward_weights.model_dump(mode="json", by_alias=True),
                   "cost_ref_tokens": policy.cost_ref_tokens},
        "rungs": list(RUNGS), "n_subsets": N_SUBSETS, "crossfit_repeats": CROSSFIT_REPEATS,
        "main_segments": MAIN_SEGMENTS, "details": details})
    write_results(NAME, rows, meta, TITLE, markdown(meta, rows))


if __name__ == "__main__":
    main()
