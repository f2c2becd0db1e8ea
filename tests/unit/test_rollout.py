"""Evidence-gated rollout: evaluators, the promotion state machine, its audit log and the CLI."""

from __future__ import annotations

import json
import math
import time
from dataclasses import replace

import numpy as np
import pytest

from rag.errors import ConfigError
from rl.promotion import service
from rl.promotion.evaluators import (
    Arm,
    ArmSummary,
    CanaryEvaluator,
    EvaluationReport,
    OfflineEvaluator,
    ShadowEvaluator,
)
from rl.promotion.log_evaluators import arms_from_rows
from rl.promotion.metrics import MetricStats
from rl.promotion.state_machine import (
    DEFAULTS_PATH,
    PromotionSettings,
    PromotionStateMachine,
    read_audit,
    wilson_lower,
)
from serving.cli import main as cli_main

SMALL = {"stages": {"shadow": {"min_n": 20, "max_n": 40},
                    "canary_5": {"min_n": 20, "max_n": 40},
                    "canary_25": {"min_n": 20, "max_n": 40}},
         "min_clean_batches": 2}


def cfg(**changes) -> PromotionSettings:
    return PromotionSettings.from_dict({**SMALL, **changes})


def fast():
    return {"thresholds": PromotionSettings().thresholds, "ci_method": "normal"}


def paired(delta: float, n: int = 20, seed: int = 0, lat: float = 100.0, errors: int = 0,
           tokens: float = 0.0):
    """Mirrored requests: the candidate's quality (and reward) is the stable's + `delta` +
    small noise, its tokens the stable's + `tokens`."""
    rng = np.random.default_rng(seed)
    base = rng.uniform(0.4, 0.8, n)
    cost = rng.uniform(150, 250, n)
    err = np.zeros(n, dtype=bool)
    err[:errors] = True
    cand = base + delta + rng.normal(0, 0.01, n)
    return (Arm(base, np.full(n, 100.0), np.zeros(n, dtype=bool), cost=cost, quality=base),
            Arm(cand, np.full(n, lat), err, cost=cost + tokens, quality=cand))


def offline_report(delta: float = 0.05) -> EvaluationReport:
    ev = ShadowEvaluator(**fast())
    object.__setattr__(ev, "kind", "offline")
    return ev.evaluate(*paired(delta, 50))


def shadow_report(delta: float, seed: int = 0, **kw) -> EvaluationReport:
    return ShadowEvaluator(**fast()).evaluate(*paired(delta, seed=seed, **kw))


def canary_report(tokens: float, seed: int = 0) -> EvaluationReport:
    """A live split: 60 stable, 20 candidate requests; the candidate's tokens differ by
    `tokens` per request."""
    rng = np.random.default_rng(seed)
    s = Arm(rng.normal(0.6, 0.05, 60), np.full(60, 100.0), np.zeros(60, dtype=bool),
            cost=rng.normal(200, 10, 60))
    c = Arm(rng.normal(0.6, 0.05, 20), np.full(20, 100.0), np.zeros(20, dtype=bool),
            cost=rng.normal(200 + tokens, 10, 20))
    return CanaryEvaluator(**fast()).evaluate(s, c)


# --------------------------------------------------------------------------- config


def test_documented_yaml_equals_code_defaults():
    assert PromotionSettings.from_yaml(DEFAULTS_PATH) == PromotionSettings()


def test_default_shadow_plan_detects_the_documented_effects():
    """configs/rl/rollout.yaml sizes shadow for a quality gain of +0.03 at paired sd 0.25 and a
    10% token cut at sd 0.2 of the mean: both need fewer pairs than its max_n (1,500)."""
    from rl.promotion.metrics import requests_needed

    c = PromotionSettings.from_yaml(DEFAULTS_PATH)
    need = requests_needed(c.metrics, {"quality": 0.03, "tokens": -20.0},
                           {"quality": 0.25, "tokens": 40.0}, {"tokens": 200.0}, c.alpha)
    assert 400 < need["quality"] <= c.stages.shadow.max_n
    assert need["tokens"] < 200
    assert need["latency_ms"] is None  # no effect given: no size


@pytest.mark.parametrize("data,field", [
    ({"stages": {"shadow": {"min_n": 2, "max_n": 40, "bogus": 1}}}, "rollout.stages.shadow.bogus"),
    ({"alpha": 0.7}, "rollout.alpha"),
    ({"slo": {"error_budget": 0}}, "rollout.slo.error_budget"),
    ({"metrics": {"quality": {"direction": "up"}}}, "rollout.metrics.quality.direction"),
])
def test_config_errors_name_the_key(data, field):
    with pytest.raises(ConfigError) as exc:
        PromotionSettings.from_dict(data)
    assert exc.value.field == field


# --------------------------------------------------------------------------- evaluators


def test_shadow_evaluator_paired_numbers_and_gates():
    s = Arm([0.5, 0.6, 0.7, 0.8], [100, 120, 140, 900], faithfulness=[0.9] * 4)
    c = Arm([0.6, 0.7, 0.7, 1.0], [100, 110, 130, 150], faithfulness=[0.5, 0.6, 0.7, 0.8])
    rep = ShadowEvaluator(ci_method="normal").evaluate(s, c)
    d = np.array([0.1, 0.1, 0.0, 0.2])
    assert rep.paired and rep.kind == "shadow" and rep.n == 4
    assert rep.diff == pytest.approx(d.mean())
    assert rep.diff_se == pytest.approx(d.std(ddof=1) / 2)
    assert rep.ci_low == pytest.approx(d.mean() - 1.959964 * d.std(ddof=1) / 2, abs=1e-5)
    assert rep.gates == {"faithfulness": False, "relevancy": None, "p95_latency_ms": True}
    assert not rep.gates_passed and rep.failed_gates == ["faithfulness"]
    assert rep.stable.p95_latency_ms > 500 and rep.candidate.slow == 0 and rep.stable.slow == 1
    boot = ShadowEvaluator(n_resamples=2000).evaluate(s, c)
    assert boot.ci_method == "bootstrap" and boot.ci_low <= boot.diff <= boot.ci_high
    with pytest.raises(ConfigError) as exc:
        ShadowEvaluator().evaluate(s, Arm([0.1, 0.2]))
    assert exc.value.field == "candidate.reward"
    with pytest.raises(ConfigError) as exc:
        ShadowEvaluator().evaluate(s, Arm([0.1, 0.2, 0.3, 0.4], latency_ms=[1, 2]))
    assert exc.value.field == "candidate.latency_ms"


