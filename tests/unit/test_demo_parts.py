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


def test_deciding_text_names_the_statistic():
    from serving.demo.live import deciding_text

    look = {"look": 1, "n": 12, "diff": 0.2, "se": 0.08, "z": 2.5, "boundary": 1.64,
            "harm_boundary": -1.64}
    assert "z = 2.50 vs efficacy boundary 1.64" in deciding_text({"last_look": look})
    assert "z = 2.50" in deciding_text(look)  # a rollback's evidence is the look itself
    off = {"diff": -0.03, "ci_low": -0.05, "ci_high": -0.01, "ci": 0.95, "n": 120}
    assert "CI [-0.0500, -0.0100]" in deciding_text({"offline": off})


def test_canary_sizing_is_the_smallest_unpaired_canary_with_the_asked_power():
    """The demo's rollback line: from the last look (n candidate requests, se of Δ at a 5%
    split) the per-request sd, then the candidate requests whose unpaired one-sided test
    detects the offline gain with 80% power, checked here against the power formula."""
    from scipy.stats import norm

    from serving.demo.live import canary_sizing, sizing_text

    stat = {"last_look": {"look": 1, "n": 11, "diff": -0.037, "se": 0.120, "z": -0.3}}
    z = canary_sizing(stat, 0.0157, 5.0, alpha=0.05)
    ratio = 1 + 5 / 95
    sd = 0.120 * math.sqrt(11 / ratio)
    assert z["sd"] == pytest.approx(sd)

    def power(n_c):  # unpaired: the stable arm has 19 requests for each candidate request
        return norm.cdf(0.0157 / (sd * math.sqrt(ratio / n_c)) - norm.ppf(0.95))

    n = z["candidate_requests"]
    assert power(n) >= 0.8 > power(n - 2) and 3000 < n < 5000
    assert z["total_requests"] == math.ceil(n * 20)
    assert f"~{n:,} canary requests" in sizing_text(z) and "this canary had 11" in sizing_text(z)
    # nothing to size without a look or without a gain
    assert canary_sizing({}, 0.0157, 5.0) is None and canary_sizing(stat, -0.01, 5.0) is None


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


def test_request_rewards_are_the_tuners_per_query_reward(tmp_path):
    """Each exported row gets the tuner's per-query reward; R is the user's rating only when
    asked (canary) and the row has one, the gold metric otherwise (shadow pairs)."""
    import json

    from rl.kernel.reward import RewardSpec
    from rl.kernel.settings import TunerSettings
    from serving.demo.live import REWARD_KEY, add_request_rewards

    s = TunerSettings.defaults()
    spec = RewardSpec.from_settings(s, s.thresholds_for("synthetic"))
    rows = [{"id": "a", "variant_id": "x", "reward": 1.0, "tokens_in": 100, "tokens_out": 10,
             "latency_ms": {"pipeline": 50.0, "retrieve": 20.0},
             "scores": {"support": 1.0, "f1": 0.2}},
            {"id": "b", "variant_id": "x", "reward": None, "tokens_in": 0, "tokens_out": 0,
             "latency_ms": {}, "scores": None}]
    path = tmp_path / "rows.jsonl"
    for use_feedback, rel in ((True, 1.0), (False, 0.2)):
        path.write_text("".join(json.dumps(r) + "\n" for r in rows))
        add_request_rewards(path, spec, "support", "f1", use_feedback)
        got = [json.loads(x) for x in path.read_text().splitlines()]
        want = float(spec.per_query([1.0], [rel], [50.0], [110])[0])
        assert got[0]["scores"][REWARD_KEY] == pytest.approx(want)
        assert got[1]["scores"] is None  # no gold scores: no reward, the row is skipped later


def _offline(ci_low: float, ci_high: float):
    from rl.promotion.evaluators import ArmSummary, EvaluationReport

    arm = ArmSummary(n=120, reward=0.7, reward_sd=0.1, p95_latency_ms=100.0, errors=0, slow=0)
    return EvaluationReport("offline", True, arm, arm, (ci_low + ci_high) / 2, 0.01, ci_low,
                            ci_high, {"faithfulness": True}, 0.9)


@pytest.mark.parametrize(("ci", "stage", "why"), [
    ((-0.01, 0.03), "candidate", "demo over at candidate"),  # waits for evidence: demo ends it
    ((-0.05, -0.01), "candidate", "significantly worse"),    # the state machine rolls back
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
