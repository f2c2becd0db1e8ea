"""The demo's pure parts, without Ray or models: a busy port names --port, the simulated user's
rating, the deciding-statistic line, simulated users refuse non-loopback URLs, and the HTML
report inlines every image as a PNG data URI."""

from __future__ import annotations

import base64
import math
import re
import socket

import pytest

from rag.errors import ConfigError


def test_busy_port_is_a_clear_error_naming_the_port():
    from serving.demo.live import check_port

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen(1)
        port = s.getsockname()[1]
        with pytest.raises(ConfigError) as exc:
            check_port(port)
    assert exc.value.field == "port" and str(port) in str(exc.value)
    assert "--port" in str(exc.value)


def test_busy_port_from_the_cli_names_the_flag(capsys):
    from serving.cli import main

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen(1)
        port = s.getsockname()[1]
        assert main(["demo", "--fast", "--port", str(port)]) == 2
    err = capsys.readouterr().err
    assert "--port" in err and str(port) in err


def test_feedback_is_thumbs_up_when_f1_reaches_half():
    from serving.demo.live import f1_feedback

    assert f1_feedback("Alice Smith", ["Alice Smith"]) == 1.0
    assert f1_feedback("Alice", ["Alice Smith"]) == 1.0  # F1 = 2/3
    assert f1_feedback("Bob Jones went home", ["Alice Smith"]) == 0.0
    assert f1_feedback("anything", []) == 0.0


def test_simulated_users_stay_on_loopback():
    from serving.demo.live import SimulatedUsers

    with pytest.raises(ConfigError) as exc:
        SimulatedUsers("http://10.0.0.1:8000", [object()])
    assert exc.value.field == "url"
    SimulatedUsers("http://127.0.0.1:8000", [object()])


def test_deciding_text_names_each_metrics_statistic():
    from rl.promotion.metrics import MetricStats, judge
    from rl.promotion.settings import PromotionSettings
    from serving.demo.live import deciding_text

    c = PromotionSettings()
    stats = {"quality": MetricStats.of_pairs([0.5] * 40, [0.5] * 40),
             "tokens": MetricStats.of_pairs([200.0 + i % 7 for i in range(40)],
                                            [160.0 + i % 5 for i in range(40)])}
    judged, decision, why = judge(c.metrics, stats, 0.05, 200, 30)
    text = deciding_text([j.to_dict() for j in judged])
    assert "quality: non_inferior, Δ +0" in text and "tokens: better, Δ -" in text
    assert "error_rate: unmeasured" in text and decision == "continue"  # errors are required
    off = {"diff": -0.03, "ci_low": -0.05, "ci_high": -0.01, "ci": 0.95, "n": 120}
    assert "CI [-0.0500, -0.0100]" in deciding_text(None, off)
    assert deciding_text(None) == ""


def test_each_metric_is_decided_where_it_was_judged():
    """Promoted: quality and the tokens gain from shadow (mirrored pairs), latency and errors
    from the last canary (served requests); rolled back: the vetoing stage's metrics."""
    from serving.demo.live import deciding_judgements, deciding_text

    def j(metric, verdict, paired, objective=False):
        return {"metric": metric, "verdict": verdict, "paired": paired, "objective": objective,
                "statistic": f"{metric}: {verdict}"}

    stat = {"candidate": {"offline": {"diff": 0.01}},
            "shadow": {"metrics": [j("quality", "non_inferior", True, True),
                                   j("tokens", "better", True, True),
                                   j("error_rate", "non_inferior", True)]},
            "canary_5": {"metrics": [j("tokens", "pending", False, True),
                                     j("latency_ms", "pending", False),
                                     j("feedback", "unmeasured", False)]},
            "canary_25": {"metrics": [j("tokens", "better", False, True),
                                      j("latency_ms", "non_inferior", False),
                                      j("error_rate", "non_inferior", False)]}}
    got = {x["metric"]: x["stage"] for x in deciding_judgements(stat)}
    assert got == {"quality": "shadow", "tokens": "shadow", "error_rate": "canary_25",
                   "latency_ms": "canary_25"}  # feedback was never measured
    assert "[canary_25] latency_ms: non_inferior" in deciding_text(deciding_judgements(stat))
    stat["canary_5"]["metrics"][1] = j("latency_ms", "worse", False)
    del stat["canary_25"]
    back = deciding_judgements(stat, rolled_back=True)
    assert [(x["stage"], x["metric"]) for x in back] == [("canary_5", "tokens"),
                                                          ("canary_5", "latency_ms")]
    assert deciding_judgements({"candidate": {"offline": {}}}) == []
    # the candidate stage's offline judgements admit a candidate to traffic; the live stages
    # decide a promotion, and the candidate stage only a rollout that ended there
    offline = {"metrics": [j("quality", "better", True, True), j("tokens", "better", True, True)]}
    stat = {"candidate": offline, "shadow": {"metrics": [j("quality", "better", True, True)]}}
    assert {x["metric"]: x["stage"] for x in deciding_judgements(stat)} == {"quality": "shadow"}
    assert [x["stage"] for x in deciding_judgements({"candidate": offline}, rolled_back=True)
            ] == ["candidate", "candidate"]