def test_canary_evaluator_unpaired_welch_and_roundtrip():
    s, c = np.array([0.5, 0.6, 0.7, 0.4, 0.3]), np.array([0.8, 0.9, 0.7])
    rep = CanaryEvaluator(ci_method="normal").evaluate(Arm(s, error=[0, 0, 1, 0, 0]), Arm(c))
    se = math.sqrt(s.var(ddof=1) / 5 + c.var(ddof=1) / 3)
    assert not rep.paired and rep.diff == pytest.approx(c.mean() - s.mean())
    assert rep.diff_se == pytest.approx(se) and rep.stable.error_rate == pytest.approx(0.2)
    assert rep.candidate.errors is None and rep.gates_passed  # nothing measured, nothing fails
    back = EvaluationReport.from_dict(json.loads(json.dumps(rep.to_dict())))
    assert back == rep
    boot = CanaryEvaluator(n_resamples=2000).evaluate(Arm(s), Arm(c))
    assert boot.ci_low < boot.diff < boot.ci_high
    with pytest.raises(ConfigError) as exc:
        EvaluationReport.from_dict({**rep.to_dict(), "kind": "live"})
    assert exc.value.field == "report.kind"


def _row(i, variant, reward, p=0.5, shadow=False, parent=None, scores=None):
    return {"id": f"r{i}", "ts": time.time() + i, "variant_id": variant, "propensity": p,
            "reward": reward,
            "shadow": shadow, "parent_id": parent, "latency_ms": {"retrieve": 50, "generate": 50},
            "tokens_in": 10, "tokens_out": 5, "scores": scores}


def test_a_row_whose_signals_are_not_stored_yet_is_read_again_not_counted_as_none():
    """The Serve app appends a gold-less answer's signals after answering: a young row with no
    quality score holds the cursor (SIGNALS_WAIT_S), so the next read counts it with its
    signals, once; an old one is counted under none."""
    from rl.promotion.evidence import SIGNALS_WAIT_S, reports_from_rows

    sm = PromotionStateMachine.start(None, "C", "S", config=cfg(), code_commit="test")
    sm.state.stage = "canary_5"
    t0 = time.time()

    def rows(last_scores):
        return [{**_row(i, "SC"[i % 2], None, scores={"sig_combined": 0.5}), "ts": t0 + i}
                for i in range(1, 5)] + [{**_row(5, "C", None, scores=last_scores), "ts": t0 + 5}]

    first = reports_from_rows([("log", r) for r in rows(None)], sm, "log")
    assert first.reports[0].meta["quality_on"] == {"gold": 0, "sig_combined": 4, "none": 0}
    assert sm.state.row_cursor < t0 + 5  # r5 waits for its signals
    sm.observe(first.reports[0])
    later = rows({"sig_combined": 0.9}) + [{**_row(6, "S", None, scores={"sig_combined": 0.5}),
                                           "ts": t0 + 6}]
    again = reports_from_rows([("log", r) for r in later], sm, "log")
    assert again.reports[0].meta["quality_on"] == {"gold": 0, "sig_combined": 2, "none": 0}
    assert sm.state.row_cursor == t0 + 6
    # a row still unscored SIGNALS_WAIT_S after it is counted, under none
    sm2 = PromotionStateMachine.start(None, "C", "S", config=cfg(), code_commit="test")
    sm2.state.stage = "canary_5"
    late = rows(None) + [{**_row(6, "S", None, scores={"sig_combined": 0.5}),
                          "ts": t0 + 6 + SIGNALS_WAIT_S}]
    ev = reports_from_rows([("log", r) for r in late], sm2, "log")
    assert ev.reports[0].meta["quality_on"] == {"gold": 0, "sig_combined": 5, "none": 1}


def test_log_adapters_pair_shadow_rows():
    rows = [_row(1, "S", 0.5, scores={"support": 1.0, "f1": 0.5}),
            _row(2, "S", 0.7, scores={"support": 0.5}), _row(3, "S", None),
            _row(4, "C", None, 1.0, True, "r1", {"support": 1.0, "f1": 1.0}),
            _row(5, "C", None, 1.0, True, "r2", {"support": 0.25}),
            _row(6, "C", None, 1.0, True, "r3", None)]
    s, c, on = arms_from_rows(rows, "S", "C", "shadow")
    # every mirrored pair counts (r3 unscored: quality NaN, its tokens and latency still count)
    assert list(s.quality)[:2] == [0.75, 0.5] and math.isnan(s.quality[2])
    assert list(c.quality)[:2] == [1.0, 0.25] and list(c.cost) == [15.0] * 3
    assert on == {"gold": 2, "sig_combined": 0, "none": 1}  # r3's pair: excluded, counted
    assert np.all(np.isnan(c.feedback))  # users never see a mirrored answer
    rep = ShadowEvaluator(ci_method="normal").evaluate(s, c)
    assert rep.metrics["quality"]["n"] == 2 and rep.metrics["tokens"]["n"] == 3
    assert "feedback" not in rep.metrics


