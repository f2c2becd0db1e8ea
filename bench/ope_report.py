"""The markdown of `bench/ope.py`: B4 LinUCB against best static, OPE errors, pick latency."""

from __future__ import annotations

TITLE = ("Off-policy evaluation from ε-greedy logs, B4 LinUCB from those logs, and the "
         "serving policy's pick latency")


def _fmt(r: dict | None, f: str = "{:.4f}") -> str:
    if r is None:
        return "–"
    s = f.format(r["value"])
    if r.get("ci_low") is not None and r.get("ci_high") is not None:
        s += f" [{f.format(r['ci_low'])}, {f.format(r['ci_high'])}]"
    return s


def _get(rows: list[dict], ds: str, system: str, metric: str) -> dict | None:
    return next((r for r in rows if r["dataset"] == ds and r["system"] == system
                 and r["metric"] == metric), None)


def _ope_cell(rows: list[dict], ds: str, target: str, log: str, est: str,
              metric: str = "ope_abs_error", headline_log: str = "stream") -> str:
    """One estimator's cell; the headline rows (router, `headline_log`) carry the bare name."""
    headline = target == "supervised-router" and log == headline_log and est != "dr-trainq"
    r = _get(rows, ds, est if headline else f"{est} {target} {log}", metric)
    return _fmt(r, "{:.3f}" if metric == "ci_coverage" else "{:.4f}")


def _acceptance(meta: dict, rows: list[dict], head: str) -> list[str]:
    """The pre-registered row per dataset, with the ε-uniform log's result beside it."""
    t, budget = meta["target_ope_abs_error"], PICK_TARGET_MS
    out = ["## Acceptance (issue 19: `dr` `ope_abs_error` ≤ "
           f"{t} for the policy's value on test; the pick ≤ {budget:g} ms p95 added)", "",
           f"| dataset | `dr` on `{head}` (headline) | met | DR on `stream` (ε-uniform log) "
           f"| pick p95 (`policy-router` `pick_ms_p95`) | met | slowest router tried |",
           "|---|---|---|---|---|---|---|"]
    for ds in meta["details"]:
        r = _get(rows, ds, "dr", "ope_abs_error")
        old = _get(rows, ds, "dr supervised-router stream", "ope_abs_error")
        p = _get(rows, ds, "policy-router", "pick_ms_p95")
        slow = _get(rows, ds, "policy-router", "pick_ms_p95_slowest_router")
        out.append(f"| {ds} | {_fmt(r)} | {_met(r, t)} | {_fmt(old)} | "
                   f"{_fmt(p, '{:.2f} ms')} | {_met(p, budget, '{:+.2f} ms')} | "
                   f"{_fmt(slow, '{:.2f} ms')} |")
    return out + [""]


PICK_TARGET_MS = 5.0


def _met(r: dict | None, target: float, f: str = "{:+.4f}") -> str:
    """Met / missed against an upper bound, with the margin (target − value)."""
    if r is None:
        return "–"
    m = f.format(target - r["value"])
    return f"met (margin {m})" if r["value"] <= target else f"missed (margin {m})"