def test_report_is_self_contained(tmp_path):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from serving.demo.html import write_report

    png = tmp_path / "p.png"
    plt.plot([0, 1], [1, 0])
    plt.savefig(png)
    plt.close()
    nan = math.nan
    summary = {
        "seed": 0, "fast": True, "wall_s": 90.0,
        "stages": [{"stage": "index", "result": "300 passages", "seconds": 1.0}],
        "tuned_config": {"config_hash": "abc123abc123", "changed": {"k": 8}},
        "holdout_delta": {"split": "test", "n": 120, "delta": 0.02, "ci_low": 0.01,
                          "ci_high": 0.03, "gates": {"tuned": "pass", "default": "pass"},
                          "rows": [{"metric": "quality", "kind": "quality", "default": 0.8,
                                    "tuned": 0.82, "delta": 0.02, "ci_low": 0.0,
                                    "ci_high": 0.04},
                                   {"metric": "p95 latency ms", "kind": "cost",
                                    "default": 100.0, "tuned": 120.0, "delta": 20.0,
                                    "ci_low": nan, "ci_high": nan}]},
        "promotion": {"decision": "promoted", "stage": "full", "reason": "evidence suffices",
                      "deciding": "z = 2.5", "timeline": [
                          {"t_s": 1.0, "requests": 0, "action": "advance",
                           "from": "candidate", "to": "shadow", "reason": "offline CI > 0"}]}}
    page = write_report(tmp_path / "report.html", summary,
                        {"pareto": png, "curve <1>": png}).read_text()
    srcs = re.findall(r'<img[^>]*\ssrc="([^"]*)"', page)
    assert len(srcs) == 2 == page.count("<img")
    for src in srcs:
        assert base64.b64decode(src.removeprefix("data:image/png;base64,")).startswith(
            b"\x89PNG")
    assert "curve &lt;1&gt;" in page and "candidate → shadow" in page and "—" in page
    summary["promotion"]["statistic"] = {"shadow": {"metrics": [
        {"metric": "tokens", "verdict": "better", "diff": -38.4, "low": -40.1, "high": -36.7,
         "margin": 8.2, "n": 40, "paired": True, "critical": False}]}}
    summary["promotion"]["deciding_metrics"] = [
        {**summary["promotion"]["statistic"]["shadow"]["metrics"][0], "stage": "shadow"}]
    page = write_report(tmp_path / "report.html", summary, {}).read_text()
    assert "<td>better</td>" in page and "[-40.1, -36.7]" in page and "40 pairs" in page
    assert page.count("<b>deciding</b></td>") == 1


def _offline(quality: float, sd: float):
    """An offline report of 120 paired questions: quality Δ `quality` (noise sd `sd`)."""
    import numpy as np

    from rl.promotion.evaluators import ArmSummary, EvaluationReport
    from rl.promotion.metrics import MetricStats

    arm = ArmSummary(n=120, reward=0.7, reward_sd=0.1, p95_latency_ms=100.0, errors=0, slow=0)
    q = np.random.default_rng(0).uniform(0.4, 0.8, 120)
    noise = np.random.default_rng(1).normal(0.0, sd, 120)
    metrics = {"quality": MetricStats.of_pairs(q, q + quality + noise).to_dict()}
    return EvaluationReport("offline", True, arm, arm, 0.01, 0.01, -0.01, 0.03,
                            {"faithfulness": True}, 0.9, metrics=metrics)


@pytest.mark.parametrize(("ci", "stage", "why"), [
    ((-0.01, 0.1), "candidate", "demo over at candidate"),  # waits for evidence: demo ends it
    ((-0.05, 0.05), "candidate", "worse than its margin"),  # the state machine rolls back
])
def test_promotion_loop_always_ends_with_a_decision(tmp_path, monkeypatch, ci, stage, why):
    """A rollout no more evidence can move is rolled back through rl.promotion (the audit log
    agrees), and the outcome names the deciding statistic."""
    import json
    from types import SimpleNamespace

    from rag.resources import default_config
    from rl.promotion import service
    from serving.demo.live import PromotionLoop

    applied = []
    monkeypatch.setattr(PromotionLoop, "_apply", lambda self: applied.append(self.sm.stage))
    loop = PromotionLoop(tmp_path / "rollout", "http://127.0.0.1:1", "key", tmp_path / "s.db",
                         SimpleNamespace(sent=0), service.settings(
                             default_config("rl/rollout.demo.yaml")))
    loop.start("a" * 12, "b" * 12, _offline(*ci))
    assert not loop.more_evidence(300)  # stage candidate takes offline reports only
    loop.finish()
    out = loop.outcome()
    assert out["decision"] == "rolled_back" and out["stage"] == "rolled_back"
    assert why in out["reason"] and "CI [" in out["deciding"]
    assert applied[-1] == "rolled_back"
    audit = (tmp_path / "rollout" / "audit.jsonl").read_text().splitlines()
    assert json.loads(audit[-1])["from"] == stage and json.loads(audit[-1])["to"] == \
        "rolled_back"
