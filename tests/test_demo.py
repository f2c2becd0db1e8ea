"""`ragpilot demo --fast` end to end (index -> tune -> holdout -> Serve -> simulated users ->
promotion -> summary) in a subprocess, as `make demo` runs it: Ray and Serve live and die with
that process. It runs in a private network namespace where permitted (`--private-netns`: Serve
replicas open gRPC ports on every interface), HTTP bound to 127.0.0.1 either way. The demo
world's tuned config is better on the objective, so its rollout must reach `full` with each
metric's deciding statistic in summary.json and report.html.
One test: it needs ~3 GB and a few minutes on 2 cores."""

from __future__ import annotations

import base64
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


@pytest.mark.ray
@pytest.mark.slow
def test_fast_demo_runs_the_loop_and_writes_summary_and_report(tmp_path):
    from serving.netns import free_port

    out = tmp_path / "demo"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(
        [str(REPO / "src"), str(REPO), os.environ.get("PYTHONPATH", "")]),
        "MLFLOW_TRACKING_URI": ""}
    env.pop("MLFLOW_TRACKING_URI")
    port = free_port()
    # --cold-start: with the default as the searcher's first trial, a short search under load
    # can keep the default, and the demo then (rightly) skips serve and promotion; a cold start
    # makes the tuned config differ from the default, so the whole loop runs every time
    proc = subprocess.run([sys.executable, "-m", "serving.cli", "demo", "--fast", "--out",
                           str(out), "--port", str(port), "--private-netns", "--cold-start"],
                          cwd=tmp_path, env=env, capture_output=True, text=True, timeout=900)
    log = proc.stdout + proc.stderr
    assert proc.returncode == 0, log[-6000:]
    for i, stage in enumerate(("index", "tune", "holdout", "serve", "promotion", "summary"), 1):
        assert f"[{i}/6] {stage}" in log, stage
    assert f"http://127.0.0.1:{port}/metrics" in log and "mlflow ui --backend-store-uri" in log
    assert "Serve and Ray stopped" in log

    s = json.loads((out / "summary.json").read_text())
    assert [x["stage"] for x in s["stages"]] == ["index", "tune", "holdout", "router", "serve",
                                                 "promotion", "summary"]
    router = s["router"]  # the per-query router against the tuned config, on the same holdout
    assert router["systems"][-1] in router["arms"] and (out / "policy" / "policy.json").exists()
    g = next(r for r in router["rows"] if r["metric"] == "delta_reward"
             and r["system"] == f"supervised-router - {router['systems'][-1]}")
    assert g["ci_low"] <= g["value"] <= g["ci_high"] and g["n"] == s["holdout_delta"]["n"]
    tuned = s["tuned_config"]
    assert re.fullmatch(r"[0-9a-f]{12}", tuned["config_hash"]) and tuned["config"]
    h = s["holdout_delta"]
    assert h["ci_low"] <= h["delta"] <= h["ci_high"] and h["n"] > 0
    assert {r["kind"] for r in h["rows"]} == {"quality", "cost"}
    page = (out / "report.html").read_text()
    srcs = re.findall(r'<img[^>]*\ssrc="([^"]*)"', page)
    assert len(srcs) >= 3 and len(srcs) == page.count("<img")
    for src in srcs:  # every image inline: a data URI that decodes as a PNG
        assert src.startswith("data:image/png;base64,"), src[:60]
        assert base64.b64decode(src.split(",", 1)[1], validate=True).startswith(PNG_MAGIC)
    assert "Promotion" in page and h["split"] in page

    p = s["promotion"]
    assert p["statistic"] and p["deciding"] and p["reason"]
    audit = (out / "rollout" / "audit.jsonl").read_text().splitlines()
    assert json.loads(audit[-1])["to"] == p["stage"]  # the state machine's own record agrees
    if p["timeline"][0]["action"] != "advance":
        # a short cold-started search can pick a config whose holdout reward CI reaches below
        # 0: not better offline, so it never gets traffic (rolled back at candidate, saying so)
        assert (p["decision"], p["last_stage"]) == ("rolled_back", "candidate")
        assert "offline" in p["reason"] and p["requests"] == 0
        return
    # better offline: the rollout must reach full within the fast budget (300 requests)
    assert (p["decision"], p["stage"]) == ("promoted", "full"), (p["reason"], p["timeline"])
    assert [t["to"] for t in p["timeline"] if t["to"] != t["from"]] == [
        "shadow", "canary_5", "canary_25", "full"]
    # shadow judged quality and tokens on mirrored requests (paired), each with its
    # always-valid confidence sequence; the candidate was better on the objective there
    shadow = {j["metric"]: j for j in p["statistic"]["shadow"]["metrics"]}
    assert shadow["quality"]["paired"] and shadow["quality"]["verdict"] in (
        "better", "non_inferior")
    assert shadow["tokens"]["low"] <= shadow["tokens"]["diff"] <= shadow["tokens"]["high"]
    assert "better" in (shadow["quality"]["verdict"], shadow["tokens"]["verdict"])
    assert "latency_ms" not in shadow  # judged on served requests, not mirrored ones
    # each metric's deciding statistic: quality and the gain from shadow, latency from the
    # canaries' served requests (not shown worse), every one inside summary and report
    deciding = {j["metric"]: j for j in p["deciding_metrics"]}
    assert deciding["quality"]["stage"] == "shadow"
    assert deciding["latency_ms"]["stage"] in ("canary_5", "canary_25")
    assert not deciding["latency_ms"]["paired"] and deciding["latency_ms"]["verdict"] != "worse"
    assert "Deciding statistics, per stage and metric" in page
    for j in deciding.values():
        assert f"[{j['stage']}] {j['statistic']}" in p["deciding"]
    assert page.count("<b>deciding</b></td>") == len(deciding)
    assert 0 < p["requests"] <= s["budget"]["max_requests"]