def test_quality_is_gold_where_both_rows_have_it_else_sig_combined_else_counted_out():
    """One rule per mirrored pair: the gold-based quality_scores when both rows have them,
    else sig_combined when both have it, else no quality (left out, counted); the stage's
    summary and the quality verdict say which signal decided and how many pairs had none."""
    from rl.promotion.evidence import reports_from_rows

    gold = {"support": 1.0, "f1": 0.5, "sig_combined": 0.9}
    rows = [_row(1, "S", None, scores=gold),
            _row(2, "C", None, 1.0, True, "r1", {"support": 0.5, "f1": 0.5,
                                                 "sig_combined": 0.1}),
            _row(3, "S", None, scores={"support": 1.0, "f1": 1.0, "sig_combined": 0.4}),
            _row(4, "C", None, 1.0, True, "r3", {"sig_combined": 0.7}),  # no gold: signal
            _row(5, "S", None, scores={"sig_combined": 0.2, "pii_leaks": 0.0}),
            _row(6, "C", None, 1.0, True, "r5", {"sig_combined": 0.6}),
            _row(7, "S", None, scores={"sig_combined": 0.3}),
            _row(8, "C", None, 1.0, True, "r7", {"pii_leaks": 0.0}),  # neither: excluded
            _row(9, "S", None), _row(10, "C", None, 1.0, True, "r9")]
    s, c, on = arms_from_rows(rows, "S", "C", "shadow")
    assert on == {"gold": 1, "sig_combined": 2, "none": 2}
    assert list(s.quality)[:3] == [0.75, 0.4, 0.2] and list(c.quality)[:3] == [0.5, 0.7, 0.6]
    assert all(math.isnan(x) for x in [*s.quality[3:], *c.quality[3:]])  # never a zero
    rep = ShadowEvaluator(ci_method="normal").evaluate(s, c, quality_on=on)
    assert rep.metrics["quality"]["n"] == 3 and rep.metrics["tokens"]["n"] == 5
    # canary: the same rule per request
    _, cand, on = arms_from_rows([_row(1, "S", None, scores={"sig_combined": 0.5}),
                                  _row(2, "C", None, scores={"f1": 1.0, "support": 1.0}),
                                  _row(3, "C", None)], "S", "C", "canary")
    assert on == {"gold": 1, "sig_combined": 1, "none": 1} and cand.quality[0] == 1.0
    # through the rollout: the report carries the counts, the stage sums and says them
    sm = PromotionStateMachine.start(None, "C", "S", config=cfg(), code_commit="test")
    sm.state.stage = "shadow"
    from rl.promotion.evidence import SIGNALS_WAIT_S

    gap = SIGNALS_WAIT_S + 1  # rows without quality older than the wait: counted under none
    for batch in range(2):
        fresh = [{**r, "id": f"{r['id']}b{batch}", "ts": time.time() + 100 * gap * batch + gap * i,
                  "parent_id": r["parent_id"] and f"{r['parent_id']}b{batch}"}
                 for i, r in enumerate(rows)]
        ev = reports_from_rows([(f"log:{i}", r) for i, r in enumerate(fresh)], sm, "log")
        assert ev.reports[0].meta["quality_on"] == {"gold": 1, "sig_combined": 2, "none": 2}
        sm.observe(ev.reports[0])
    summary = sm.summary()
    assert summary["quality_on"] == {"gold": 2, "sig_combined": 4, "none": 4}
    q = next(j for j in summary["metrics"] if j["metric"] == "quality")
    assert q["n"] == 6
    assert q["statistic"].endswith("judged on sig_combined (4), gold (2); 4 without a "
                                   "quality score (excluded)"), q["statistic"]
    # a client's report: counts must be whole, of a known source
    d = rep.to_dict()
    for bad, field in (({"gold": -1}, "report.meta.quality_on.gold"),
                       ({"judge": 3}, "report.meta.quality_on.judge")):
        with pytest.raises(ConfigError) as exc:
            EvaluationReport.from_dict({**d, "meta": {"quality_on": bad}})
        assert exc.value.field == field


def test_logged_latency_is_end_to_end_not_stages_plus_total():
    """The Serve ingress logs stage times and the whole replica call as `pipeline`; an arm's
    latency is that total, not its sum with the stages (which counted them twice)."""
    from rl.promotion.log_evaluators import row_latency_ms

    served = _row(1, "S", 0.5)
    served["latency_ms"] = {"retrieve": 50.0, "generate": 40.0, "pipeline": 95.0}
    assert row_latency_ms(served) == 95.0
    assert row_latency_ms(_row(2, "S", 0.5)) == 100.0  # no total logged: the stage sum
    s, _, _ = arms_from_rows([served, _row(2, "C", 0.4)], "S", "C", "canary")
    assert list(s.latency_ms) == [95.0]


def test_shadow_pairs_compare_compute_time_not_the_mirror_wall_time():
    """A mirrored answer starts after the served one returns and queues beside it in the same
    replicas: its wall time (`pipeline`) measures the mirroring. Shadow pairs compare the
    replica's stage times; a canary keeps what the user waited."""
    from rl.promotion.log_evaluators import row_compute_ms

    served = _row(1, "S", 0.5)
    served["latency_ms"] = {"retrieve": 50.0, "generate": 40.0, "pipeline": 95.0}
    mirror = _row(2, "C", None, 1.0, True, "r1")
    mirror["latency_ms"] = {"retrieve": 30.0, "generate": 40.0, "pipeline": 160.0}
    assert row_compute_ms(served) == 90.0 and row_compute_ms(mirror) == 70.0
    assert row_compute_ms({"latency_ms": {"pipeline": 12.0}}) == 12.0  # no stages logged
    # scoring the answer (reference-free signals) is a measurement, not the config's compute
    assert row_compute_ms({"latency_ms": {"retrieve": 5.0, "signals": 20.0}}) == 5.0
    s, c, _ = arms_from_rows([served, mirror], "S", "C", "shadow")
    assert list(s.latency_ms) == [90.0] and list(c.latency_ms) == [70.0]  # candidate faster
    s, _, _ = arms_from_rows([served, _row(3, "C", 0.4)], "S", "C", "canary")
    assert list(s.latency_ms) == [95.0]


# --------------------------------------------------------------------------- state machine


