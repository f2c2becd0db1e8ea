"""Writes the Grafana dashboards of dashboards/*.json (provisioning-ready, Grafana >= 10).

    .venv/bin/python dashboards/generate.py      # rewrite the JSON files from this source

Edit the panels here, not the JSON: tests/unit/test_dashboards.py checks every PromQL expression
in the JSON against the metrics the code exports (serving.metrics.ServeMetrics, rl.tuner.prometheus.TunerMetrics)
and the recording rules of deploy/prometheus/rules/. Every panel reads the data source variable
`${datasource}` (a Prometheus data source; dashboards/provisioning/datasources.yaml provides one
with uid `prometheus`).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
DS = {"type": "prometheus", "uid": "${datasource}"}
RATE = "$__rate_interval"


def target(expr: str, legend: str = "", ref: str = "A", instant: bool = False,
           table: bool = False) -> dict[str, Any]:
    t: dict[str, Any] = {"refId": ref, "datasource": DS, "expr": expr, "legendFormat": legend,
                         "range": not instant, "instant": instant}
    if table:
        t["format"] = "table"
    return t


def panel(kind: str, title: str, targets: list[dict[str, Any]], x: int, y: int, w: int = 12,
          h: int = 8, unit: str = "none", description: str = "", **extra: Any) -> dict[str, Any]:
    p = {"type": kind, "title": title, "description": description, "datasource": DS,
         "gridPos": {"x": x, "y": y, "w": w, "h": h}, "targets": targets,
         "fieldConfig": {"defaults": {"unit": unit}, "overrides": []}, "options": {}}
    p.update(extra)
    return p


def dashboard(uid: str, title: str, description: str, panels: list[dict[str, Any]],
              time_from: str = "now-6h") -> dict[str, Any]:
    for i, p in enumerate(panels, start=1):
        p["id"] = i
    return {
        "uid": uid, "title": title, "description": description, "tags": ["ragpilot"],
        "schemaVersion": 39, "version": 1, "editable": True, "graphTooltip": 1,
        "time": {"from": time_from, "to": "now"}, "refresh": "30s", "timezone": "utc",
        "templating": {"list": [{"type": "datasource", "name": "datasource",
                                 "label": "Prometheus", "query": "prometheus",
                                 "current": {}, "hide": 0}]},
        "annotations": {"list": []}, "links": [], "panels": panels,
    }


# ---- policy performance ------------------------------------------------------------------------
def policy() -> dict[str, Any]:
    return dashboard("ragpilot-policy", "ragpilot / policy performance",
                     "Tuner episodes (job ragpilot-tuner) and the served policy's online reward",
                     [
        panel("timeseries", "Reward per episode and moving average", [
            target("ragpilot_tuner_episode_reward", "episode reward"),
            target("ragpilot_tuner_episode_reward_ma", "mean of last 10 episodes (exporter)",
                   "B"),
            target("avg_over_time(ragpilot_tuner_episode_reward[30m])", "30 min average", "C"),
        ], 0, 0, description="Mean step reward of each completed tuner episode; the exporter's "
                             "moving average over the last 10 episodes and a 30-minute "
                             "PromQL average."),
        panel("stat", "Episodes completed", [
            target("sum(ragpilot_tuner_episodes_total)", "episodes", instant=True),
        ], 12, 0, w=6),
        panel("stat", "Gate breaches per tuner step (1 h)", [
            target("sum(increase(ragpilot_tuner_gate_breaches_total[1h])) / "
                   "clamp_min(sum(increase(ragpilot_tuner_steps_total[1h])), 1)",
                   "breaches / step", instant=True),
        ], 18, 0, w=6, unit="percentunit"),
        panel("timeseries", "Tuner gate breaches by gate", [
            target(f"sum by (gate) (increase(ragpilot_tuner_gate_breaches_total[{RATE}]))",
                   "{{gate}}"),
        ], 0, 8, description="Steps whose batch failed a hard gate (faithfulness, relevancy, "
                             "p95 latency)."),
        panel("state-timeline", "Serving gate verdicts (1 pass, 0 fail)", [
            target("min by (variant, gate) (ragpilot_gate_status)", "{{variant}} {{gate}}"),
        ], 12, 8, description="Latest /tuner/evaluate verdict per deployed variant and gate."),
        panel("timeseries", "Online reward by variant (feedback)", [
            target("sum by (variant) (rate(ragpilot_feedback_reward_sum[15m])) / "
                   "sum by (variant) (rate(ragpilot_feedback_reward_count[15m]))",
                   "{{variant}}"),
        ], 0, 16),
        panel("timeseries", "Canary minus stable", [
            target('avg(ragpilot_canary_delta{metric="reward"})', "reward"),
            target('avg(ragpilot_canary_delta{metric="f1"})', "gold F1", "B"),
        ], 12, 16, description="Running means of canary minus stable (see also the latency "
                               "dashboard for the latency delta)."),
    ])


# ---- quality vs cost ---------------------------------------------------------------------------
def _xy(title: str, x_field: str, y_field: str, frontier: bool, x: int, y: int,
        targets: list[dict[str, Any]], description: str) -> dict[str, Any]:
    series = [{"name": "configs", "frame": {"matcher": {"id": "byIndex", "options": 0}},
               "x": {"matcher": {"id": "byName", "options": x_field}},
               "y": {"matcher": {"id": "byName", "options": y_field}}}]
    if frontier:
        series.append({"name": "Pareto frontier",
                       "frame": {"matcher": {"id": "byIndex", "options": 0}},
                       "x": {"matcher": {"id": "byName", "options": x_field}},
                       "y": {"matcher": {"id": "byName", "options": y_field}}})
    p = panel("xychart", title, targets, x, y, h=12, description=description)
    p["options"] = {"mapping": "manual", "series": series,
                    "legend": {"showLegend": True, "displayMode": "list", "placement": "bottom"},
                    "tooltip": {"mode": "single"}}
    p["fieldConfig"]["defaults"]["custom"] = {"show": "points", "pointSize": {"fixed": 7}}
    return p


def _join(by: str) -> list[dict[str, Any]]:
    return [{"id": "joinByField", "options": {"byField": by, "mode": "outer"}},
            {"id": "organize", "options": {"renameByName": {}}}]


def quality_cost() -> dict[str, Any]:
    cfg_q, cfg_c = "ragpilot_tuner_config_quality", "ragpilot_tuner_config_cost_tokens"
    front = "ragpilot_tuner_config_pareto == 1"
    tuner = _xy("Tuner configs: quality vs cost (tokens/query), Pareto frontier",
                "cost (tokens/query)", "quality (αF+βR)", True, 0, 0, [
                    target(f"max by (config) ({cfg_c})", "", "A", instant=True, table=True),
                    target(f"max by (config) ({cfg_q})", "", "B", instant=True, table=True),
                    target(f"max by (config) ({cfg_c} and on (config) ({front}))", "", "C",
                           instant=True, table=True),
                    target(f"max by (config) ({cfg_q} and on (config) ({front}))", "", "D",
                           instant=True, table=True),
                ], "One point per config the tuner evaluated (mean over its steps); the "
                   "second series is the non-dominated set (higher quality, lower cost).")
    # one frame (outer join on config): the frontier columns are empty off the frontier, so
    # the second series plots only the non-dominated configs
    tuner["transformations"] = _join("config")
    tuner["transformations"][1]["options"]["renameByName"] = {
        "Value #A": "cost (tokens/query)", "Value #B": "quality (αF+βR)",
        "Value #C": "frontier cost", "Value #D": "frontier quality"}
    tuner["options"]["series"][1]["x"]["matcher"]["options"] = "frontier cost"
    tuner["options"]["series"][1]["y"]["matcher"]["options"] = "frontier quality"
    latency = _xy("Tuner configs: quality vs p95 latency", "p95 latency (s)", "quality (αF+βR)",
                  False, 12, 0, [
                      target("max by (config) (ragpilot_tuner_config_p95_latency_seconds)", "",
                             "A", instant=True, table=True),
                      target(f"max by (config) ({cfg_q})", "", "B", instant=True, table=True),
                  ], "Mean batch p95 latency of each config against its quality.")
    latency["transformations"] = _join("config")
    latency["transformations"][1]["options"]["renameByName"] = {
        "Value #A": "p95 latency (s)", "Value #B": "quality (αF+βR)"}
    served = _xy("Served variants: gold F1 vs tokens per answer", "tokens / answer", "gold F1",
                 False, 0, 12, [
                     target("sum by (variant) (increase(ragpilot_tokens_total[1h])) / "
                            "sum by (variant) (increase(ragpilot_routed_total[1h]))", "", "A",
                            instant=True, table=True),
                     target("sum by (variant) (increase(ragpilot_gold_f1_sum[1h])) / "
                            "sum by (variant) (increase(ragpilot_gold_f1_count[1h]))", "", "B",
                            instant=True, table=True),
                 ], "Last hour of live traffic, questions with a known gold answer only.")
    served["transformations"] = _join("variant")
    served["transformations"][1]["options"]["renameByName"] = {
        "Value #A": "tokens / answer", "Value #B": "gold F1"}
    table = panel("table", "Pareto-optimal configs", [
        target(f"max by (config, variant) ({cfg_q} and on (config) ({front}))", "", "A",
               instant=True, table=True),
        target(f"max by (config, variant) ({cfg_c} and on (config) ({front}))", "", "B",
               instant=True, table=True),
    ], 12, 12, h=12)
    table["transformations"] = _join("config")
    table["transformations"][1]["options"]["renameByName"] = {
        "Value #A": "quality", "Value #B": "tokens/query"}
    return dashboard("ragpilot-quality-cost", "ragpilot / quality vs cost",
                     "Quality against cost of every evaluated config, with the Pareto frontier",
                     [tuner, latency, served, table], time_from="now-24h")


# ---- variant breakdown -------------------------------------------------------------------------
def variants() -> dict[str, Any]:
    steps, rsum = "ragpilot_tuner_steps_total", "ragpilot_tuner_reward_sum"
    return dashboard("ragpilot-variants", "ragpilot / variant breakdown",
                     "Which candidate sources the tuner and the router choose, and what they "
                     "return", [
        panel("piechart", "Tuner: share of actions by variant", [
            target(f"sum by (variant) (increase({steps}[$__range]))", "{{variant}}",
                   instant=True),
        ], 0, 0, w=8, options={"reduceOptions": {"calcs": ["lastNotNull"]},
                                "pieType": "donut", "displayLabels": ["percent"]}),
        panel("bargauge", "Tuner: mean reward given the variant", [
            target(f"sum by (variant) (delta({rsum}[$__range])) / "
                   f"sum by (variant) (increase({steps}[$__range]))", "{{variant}}",
                   instant=True),
        ], 8, 0, w=8, description="Conditional return E[reward | variant] over the range."),
        panel("timeseries", "Tuner: share of actions over time", [
            target(f"sum by (variant) (rate({steps}[15m])) / ignoring (variant) "
                   f"group_left sum(rate({steps}[15m]))", "{{variant}}"),
        ], 16, 0, w=8, unit="percentunit"),
        panel("timeseries", "Router: share of answers by variant and route", [
            target(f"sum by (variant, route) (rate(ragpilot_routed_total{{route!=\"shadow\"}}"
                   f"[{RATE}])) / ignoring (variant, route) group_left "
                   f"sum(rate(ragpilot_routed_total{{route!=\"shadow\"}}[{RATE}]))",
                   "{{variant}} ({{route}})"),
        ], 0, 8, unit="percentunit"),
        panel("timeseries", "Router: mean feedback reward given the variant", [
            target("sum by (variant) (rate(ragpilot_feedback_reward_sum[30m])) / "
                   "sum by (variant) (rate(ragpilot_feedback_reward_count[30m]))",
                   "{{variant}}"),
        ], 12, 8),
        panel("timeseries", "Configured traffic (%)", [
            target("max by (kind) (ragpilot_traffic_percent)", "{{kind}}"),
        ], 0, 16, unit="percent"),
        panel("timeseries", "Shadow minus served (paired)", [
            target('avg(ragpilot_shadow_delta{metric="f1"})', "gold F1"),
            target('avg(ragpilot_shadow_delta{metric="latency_ms"})', "latency (ms)", "B"),
        ], 12, 16),
    ])


# ---- latency -----------------------------------------------------------------------------------
def _q(quantile: float, route: str) -> str:
    return (f"histogram_quantile({quantile}, sum by (le) (rate("
            f"ragpilot_request_latency_seconds_bucket{{route=\"{route}\"}}[{RATE}])))")


def latency() -> dict[str, Any]:
    return dashboard("ragpilot-latency", "ragpilot / latency and errors",
                     "Ingress latency p50/p95 of canary against stable, stage latency, error "
                     "budget burn", [
        panel("timeseries", "/query latency p50 / p95: canary vs stable", [
            target(_q(0.5, "stable"), "stable p50"),
            target(_q(0.95, "stable"), "stable p95", "B"),
            target(_q(0.5, "canary"), "canary p50", "C"),
            target(_q(0.95, "canary"), "canary p95", "D"),
        ], 0, 0, w=24, unit="s", description="histogram_quantile over the ingress histogram "
                                             "ragpilot_request_latency_seconds by route."),
        panel("timeseries", "p95 latency by stage", [
            target(f"histogram_quantile(0.95, sum by (le, stage) (rate("
                   f"ragpilot_stage_latency_seconds_bucket[{RATE}])))", "{{stage}}"),
        ], 0, 8, unit="s"),
        panel("timeseries", "Canary minus stable mean latency (ms)", [
            target('avg(ragpilot_canary_delta{metric="latency_ms"})', "canary − stable"),
        ], 12, 8, unit="ms"),
        panel("timeseries", "Latency SLO burn rate (objective: 99% of answers <= 2.5 s)", [
            target("ragpilot:request_latency_slow_ratio:rate5m / 0.01", "5 min"),
            target("ragpilot:request_latency_slow_ratio:rate1h / 0.01", "1 h", "B"),
            target("ragpilot:request_latency_slow_ratio:rate6h / 0.01", "6 h", "C"),
        ], 0, 16, description="Recording rules of deploy/prometheus/rules/ragpilot.rules.yml; "
                              "the fast-burn alert fires at 14.4 (1 h and 5 min), the slow "
                              "one at 6 (6 h and 30 min)."),
        panel("timeseries", "Error ratio and rejections", [
            target("ragpilot:request_error_ratio:rate5m", "5xx / all (/query)"),
            target(f"sum by (reason) (rate(ragpilot_rejected_total[{RATE}]))",
                   "429 {{reason}} /s", "B"),
        ], 12, 16),
        panel("timeseries", "In flight and request rate", [
            target("sum(ragpilot_inflight)", "in flight"),
            target(f"sum by (endpoint) (rate(ragpilot_requests_total[{RATE}]))",
                   "{{endpoint}} /s", "B"),
        ], 0, 24, w=24),
    ])


DASHBOARDS = {"policy-performance.json": policy, "quality-vs-cost.json": quality_cost,
              "variant-breakdown.json": variants, "latency.json": latency}


def main() -> None:
    for name, fn in DASHBOARDS.items():
        (HERE / name).write_text(json.dumps(fn(), indent=2, ensure_ascii=False) + "\n")
        print(f"wrote dashboards/{name}")


if __name__ == "__main__":
    main()