def markdown(meta: dict, rows: list[dict]) -> str:
    head = meta.get("headline_log", "stream")
    share = meta.get("candidate_share")
    out = [f"Logging policies: ε-greedy around the best static arm, ε = {meta['epsilon']} "
           f"(min propensity ε/M; logs `one-pass`, `stream`)"
           + (f", and the same with candidate-aware exploration: the supervised router (the "
              f"candidate awaiting its gate) given {share} of the requests on top of the "
              f"uniform ε, so its own choices are logged with propensity ≥ {share} (logs "
              f"`one-pass+candidate`, `stream+candidate`; `serve.policy.candidate_share` in "
              f"the Serve app)" if share else "")
           + f"; {meta['draws']} seeded logs per cell; one-pass = each test "
           f"query once; stream = {meta['stream_rounds']:,} requests drawn from the test "
           f"queries. Pre-registered target: `dr` "
           f"`ope_abs_error` ≤ {meta['target_ope_abs_error']} (supervised router, `{head}`).",
           ""]
    if share:
        out += _acceptance(meta, rows, head)
    for ds, d in meta["details"].items():
        def g(s: str, m: str, ds: str = ds) -> dict | None:
            return _get(rows, ds, s, m)

        lin = d["linucb"]
        ch = d["router"]["chosen"]
        cm = d.get("cost_model") or {}
        out += [f"## {ds}", "",
                f"n = {d['n']}; {len(d['arms'])} arms"
                + (f" and {d['n_features']} feature columns" if d.get("n_features") else "")
                + (f" (query formulations {', '.join(d['formulation_views'])} as arms and "
                   f"feature views, as bench/policy.py)" if d.get("formulation_views") else "")
                + f"; best static `{d['best_static']}`; min propensity "
                f"{d['min_propensity']:.4f}; the router (chosen on valid: "
                f"{'pooled, ' if ch.get('pooled') else 'per arm, '}{ch['max_iter']} rounds, "
                f"{ch['max_leaf_nodes']} leaves, shrink {ch['shrink']}) leaves the best "
                f"static arm on {d['router']['share_off_best_static']:.0%} of test queries."
                + (" Latency priced with the cost model measured in this run."
                   if cm.get("source") == "measured" else
                   f" Latency priced with the cost model of {cm['source']}"
                   + (f" (measured {cm['measured_at']})" if cm.get("measured_at") else "")
                   + (f"; measured in this run: {', '.join(cm['added'])}"
                      if cm.get("added") else "") + "." if cm else ""), "",
                f"**B4 LinUCB** (l2 {lin['chosen']['l2']}, beta {lin['chosen']['beta']}, from "
                f"{lin['train_log_rounds']} logged train rounds): test reward "
                f"{_fmt(g('linucb', 'reward'))} vs best static "
                f"{_fmt(g('best-static', 'reward'))}; Δ "
                f"{_fmt(g('linucb - best-static', 'delta_reward'), '{:+.4f}')}, headroom "
                f"captured {_fmt(g('linucb', 'headroom_captured'), '{:.2f}')}.", "",
                "| target | log | true value | IPS | SNIPS | DR | DR (train q̂) | "
                "DR CI coverage |", "|---|---|---|---|---|---|---|---|"]
        for key, det in d["ope"].items():
            target, log = key.rsplit(" ", 1)

            cells = [_ope_cell(rows, ds, target, log, est, headline_log=head) for est in
                     ("ips", "snips", "dr", "dr-trainq")]
            cells.append(_ope_cell(rows, ds, target, log, "dr", "ci_coverage", head))
            out.append(f"| {target} | {log} | {det['true_value']:.4f} | "
                       + " | ".join(cells) + " |")
        if d.get("pick"):
            p = d["pick"]
            out += ["", f"**policy-router**: the pick itself (probabilities + ε-mixture + "
                        f"draw) p50 {p['pick_ms_p50']:.2f} ms, p95 {p['pick_ms_p95']:.2f} ms; "
                        f"the features over the real indexes p50 {p['features_ms_p50']:.1f} "
                        f"ms, p95 {p['features_ms_p95']:.1f} ms (retrievals the chosen "
                        f"pipeline reuses); total p95 {p['pick_total_ms_p95']:.1f} ms"
                        + (f"; with LinUCB explored beside it at {share}: pick p50 "
                           f"{p['pick_ms_p50_with_candidate']:.2f} ms, p95 "
                           f"{p['pick_ms_p95_with_candidate']:.2f} ms"
                           if "pick_ms_p95_with_candidate" in p else "") + "."]
            if d.get("pick_by_router"):
                out += ["", "Pick p95 of every router `select_router` tries (the one served "
                            "is whichever valid chooses; timed like the candidate row, "
                            "features cached, which reads a little lower than the served "
                            "pick's own p95):", "",
                        "| router | tree evaluations per pick | pick p95 |", "|---|---|---|"]
                for g in d["pick_by_router"]:
                    out.append(f"| {'pooled' if g['pooled'] else 'per arm'}, {g['max_iter']} "
                               f"rounds, {g['max_leaf_nodes']} leaves, shrink {g['shrink']} | "
                               f"{g['tree_evals']:,} | {g['pick_ms_p95']:.2f} ms |")
        out.append("")
    out.append("Cells: mean |estimate − true value| over the seeded logs [bootstrap 95% CI].")
    return "\n".join(out)