def test_promotion_path_needs_evidence_at_every_step(tmp_path):
    sm = PromotionStateMachine.start(tmp_path, "cand", "stable", "ds@abc", cfg(),
                                     code_commit="deadbeef")
    assert sm.stage == "candidate"
    d = sm.advance()
    assert d.action == "refused" and "offline report" in d.reason
    assert sm.observe(offline_report(0.05)).action == "ready"
    assert sm.advance().to_stage == "shadow" and sm.traffic()["shadow_percent"] == 100.0
    assert sm.advance().action == "refused"  # shadow evidence starts from zero
    d = sm.observe(shadow_report(0.05, seed=1))  # n = 20 = min_n: quality better
    assert sm.state.evidence["efficacy"] is True
    assert d.action == "hold" and "consecutive gate-clean" in d.reason  # 1 clean batch of 2
    assert sm.advance().action == "refused"
    assert sm.observe(shadow_report(0.05, seed=2)).action == "ready"
    assert sm.advance().to_stage == "canary_5" and sm.traffic()["canary_percent"] == 5.0
    with pytest.raises(ConfigError) as exc:
        sm.observe(shadow_report(0.05))
    assert exc.value.field == "report.kind"
    for stage in ("canary_25", "full"):  # canaries: 40 fewer tokens per request
        sm.observe(canary_report(-40.0, seed=3))
        sm.observe(canary_report(-40.0, seed=4))
        assert sm.advance().to_stage == stage
    assert sm.traffic()["canary_percent"] == 100.0 and sm.advance().action == "refused"
    audit = read_audit(tmp_path)
    assert [(a["from"], a["to"]) for a in audit] == [
        ("none", "candidate"), ("candidate", "shadow"), ("shadow", "canary_5"),
        ("canary_5", "canary_25"), ("canary_25", "full")]
    for a in audit:
        assert {"time", "from", "to", "config_hash", "dataset_manifest_id", "code_commit",
                "evidence"} <= set(a)
        assert a["config_hash"] == "cand" and a["code_commit"] == "deadbeef"
    shadow_step = audit[2]["evidence"]
    assert shadow_step["n"] == 40 and shadow_step["efficacy"] is True
    verdicts = {j["metric"]: j for j in shadow_step["metrics"]}
    assert verdicts["quality"]["verdict"] == "better" and verdicts["quality"]["low"] > 0
    assert verdicts["tokens"]["verdict"] == "non_inferior" and verdicts["quality"]["paired"]
    canary = {j["metric"]: j for j in audit[3]["evidence"]["metrics"]}
    assert "quality" not in canary  # judged on mirrored requests only
    assert canary["tokens"]["verdict"] == "better" and not canary["tokens"]["paired"]


def test_gate_breach_rolls_back_and_state_survives_reload(tmp_path):
    sm = PromotionStateMachine.start(tmp_path, "cand", "stable", config=cfg(), code_commit="c")
    sm.observe(offline_report())
    sm.advance()
    sm.observe(shadow_report(0.05, n=10))  # below min_n (20): no verdict yet
    again = PromotionStateMachine.load(tmp_path)
    assert again.stage == "shadow" and again.state.evidence["n"] == 10
    assert again.state.evidence == sm.state.evidence
    d = again.observe(shadow_report(0.05, lat=900.0))  # p95 over the 500 ms gate
    assert d.action == "rollback" and "p95_latency_ms" in d.reason
    assert PromotionStateMachine.load(tmp_path).stage == "rolled_back"
    with pytest.raises(ConfigError):
        again.observe(shadow_report(0.05))
    assert again.advance().action == "refused"
    last = read_audit(tmp_path)[-1]
    assert last["to"] == "rolled_back" and last["evidence"]["gates"]["p95_latency_ms"] is False


@pytest.mark.parametrize("edit, message", [
    (lambda d: [1], "expected a JSON object"),
    (lambda d: {k: v for k, v in d.items() if k != "stable"}, "missing field(s) stable"),
    (lambda d: {**d, "owner": "x"}, "unknown field(s) owner"),
    (lambda d: {**d, "started": "yesterday"}, "field 'started' has the wrong type"),
    (lambda d: {**d, "stage": "canary_50"}, "stage 'canary_50' is not one of"),
])
def test_a_state_file_that_is_not_ours_is_named_in_words(tmp_path, edit, message):
    """Was a dataclass signature (`RolloutState.__init__() missing 1 required positional
    argument`), or a stage nobody can advance from, loaded as if valid."""
    PromotionStateMachine.start(tmp_path, "cand", "stable", config=cfg(), code_commit="c")
    f = tmp_path / "state.json"
    f.write_text(json.dumps(edit(json.loads(f.read_text()))))
    with pytest.raises(ConfigError) as exc:
        PromotionStateMachine.load(tmp_path)
    assert exc.value.field == "state" and message in exc.value.message, exc.value.message
    assert "__init__" not in exc.value.message


def test_worse_reward_and_inconclusive_and_burn_roll_back():
    sm = PromotionStateMachine.start(None, "c", "s", config=cfg(), code_commit="x")
    sm.observe(offline_report())
    sm.advance()
    d = sm.observe(shadow_report(-0.05, tokens=-50.0))  # cheaper, but quality worse
    assert d.action == "rollback" and d.reason == ("critical metric worse than its margin: "
                                                   "quality")
    q = next(j for j in d.evidence["metrics"] if j["metric"] == "quality")
    assert q["verdict"] == "worse" and q["high"] < -q["margin"]

    sm = PromotionStateMachine.start(None, "c", "s", config=cfg(), code_commit="x")
    sm.observe(offline_report())
    sm.advance()
    rng = np.random.default_rng(5)
    ev = ShadowEvaluator(**fast())
    noise = np.tile([0.05, -0.05], 10)  # equal configs: differences with mean exactly 0
    for _ in range(2):
        base = rng.uniform(0.4, 0.8, 20)
        d = sm.observe(ev.evaluate(Arm(base, quality=base), Arm(base + noise,
                                                                 quality=base + noise)))
    assert d.action == "rollback" and d.reason.startswith("inconclusive")
    assert "no objective metric significantly better" in d.reason

    held = PromotionStateMachine.start(None, "c", "s", config=cfg(on_inconclusive="hold"),
                                       code_commit="x")
    held.observe(offline_report())
    held.advance()
    for _ in range(2):
        base = rng.uniform(0.4, 0.8, 20)
        held.observe(ev.evaluate(Arm(base, quality=base), Arm(base + noise,
                                                               quality=base + noise)))
    assert held.stage == "shadow" and "inconclusive" in held.advance().reason

    sm = PromotionStateMachine.start(None, "c", "s", config=cfg(), code_commit="x")
    sm.observe(offline_report())
    sm.advance()
    d = sm.observe(shadow_report(0.05, errors=5))  # 25% errors vs a 0.5% budget
    assert d.action == "rollback" and d.reason.startswith("error budget")
    assert wilson_lower(0, 100) == 0.0 and 0 < wilson_lower(5, 20) < 0.25


def test_offline_worse_rolls_back_and_start_refuses_active(tmp_path):
    sm = PromotionStateMachine.start(tmp_path, "c", "s", config=cfg(), code_commit="x")
    with pytest.raises(ConfigError) as exc:
        PromotionStateMachine.start(tmp_path, "c2", "s", config=cfg(), code_commit="x")
    assert exc.value.field == "state"
    assert sm.observe(offline_report(-0.05)).action == "rollback"
    PromotionStateMachine.start(tmp_path, "c2", "s", config=cfg(), code_commit="x")
    with pytest.raises(ConfigError) as exc:
        PromotionStateMachine.start(None, "same", "same")
    assert exc.value.field == "candidate"


