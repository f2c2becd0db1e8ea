"""`runs/demo/report.html`: one self-contained page (no external files: every PNG inline as a
base64 data URI) with the tuned config, the holdout table (quality and cost apart), the Pareto
and reward-curve plots, and the promotion timeline."""

from __future__ import annotations

import base64
import html
import math
from pathlib import Path
from typing import Any

CSS = """body{font-family:system-ui,sans-serif;margin:2em;max-width:1000px;color:#222}
table{border-collapse:collapse;margin:1em 0}td,th{border:1px solid #ccc;padding:4px 8px;
text-align:right}th{background:#f4f4f4}td.l,th.l{text-align:left}img{max-width:480px;margin:4px}
.promoted{color:#070}.rolled_back{color:#a00}.held{color:#a60}"""


def data_uri(png: Path) -> str:
    """A PNG file as a `data:image/png;base64,...` URI."""
    return "data:image/png;base64," + base64.b64encode(Path(png).read_bytes()).decode("ascii")


def _f(x: Any, fmt: str = "{:.4f}") -> str:
    if isinstance(x, float) and not math.isfinite(x):
        return "—"
    return fmt.format(x) if isinstance(x, (int, float)) else html.escape(str(x))


def _table(head: list[str], rows: list[list[Any]]) -> str:
    th = "".join(f"<th{' class=l' if i == 0 else ''}>{html.escape(h)}</th>"
                 for i, h in enumerate(head))
    body = "".join("<tr>" + "".join(f"<td{' class=l' if i == 0 else ''}>{c}</td>"
                                    for i, c in enumerate(r)) + "</tr>" for r in rows)
    return f"<table><tr>{th}</tr>{body}</table>"


def write_report(path: Path, summary: dict[str, Any], plots: dict[str, Path]) -> Path:
    """Write the page for `summary` (what summary.json holds) with `plots` (name -> PNG)."""
    e = html.escape
    tuned, hold, promo = summary["tuned_config"], summary["holdout_delta"], summary["promotion"]
    parts = [f"<!doctype html><html><head><meta charset=utf-8><title>ragpilot demo</title>"
             f"<style>{CSS}</style></head><body><h1>ragpilot demo</h1>",
             f"<p>Synthetic world, seed {summary['seed']}; {'fast' if summary['fast'] else 'full'}"
             f" run; {summary['wall_s']:.0f} s in all.</p>",
             "<h2>Stages</h2>",
             _table(["stage", "result", "seconds"],
                    [[e(s["stage"]), e(s["result"]), _f(s["seconds"], "{:.1f}")]
                     for s in summary["stages"]]),
             f"<h2>Tuned config <code>{e(tuned['config_hash'])}</code></h2>",
             _table(["field", "value"], [[e(k), e(str(v))] for k, v in tuned["changed"].items()]
                    or [["(same as the default)", ""]]),
             f"<h2>Holdout: tuned vs default ({e(hold['split'])}, n = {hold['n']})</h2>",
             f"<p>Δ reward (continuous part) {hold['delta']:+.4f}, 95% CI "
             f"[{hold['ci_low']:+.4f}, {hold['ci_high']:+.4f}] (paired bootstrap over "
             f"queries). Gates: tuned {e(hold['gates']['tuned'])}; default "
             f"{e(hold['gates']['default'])}.</p>"]
    for kind in ("quality", "cost"):
        rows = [r for r in hold["rows"] if r["kind"] == kind]
        parts.append(f"<h3>{kind}</h3>" + _table(
            ["metric", "default", "tuned", "Δ", "95% CI"],
            [[e(r["metric"]), _f(r["default"]), _f(r["tuned"]), _f(r["delta"], "{:+.4f}"),
              "—" if not math.isfinite(r["ci_low"])
              else f"[{r['ci_low']:+.4f}, {r['ci_high']:+.4f}]"] for r in rows]))
    router = summary.get("router")
    if router:
        by = {(r["system"], r["metric"]): r for r in router["rows"]}
        parts.append(
            f"<h2>Per-query router ({len(router['arms'])} configs; verdict: "
            f"{e(router['verdict'])})</h2><p>Chosen by cross-validation over the valid split "
            f"(two halves of it as train and valid), read once on the holdout; policy "
            f"directory "
            f"<code>{e(router['out'])}</code>.</p>" + _table(
                ["comparison", "Δ reward [95% CI]", "Δ quality [95% CI]", "Δ tokens %"],
                [[e(f"router - {o}")] + [
                    f"{_f(d['value'], '{:+.4f}')} [{_f(d['ci_low'], '{:+.4f}')}, "
                    f"{_f(d['ci_high'], '{:+.4f}')}]"
                    for d in (by[(f"supervised-router - {o}", m)]
                              for m in ("delta_reward", "delta_quality"))]
                 + [_f(by[(f"supervised-router - {o}", "delta_cost_pct")]["value"], "{:+.1f}")]
                 for o in router["systems"][1:]]))
    parts.append("<h2>Plots</h2>")
    parts += [f'<figure><img alt="{e(name)}" src="{data_uri(p)}"><figcaption>{e(name)}'
              "</figcaption></figure>" for name, p in plots.items()]
    judged = [(stage, j) for stage, ev in (promo.get("statistic") or {}).items()
              for j in (ev or {}).get("metrics") or []]
    decided = {(j["stage"], j["metric"]) for j in promo.get("deciding_metrics") or []}
    parts += [f"<h2>Promotion: <span class={e(promo['decision'])}>{e(promo['decision'])}"
              f"</span> at {e(promo.get('last_stage', promo['stage']))}</h2>",
              f"<p>{e(promo['reason'])}</p>",
              "<h3>Deciding statistics, per stage and metric</h3>"
              "<p>Candidate − stable; always-valid confidence sequences (valid at every look); "
              "shadow compares the same requests answered by both configs (paired), the "
              "canaries served requests (latency is judged there); <b>deciding</b>: the "
              "judgement that decided the metric.</p>"
              + (_table(["stage", "metric", "verdict", "Δ", "confidence sequence", "margin",
                         "n", "critical", "deciding"],
                        [[e(stage), e(j["metric"]), e(j["verdict"]),
                          "—" if j["diff"] is None else _f(j["diff"], "{:+.4g}"),
                          f"[{_f(j['low'], '{:+.4g}') if j['low'] is not None else '-inf'}, "
                          f"{_f(j['high'], '{:+.4g}') if j['high'] is not None else 'inf'}]",
                          _f(j["margin"], "{:.4g}"),
                          f"{j['n']}{' pairs' if j['paired'] else ''}",
                          "yes" if j["critical"] else "",
                          "<b>deciding</b>" if (stage, j["metric"]) in decided else ""]
                         for stage, j in judged])
                 if judged else f"<p>{e(promo.get('deciding') or '')}</p>"),
              _table(["t (s)", "requests", "action", "from → to", "reason"],
                     [[_f(t["t_s"], "{:.1f}"), t["requests"], e(t["action"]),
                       e(f"{t['from']} → {t['to']}"), e(t["reason"])]
                      for t in promo["timeline"]]),
              "</body></html>"]
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("\n".join(parts), encoding="utf-8")
    return path
