"""The markdown of bench/headroom.py, rendered from its JSON alone (meta + rows), so
`--render-only` rewrites it without evaluating anything."""

from __future__ import annotations

from typing import Any

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