def offline_metrics(quality: float, quality_sd: float, tokens: float, n: int = 200,
                    reward_ci: tuple[float, float] = (-0.01, 0.01)) -> EvaluationReport:
    """A hand-made offline (paired) report: per question the candidate's quality is the
    stable's + `quality` + noise of sd `quality_sd` (centred: the mean difference is exactly
    `quality`), its tokens the stable's × (1 + `tokens`), no errors. Its reward CI is
    `reward_ci`, which the candidate stage must not read."""
    rng = np.random.default_rng(1)
    q = rng.uniform(0.4, 0.8, n)
    noise = rng.normal(0.0, quality_sd, n)
    tok = rng.uniform(150, 250, n)
    stats = {"quality": MetricStats.of_pairs(q, q + quality + noise - noise.mean()),
             "tokens": MetricStats.of_pairs(tok, tok * (1.0 + tokens)),
             "error_rate": MetricStats.of_pairs(np.zeros(n), np.zeros(n))}
    arm = ArmSummary(n=n, reward=0.6, reward_sd=0.1, p95_latency_ms=100.0, errors=0, slow=0)
    lo, hi = reward_ci
    return EvaluationReport("offline", True, arm, arm, (lo + hi) / 2, 0.01, lo, hi,
                            {"p95_latency_ms": True},
                            metrics={k: v.to_dict() for k, v in stats.items()})


def _verdicts(evidence: dict) -> dict[str, dict]:
    return {j["metric"]: j for j in evidence["metrics"]}


def test_candidate_stage_passes_a_cost_gain_at_non_inferior_quality(tmp_path):
    """(a) −30% tokens, quality −0.002 with its CI inside the margin: ready, although the
    reward CI straddles 0; the audit record of the move carries each metric's judgement."""
    sm = PromotionStateMachine.start(tmp_path, "c", "s", config=cfg(), code_commit="x")
    d = sm.observe(offline_metrics(-0.002, 0.05, -0.30, reward_ci=(-0.02, 0.01)))
    assert d.action == "ready" and "better on tokens" in d.reason, d.reason
    v = _verdicts(d.evidence)
    assert v["quality"]["verdict"] == "non_inferior" and v["tokens"]["verdict"] == "better"
    assert -0.02 < v["quality"]["low"] < -0.002 < v["quality"]["high"]
    assert v["quality"]["diff"] == pytest.approx(-0.002) and v["quality"]["paired"]
    assert "95% CI" in v["quality"]["statistic"] and "CS" not in v["quality"]["statistic"]
    assert v["error_rate"]["verdict"] == "non_inferior" and "latency_ms" not in v
    assert sm.advance().to_stage == "shadow"
    moved = _verdicts(read_audit(tmp_path)[1]["evidence"])
    assert moved["tokens"]["verdict"] == "better" and moved["tokens"]["diff"] < -50


def test_candidate_stage_rolls_back_a_quality_loss_it_shows():
    """(b) quality −0.05, CI entirely below −margin: rolled back naming quality, although
    the candidate is 30% cheaper and its reward CI is above 0."""
    sm = PromotionStateMachine.start(None, "c", "s", config=cfg(), code_commit="x")
    d = sm.observe(offline_metrics(-0.05, 0.05, -0.30, reward_ci=(0.01, 0.03)))
    assert d.action == "rollback" and sm.stage == "rolled_back"
    assert d.reason == "offline report: critical metric worse than its margin: quality"
    q = _verdicts(d.evidence)["quality"]
    assert q["verdict"] == "worse" and q["high"] < -q["margin"] == -0.02


def test_candidate_stage_passes_a_quality_gain_at_equal_cost():
    """(c) quality +0.01 with CI low > 0, tokens +0%: ready (better on quality)."""
    sm = PromotionStateMachine.start(None, "c", "s", config=cfg(), code_commit="x")
    d = sm.observe(offline_metrics(0.01, 0.02, 0.0))
    v = _verdicts(d.evidence)
    assert d.action == "ready" and "better on quality" in d.reason, d.reason
    assert v["quality"]["verdict"] == "better" and v["quality"]["low"] > 0
    assert v["tokens"]["verdict"] == "non_inferior" and v["tokens"]["diff"] == 0.0


def test_candidate_stage_waits_when_quality_is_not_shown_non_inferior():
    """(d) −30% tokens, but the quality CI reaches below −margin without being worse: not
    ready, naming quality as pending; the CLI's next step is a new offline report."""
    sm = PromotionStateMachine.start(None, "c", "s", config=cfg(), code_commit="x")
    d = sm.observe(offline_metrics(-0.01, 0.1, -0.30))
    v = _verdicts(d.evidence)
    assert v["quality"]["verdict"] == "pending" and v["tokens"]["verdict"] == "better"
    assert v["quality"]["low"] < -0.02 < v["quality"]["high"]
    assert d.action == "hold" and sm.stage == "candidate"
    assert d.reason == "needs (offline report): quality pending", d.reason
    assert sm.advance().action == "refused"


def test_offline_ci_sets_the_level_and_pairs_are_counted():
    """The candidate stage's intervals are at `offline_ci` (one look): a quality loss of
    0.01 (sd 0.09, 200 pairs: CI low −0.0212 at 95%, −0.0194 at 90%) is non-inferior at 90%
    but not yet at 95%; fewer than 30 pairs decide nothing."""
    rep = offline_metrics(-0.01, 0.09, -0.30)
    strict = PromotionStateMachine.start(None, "c", "s", config=cfg(), code_commit="x")
    loose = PromotionStateMachine.start(None, "c", "s", config=cfg(offline_ci=0.90),
                                        code_commit="x")
    assert strict.observe(rep).action == "hold" and loose.observe(rep).action == "ready"
    assert "90% CI" in _verdicts(loose.summary())["quality"]["statistic"]
    few = PromotionStateMachine.start(None, "c", "s", config=cfg(), code_commit="x")
    d = few.observe(offline_metrics(0.05, 0.01, -0.30, n=20))
    assert d.action == "hold" and "quality pending" in d.reason
    assert _verdicts(d.evidence)["tokens"]["verdict"] == "pending"


