"""Dashboards and Prometheus rules only name metrics the code exports; the rules pass promtool.

The exported names come from the prometheus_client registries the code defines
(serving.metrics.ServeMetrics, rl.tuner.prometheus.TunerMetrics), expanded by metric type the way the text
exposition writes them (counter -> NAME_total, histogram -> NAME_bucket/_sum/_count, gauge ->
NAME), so `ragpilot_requests` (a counter without `_total`) or `ragpilot_inflight_total` (a
gauge) are caught, not only unknown names. promtool runs when installed; under CI=true it must
be (Debian's `prometheus` package, installed by .ci/run).
"""

from __future__ import annotations

import importlib.util
import json
import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parents[2]
DASH = REPO / "dashboards"
PROM = REPO / "deploy" / "prometheus"
RULES = PROM / "rules" / "ragpilot.rules.yml"
BUILTIN = {"up", "scrape_duration_seconds", "scrape_samples_scraped"}
KEYWORDS = {"and", "or", "unless", "by", "without", "on", "ignoring", "group_left",
            "group_right", "bool", "offset", "inf", "nan", "atan2"}
SUFFIXES = {"counter": ("_total", "_created"), "gauge": ("",),
            "histogram": ("_bucket", "_sum", "_count", "_created"),
            "summary": ("", "_sum", "_count", "_created"), "info": ("_info",)}


def exported_names() -> set[str]:
    """Every sample name the code's registries can expose (label-free, by metric type)."""
    from rl.tuner.prometheus import TunerMetrics
    from serving.metrics import ServeMetrics

    names: set[str] = set()
    for registry in (ServeMetrics().registry, TunerMetrics(episode_length=4).registry):
        for family in registry.collect():
            names |= {family.name + s for s in SUFFIXES[family.type]}
    return names


def recorded_names() -> set[str]:
    groups = yaml.safe_load(RULES.read_text())["groups"]
    return {r["record"] for g in groups for r in g["rules"] if "record" in r}


def metric_names(expr: str) -> set[str]:
    """Metric names a PromQL expression selects (functions, keywords, label names, durations
    and Grafana variables removed)."""
    s = re.sub(r'"(?:[^"\\]|\\.)*"|\'(?:[^\'\\]|\\.)*\'', '""', expr)
    s = re.sub(r"\$\{[^}]*\}|\$\w+", "", s)
    s = re.sub(r"\{[^}]*\}", " ", s)
    s = re.sub(r"\[[^\]]*\]", " ", s)
    s = re.sub(r"\b(by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)", " ", s)
    out = set()
    for m in re.finditer(r"(?<![\w.:])([a-zA-Z_:][a-zA-Z0-9_:]*)(?![\w:])(?!\s*\()", s):
        name = m.group(1)
        if name.lower() not in KEYWORDS:
            out.add(name)
    return out


def dashboard_exprs() -> dict[str, list[str]]:
    out = {}
    for path in sorted(DASH.glob("*.json")):
        d = json.loads(path.read_text())
        panels = [p for top in d["panels"] for p in [top, *top.get("panels", [])]]
        out[path.name] = [t["expr"] for p in panels for t in p.get("targets", [])]
    return out


def rule_exprs() -> list[str]:
    return [r["expr"] for g in yaml.safe_load(RULES.read_text())["groups"] for r in g["rules"]]


def unknown(exprs: list[str], allowed: set[str]) -> list[tuple[str, str]]:
    return [(name, e) for e in exprs for name in sorted(metric_names(e)) if name not in allowed]


def test_metric_name_extraction() -> None:
    e = ('histogram_quantile(0.95, sum by (le, route) (rate(ragpilot_x_bucket{le="2.5", '
         'route=~"a|b"}[$__rate_interval]))) / ignoring (variant) group_left '
         'sum(ragpilot_y offset 5m) > bool 1e3 and on (config) (z == 1)')
    assert metric_names(e) == {"ragpilot_x_bucket", "ragpilot_y", "z"}
    assert metric_names('up{job="ragpilot-serve"} == 0') == {"up"}


def test_checker_catches_wrong_suffixes_and_unknown_names() -> None:
    allowed = exported_names()
    assert {"ragpilot_requests_total", "ragpilot_request_latency_seconds_bucket",
            "ragpilot_inflight", "ragpilot_tuner_steps_total",
            "ragpilot_tuner_episode_reward"} <= allowed
    bad = ["rate(ragpilot_requests[5m])", "ragpilot_inflight_total",
           "rate(ragpilot_request_latency_seconds[5m])", "ragpilot_gate_status_bucket",
           "ragpilot_no_such_metric"]
    assert [n for n, _ in unknown(bad, allowed)] == [
        "ragpilot_requests", "ragpilot_inflight_total", "ragpilot_request_latency_seconds",
        "ragpilot_gate_status_bucket", "ragpilot_no_such_metric"]