def test_an_offline_report_without_per_metric_statistics_is_refused():
    """A reward-only offline report (no per-metric statistics, no DR margin) cannot be judged:
    a ConfigError naming its metrics, nothing observed."""
    sm = PromotionStateMachine.start(None, "c", "s", config=cfg(), code_commit="x")
    bare = replace(offline_metrics(0.01, 0.02, 0.0, reward_ci=(0.02, 0.04)), metrics={})
    with pytest.raises(ConfigError) as exc:
        service.advance(sm, [bare])
    assert exc.value.field == "reports.0.metrics" and "rollout replay" in exc.value.message
    assert sm.state.evidence["offline"] is None


def test_auto_advance():
    sm = PromotionStateMachine.start(None, "c", "s", config=cfg(auto_advance=True),
                                     code_commit="x")
    assert sm.observe(offline_report()).to_stage == "shadow"
    sm.observe(shadow_report(0.05, seed=1))
    assert sm.observe(shadow_report(0.05, seed=2)).to_stage == "canary_5"


# --------------------------------------------------------------------------- CLI


def _write(path, obj):
    path.write_text(json.dumps(obj))
    return str(path)


def _store(path, rows):
    """A server's SQLite interaction store holding `rows` (as `_row` builds them)."""
    from serving.store import Interaction, open_store

    store = open_store(str(path))
    for r in rows:
        store.log_interaction(Interaction(
            r["id"], "q", r["variant_id"], "split", r["propensity"], "a", ts=r["ts"],
            latency_ms=r["latency_ms"], tokens_in=r["tokens_in"], tokens_out=r["tokens_out"],
            shadow=r["shadow"], parent_id=r["parent_id"], scores=r["scores"]))
        if r["reward"] is not None:
            store.add_feedback(r["id"], r["reward"])
    return store


def _mirrored(start, n, stable, cand, gain=0.1, tokens=-5):
    """n served stable rows and the candidate's mirrored answers (quality + `gain`)."""
    rows = []
    for i in range(start, start + n):
        q = 0.4 + (i % 5) / 10
        rows.append(_row(i, stable, None, scores={"support": q}))
        cr = _row(1000 + i, cand, None, 1.0, True, f"r{i}",
                  {"support": min(1.0, q + gain + (i % 3) / 100)})
        cr["tokens_out"] += tokens
        rows.append(cr)
    return rows


def test_cli_start_status_advance_rollback(tmp_path, capsys):
    d = str(tmp_path / "state")
    conf = tmp_path / "rollout.yaml"
    conf.write_text(json.dumps({"rollout": SMALL}))
    db = tmp_path / "interactions.sqlite"
    store = _store(db, [_row(0, "0123456789ab", 0.5)])
    main = cli_main
    where = ["--state-dir", d, "--store", str(db), "--url", "http://127.0.0.1:8123"]
    assert main(["rollout", "status", *where]) == 0  # no rollout yet: said, not an error
    assert "no rollout in" in capsys.readouterr().out
    # a stable that nothing serves is refused, naming the flag and what is served
    assert main(["rollout", "start", *where, "--candidate", "abc123def456.yaml",
                 "--stable", "ffffffffffff"]) == 2
    assert "--candidate" in capsys.readouterr().err
    assert main(["rollout", "start", *where, "--candidate", "abc123def456",
                 "--stable", "ffffffffffff"]) == 2
    err = capsys.readouterr().err
    assert "error: --stable:" in err and "0123456789ab" in err
    off_path = _write(tmp_path / "off.json", offline_report().to_dict())
    assert main(["rollout", "start", *where, "--candidate", "abc123def456",
                 "--stable", "0123456789ab", "--manifest", str(DEFAULTS_PATH),
                 "--config", str(conf)]) == 2  # the candidate is not deployed either
    assert "error: --candidate:" in capsys.readouterr().err
    store.save_routing("fp", "admin/traffic", {"stable": "0123456789ab",
                                               "canary": "abc123def456"})
    assert main(["rollout", "start", *where, "--candidate", "abc123def456",
                 "--stable", "0123456789ab", "--manifest", str(DEFAULTS_PATH),
                 "--config", str(conf), "--offline", off_path]) == 0
    out = capsys.readouterr().out
    assert "quality: offline Δ +0.0497 (sd 0.0098): ~20 mirrored requests to show better" in out
    assert "tokens: offline Δ +0 (sd 0): ~20 mirrored requests to show non-inferior" in out
    assert main(["rollout", "status", *where]) == 0  # status finds what start wrote
    assert "stage candidate" in capsys.readouterr().out
    assert main(["rollout", "advance", *where]) == 1
    assert "refused" in capsys.readouterr().out
    assert main(["rollout", "advance", *where, "--evidence", off_path]) == 0
    out = capsys.readouterr().out
    assert "curl -s -XPOST http://127.0.0.1:8123/admin/traffic" in out and ":8000" not in out
    st = service.status(d)
    assert st["stage"] == "shadow" and st["traffic"]["shadow"] == "abc123def456"
    assert st["dataset_manifest_id"].startswith("rollout@")
    # shadow evidence: read from the server's own store, each row once
    for r in _mirrored(1, 30, "0123456789ab", "abc123def456"):
        _store_add(store, r)
    assert main(["rollout", "advance", *where]) == 1  # better, but 1 of 2 clean batches
    out = capsys.readouterr().out
    assert "quality: better" in out and "2 consecutive gate-clean batches" in out
    assert service.status(d)["evidence"]["n"] == 30
    assert main(["rollout", "advance", *where]) == 1
    assert "no interaction rows newer" in capsys.readouterr().out  # not counted twice
    assert service.status(d)["evidence"]["n"] == 30
    rep = _write(tmp_path / "b.json", [shadow_report(0.05).to_dict()])
    assert main(["rollout", "advance", *where, "--evidence", rep]) == 0
    assert service.status(d)["stage"] == "canary_5"
    assert main(["rollout", "status", *where]) == 0
    out = capsys.readouterr().out
    assert "stage canary_5: canary 5% (abc123def456)" in out and "audit.jsonl" in out
    assert main(["rollout", "status", *where, "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["stage"] == "canary_5"
    # the same report again counts once: resubmitting it adds nothing
    c_rep = _write(tmp_path / "c.json", [canary_report(-40.0, seed=3).to_dict()])
    assert main(["rollout", "advance", *where, "--evidence", c_rep]) == 1
    assert service.status(d)["evidence"]["n"] == 20
    for _ in range(2):
        assert main(["rollout", "advance", *where, "--evidence", c_rep]) == 1
        assert "already counted" in capsys.readouterr().out
    assert service.status(d)["evidence"]["n"] == 20 and service.status(d)["stage"] == "canary_5"
    assert main(["rollout", "rollback", *where, "--reason", "dashboard p95"]) == 0
    assert "http://127.0.0.1:8123/admin/traffic" in capsys.readouterr().out
    audit = read_audit(d)
    assert audit[-1]["to"] == "rolled_back" and audit[-1]["reason"] == "manual: dashboard p95"
    assert main(["rollout", "advance", *where]) == 1


def _store_add(store, r):
    from serving.store import Interaction

    store.log_interaction(Interaction(
        r["id"], "q", r["variant_id"], "split", r["propensity"], "a", ts=r["ts"],
        latency_ms=r["latency_ms"], tokens_in=r["tokens_in"], tokens_out=r["tokens_out"],
        shadow=r["shadow"], parent_id=r["parent_id"], scores=r["scores"]))


@pytest.mark.parametrize("argv,field", [
    (["rollout", "start", "--candidate", "bad hash!", "--stable", "abc"], "--candidate"),
    (["rollout", "start", "--candidate", "missing.yaml", "--stable", "abc"], "--candidate"),
    (["rollout", "rollback", "--reason", " "], "--reason"),
])
def test_cli_bad_input_exits_2_naming_the_field(tmp_path, capsys, argv, field):
    argv = [*argv, "--state-dir", str(tmp_path / "s")]
    assert cli_main(argv) == 2
    assert f"error: {field}:" in capsys.readouterr().err


def test_cli_bad_evidence_and_config(tmp_path, capsys):
    d = str(tmp_path / "s")
    bad = tmp_path / "bad.yaml"
    bad.write_text("rollout:\n  stages:\n    shadow: {min_n: 0, max_n: 40}\n")
    db = tmp_path / "i.sqlite"
    _store(db, [_row(0, "a", 0.5), _row(1, "b", 0.5)])
    assert cli_main(["rollout", "start", "--state-dir", d, "--store", str(db), "--candidate",
                     "a", "--stable", "b", "--config", str(bad)]) == 2
    assert "rollout.stages.shadow.min_n" in capsys.readouterr().err
    assert cli_main(["rollout", "start", "--state-dir", d, "--store", str(tmp_path / "no.db"),
                     "--candidate", "a", "--stable", "b"]) == 2
    err = capsys.readouterr().err
    assert "error: --store: no interaction store at" in err and "is the server running" in err
    assert cli_main(["rollout", "start", "--state-dir", d, "--store", str(db), "--candidate",
                     "a", "--stable", "b"]) == 0
    junk = tmp_path / "junk.jsonl"
    junk.write_text('{"kind": "offline", "candidate": {}}\nnot json\n')
    assert cli_main(["rollout", "advance", "--state-dir", d, "--evidence",
                             str(junk)]) == 2
    assert "junk.jsonl:2" in capsys.readouterr().err


def test_cli_candidate_stage_takes_a_replay_report_not_rows(tmp_path, capsys):
    """At stage candidate an interaction export is refused (exit 2) naming the replay that
    turns it into an offline report; a report still pending says to replay more."""
    d = str(tmp_path / "s")
    db = tmp_path / "i.sqlite"
    _store(db, [_row(0, "C", 0.5), _row(1, "S", 0.5)])
    assert cli_main(["rollout", "start", "--state-dir", d, "--store", str(db), "--candidate",
                     "C", "--stable", "S"]) == 0
    rows = [_row(i, v, 0.5) for i, v in enumerate(["S", "C"] * 20)]
    log = tmp_path / "log.jsonl"
    log.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    capsys.readouterr()
    assert cli_main(["rollout", "advance", "--state-dir", d, "--evidence", str(log)]) == 2
    err = capsys.readouterr().err
    assert "--evidence" in err and f"ragpilot rollout replay --log {log}" in err
    pending = _write(tmp_path / "p.json", offline_metrics(-0.01, 0.1, -0.30).to_dict())
    assert cli_main(["rollout", "advance", "--state-dir", d, "--evidence", pending]) == 1
    out = capsys.readouterr().out
    assert "quality: pending" in out and "tokens: better" in out
    assert f"next: ragpilot rollout replay --state-dir {d} --log" in out
    assert service.status(d)["stage"] == "candidate"


class _FakeTuner:
    """The slice of TunerEvaluator that OfflineEvaluator uses (tables are per-query metrics)."""

    class _Slice:
        tune_split = "valid"

    class _Data:
        name = "fake"

    slice, data = _Slice(), _Data()
    thresholds = PromotionSettings().thresholds

    def table(self, config, split):
        k = config.k
        return {"f": np.full(4, 0.8), "r": np.full(4, 0.8), "latency_ms": np.full(4, 100.0),
                "tokens": np.full(4, 200.0), "reward": np.array([0.5, 0.6, 0.7, 0.8]) + k / 100}

    def quality(self, tab):
        return tab["f"], tab["r"]

    def per_query_reward(self, tab):
        return tab["reward"]

    def reward_spec(self):
        from types import SimpleNamespace

        return SimpleNamespace(quality=lambda f, r: (f + r) / 2)


def test_offline_evaluator_uses_tuner_tables():
    from types import SimpleNamespace

    ev = OfflineEvaluator(_FakeTuner(), ci_method="normal")
    a, b = SimpleNamespace(k=3, config_hash="a"), SimpleNamespace(k=8, config_hash="b")
    rep = ev.compare(a, b)
    assert rep.kind == "offline" and rep.paired and rep.n == 4
    assert rep.diff == pytest.approx(0.05) and rep.ci_low == pytest.approx(0.05)
    assert rep.gates_passed and rep.cost == 200.0 and rep.meta["candidate_hash"] == "b"


def test_evidence_files_name_the_line_of_a_bad_row_or_report(tmp_path):
    """Rows with a non-numeric reward were a ValueError traceback inside the evaluator, and a
    report missing a key named neither file nor line (the CLI audit, stop 56)."""
    from rl.promotion.evidence import reports_from_file

    sm = PromotionStateMachine.start(tmp_path / "st", "cand", "stable", config=cfg(),
                                     code_commit="x")
    rows = tmp_path / "rows.jsonl"
    good = {"id": "a", "variant_id": "stable", "reward": 0.5, "propensity": 0.5, "ts": 2.0}
    for bad, key in [({"reward": "x"}, "reward"), ({"reward": 1.5}, "reward"),
                     ({"propensity": 0}, "propensity"), ({"ts": "now"}, "ts"),
                     ({"latency_ms": {"pipeline": "slow"}}, "latency_ms")]:
        rows.write_text(json.dumps(good) + "\n\n" + json.dumps({**good, "id": "b", **bad})
                        + "\n")
        with pytest.raises(ConfigError) as e:
            reports_from_file(rows, sm)
        assert f"{rows}:3: {key} must be" in e.value.message, e.value
    rows.write_text(json.dumps({**good, "variant_id": 5}) + "\n")
    with pytest.raises(ConfigError, match=r"rows.jsonl:1: variant_id must be"):
        reports_from_file(rows, sm)
    rows.write_text(json.dumps(good) + "\n")
    with pytest.raises(ConfigError) as e:  # good rows, but the offline stage replays them
        reports_from_file(rows, sm)
    assert "rollout replay" in e.value.message and str(rows) in e.value.message
    reports = tmp_path / "reports.jsonl"
    reports.write_text(json.dumps({"kind": "offline", "candidate": {}}) + "\n")
    with pytest.raises(ConfigError) as e:
        reports_from_file(reports, sm)
    assert f"(at {reports}:1)" in e.value.message and e.value.field.startswith("report.")


def test_a_mirror_logged_after_the_read_is_counted_next_time_and_nothing_twice(tmp_path):
    """Evidence read while mirrored answers are still running: the served rows waiting for
    their mirror (and those after them) are left for the next read, not lost; a row already
    counted is never counted again."""
    from rl.promotion.evidence import reports_from_file

    sm = PromotionStateMachine.start(None, "cand", "stab", config=cfg(), code_commit="x")
    sm.observe(offline_report())
    sm.advance()
    now = time.time()
    rows = []
    for i in range(10):
        rows.append({**_row(i, "stab", None, scores={"support": 0.5}), "ts": now + i})
        if i < 6:  # mirrors 6..9 still running when the log is first read
            rows.append({**_row(100 + i, "cand", None, 1.0, True, f"r{i}",
                                {"support": 0.5}), "ts": now + i + 0.5})
    log = tmp_path / "log.jsonl"
    log.write_text("".join(json.dumps(r) + "\n" for r in rows))
    first = reports_from_file(log, sm).reports[0]
    assert first.n == 6
    sm.observe(first)
    for i in range(6, 10):  # the late mirrors arrive
        rows.append({**_row(100 + i, "cand", None, 1.0, True, f"r{i}", {"support": 0.5}),
                     "ts": now + 11 + i})
    log.write_text("".join(json.dumps(r) + "\n" for r in rows))
    second = reports_from_file(log, sm).reports[0]
    assert second.n == 4  # the four late pairs, none of the first six again
    sm.observe(second)
    assert sm.state.evidence["n"] == 10
    assert "newer" in reports_from_file(log, sm).notes[0]  # nothing left to count


def test_the_same_report_submitted_again_counts_once():
    """It counted as three batches (the runbook walk): evidence could be manufactured."""
    sm = PromotionStateMachine.start(None, "c", "s", config=cfg(), code_commit="x")
    service.advance(sm, [offline_report()])
    rep = shadow_report(0.05, seed=1)
    d = service.advance(sm, [rep, rep, rep])
    assert sm.state.evidence["batches"] == 1 and d.action == "refused"
    assert "2 consecutive gate-clean batches (have 1)" in d.reason
    again = EvaluationReport.from_dict(json.loads(json.dumps(rep.to_dict())))
    service.advance(sm, [again])  # the same report, read back from JSON
    assert sm.state.evidence["batches"] == 1
    assert service.advance(sm, [shadow_report(0.05, seed=2)]).to_stage == "canary_5"


def test_served_answers_carry_gold_scores_or_else_the_reference_free_signals(monkeypatch):
    """What the rollout's quality rule reads: a replica scores an answer to one of the served
    dataset's questions against its gold; any other is scored with rag.metrics.signals after
    the reply, from the record's `signal_input` (`score_signals`, timed in `ms`)."""
    from types import SimpleNamespace

    import serving.pipelines as pl
    from rag.corpus.hygiene import gold_by_question
    from rag.types import Answer, Context, Example

    ex = Example(id="q1", question="Who founded Acme?", answers=("Ada Lovelace",))
    ctx = (Context("p1", "Acme", "Acme was founded by Ada Lovelace in 1850."),)

    class Pipe:
        config = SimpleNamespace(k=3)

        def run(self, question, query_id="q", history=None):
            return Answer(query_id, question, "Ada Lovelace", (1,), ctx, (),
                          {"retrieve": 1.0}, 10, 2, "cfg")

    seen = []

    class Signals:
        def score(self, answer):
            seen.append(answer.question)
            return {"sig_relevancy": 0.5, "sig_faithfulness": 1.0, "sig_combined": 0.8,
                    "unused": 7.0}

    monkeypatch.setattr(pl, "_signals", Signals())
    gold = gold_by_question([ex])
    rec = pl.answer_record(Pipe(), gold, "Who founded Acme?")
    assert rec["scores"]["f1"] == 1.0 and "sig_combined" not in rec["scores"] and not seen
    assert "signals" not in rec["latency_ms"]
    rec = pl.answer_record(Pipe(), gold, "Who runs Acme now?")
    assert rec["scores"] is None and rec["gold_category"] is None and not seen
    assert "signals" not in rec["latency_ms"] and rec["latency_ms"]["retrieve"] == 1.0
    got = pl.score_signals(rec["signal_input"])
    assert got["scores"] == {"sig_relevancy": 0.5, "sig_faithfulness": 1.0,
                             "sig_combined": 0.8}
    assert seen == ["Who runs Acme now?"] and got["ms"] >= 0.0