def test_every_dashboard_expr_names_an_exported_metric() -> None:
    allowed = exported_names() | recorded_names() | BUILTIN
    exprs = dashboard_exprs()
    assert set(exprs) == {"policy-performance.json", "quality-vs-cost.json",
                          "variant-breakdown.json", "latency.json"}
    used: set[str] = set()
    for name, es in exprs.items():
        assert es, name
        assert unknown(es, allowed) == [], name
        used |= {n for e in es for n in metric_names(e)}
    # the panels the issue asks for read the series they should
    assert {"ragpilot_tuner_episode_reward", "ragpilot_tuner_gate_breaches_total",
            "ragpilot_tuner_config_quality", "ragpilot_tuner_config_pareto",
            "ragpilot_tuner_steps_total", "ragpilot_tuner_reward_sum",
            "ragpilot_request_latency_seconds_bucket", "ragpilot_routed_total"} <= used


def test_every_rule_expr_names_an_exported_metric() -> None:
    allowed = exported_names() | recorded_names() | BUILTIN
    exprs = rule_exprs()
    assert len(exprs) >= 10
    assert unknown(exprs, allowed) == []


def test_dashboards_are_provisioning_ready() -> None:
    spec = importlib.util.spec_from_file_location("dash_gen", DASH / "generate.py")
    gen = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(gen)
    uids = set()
    for name, fn in gen.DASHBOARDS.items():
        on_disk = json.loads((DASH / name).read_text())
        assert on_disk == json.loads(json.dumps(fn())), f"{name} is stale: run generate.py"
        assert on_disk["uid"] not in uids and len(on_disk["uid"]) <= 40
        uids.add(on_disk["uid"])
        assert [v["type"] for v in on_disk["templating"]["list"]] == ["datasource"]
        ids = [p["id"] for p in on_disk["panels"]]
        assert len(ids) == len(set(ids))
        for p in on_disk["panels"]:
            g = p["gridPos"]
            assert g["x"] + g["w"] <= 24 and g["h"] > 0, (name, p["title"])
            assert p["datasource"]["uid"] == "${datasource}"
            refs = [t["refId"] for t in p["targets"]]
            assert len(refs) == len(set(refs)), (name, p["title"])
    qc = json.loads((DASH / "quality-vs-cost.json").read_text())
    xy = [p for p in qc["panels"] if p["type"] == "xychart"]
    frontier = next(p for p in xy if "Pareto" in p["title"])
    renamed = frontier["transformations"][1]["options"]["renameByName"]
    fields = {m for s in frontier["options"]["series"] for m in
              (s["x"]["matcher"]["options"], s["y"]["matcher"]["options"])}
    assert fields <= set(renamed.values())  # every axis reads a column the join produces
    assert [s["name"] for s in frontier["options"]["series"]] == ["configs", "Pareto frontier"]
    lat = json.loads((DASH / "latency.json").read_text())["panels"][0]
    assert {t["legendFormat"] for t in lat["targets"]} == {
        "stable p50", "stable p95", "canary p50", "canary p95"}
    assert all(t["expr"].startswith("histogram_quantile(") for t in lat["targets"])
    prov = yaml.safe_load((DASH / "provisioning" / "dashboards.yaml").read_text())
    assert prov["providers"][0]["type"] == "file" and prov["providers"][0]["options"]["path"]
    ds = yaml.safe_load((DASH / "provisioning" / "datasources.yaml").read_text())
    assert ds["datasources"][0]["type"] == "prometheus"


def _promtool() -> str:
    exe = shutil.which("promtool")
    if exe is None:
        if os.environ.get("CI") == "true":
            pytest.fail("promtool not installed (CI): .ci/run installs Debian's prometheus")
        pytest.skip("promtool not installed (apt-get install prometheus)")
    return exe


def test_promtool_checks_rules_and_config() -> None:
    exe = _promtool()
    for args in (["check", "rules", str(RULES)], ["check", "config", str(PROM / "prometheus.yml")]):
        r = subprocess.run([exe, *args], capture_output=True, text=True, timeout=60)
        assert r.returncode == 0, r.stdout + r.stderr
        assert "SUCCESS" in r.stdout + r.stderr


def test_promtool_rule_unit_tests_fire_the_alerts() -> None:
    """deploy/prometheus/rules/ragpilot.rules.test.yml: fast/slow burn on a slow canary only,
    silence on a healthy stable, error ratio, gate breach, scrape down, tuner breaches."""
    exe = _promtool()
    r = subprocess.run([exe, "test", "rules", "ragpilot.rules.test.yml"], cwd=RULES.parent,
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "SUCCESS" in r.stdout + r.stderr
