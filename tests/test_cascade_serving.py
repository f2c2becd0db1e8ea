"""The threshold cascade (`rl.routing.cascade`) from `ragpilot router train --learner cascade`
to an answer: the CLI fits it on the synthetic world (a 7-arm slice of the portfolio, to stay
small), saves a policy directory `load_policy` reads back, and `serving.policy_router.
PolicyService` (in-process, no Ray) answers test questions with it in two decisions. With
ε = 0 its escalations are the offline `ThresholdCascade.escalate` of the same questions'
batched features and attempt signals; with ε > 0 each escalation decision logs the
probability it was drawn with. The Serve app path is not exercised here."""

from __future__ import annotations

import contextlib
import io
import json

import numpy as np
import pytest

from serving.cli import main

ARMS = ("static-default", "bm25-k3", "dense-k1", "hybrid-k1", "hybrid-k3-w0.7",
        "hybrid-k8-rerank", "graph-k8-rerank")
N_QUESTIONS = 20
EPSILON = 0.3


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    from rl.routing import portfolio

    out = tmp_path_factory.mktemp("cascade-policy") / "synthetic"
    err = io.StringIO()
    with pytest.MonkeyPatch.context() as mp, contextlib.redirect_stderr(err):
        mp.setattr(portfolio, "PORTFOLIO", [a for a in portfolio.PORTFOLIO if a[0] in ARMS])
        assert main(["router", "train", "--learner", "cascade", "--out", str(out)]) == 0
    return out, json.loads((out / "report.json").read_text()), err.getvalue()


@pytest.fixture(scope="module")
def questions():
    from rl.common.data import TuningData

    data = TuningData.open("synthetic")
    return data, data.examples("test")[:N_QUESTIONS]  # the holdout split the report reads


def test_the_directory_holds_the_fitted_cascade_and_its_holdout_report(trained):
    from rl.routing.base import load_policy
    from rl.routing.cascade import ABSTAIN, SIGNAL_NAMES, CascadePolicy

    out, rep, err = trained
    lp = load_policy(out)
    pol = lp.policy
    assert lp.kind == "cascade" and isinstance(pol, CascadePolicy)
    d = lp.details
    assert d["tau"] == pol.cascade.tau and d["cheap"] == lp.names[0] == pol.names[0]
    assert d["stage2"] == pol.stage2 and (pol.stage2 == ABSTAIN) == (len(lp.names) == 1)
    assert d["signal_names"] == list(SIGNAL_NAMES) and d["feature_names"] == lp.feature_names
    cal = d["calibrator"]
    width = len(lp.feature_names) + len(SIGNAL_NAMES)
    assert len(cal["mean"]) == len(cal["scale"]) == width
    assert len(cal.get("coef", [0.0] * width)) == width
    # equal cost: chosen within the best static config's valid tokens
    assert d["valid"]["tokens"] <= rep["cascade"]["budget_tokens"] + 1e-9
    by = {(r["system"], r["metric"]): r for r in rep["rows"]}
    for metric in ("delta_quality", "delta_cost_pct", "delta_reward"):
        r = by[("cascade - best-static", metric)]
        assert r["ci_low"] <= r["value"] <= r["ci_high"] and r["n"] == rep["n"]["test"]
    q = by[("cascade", "quality")]["value"] - by[("best-static", "quality")]["value"]
    assert by[("cascade - best-static", "delta_quality")]["value"] == pytest.approx(q)
    from rl.kernel.settings import TunerSettings
    from rl.routing.train import cascade_verdict

    margin = TunerSettings.defaults().objective.margin
    assert (rep["verdict"], rep["reason"]) == cascade_verdict(rep["rows"], margin)
    assert rep["reason"] in (out / "report.md").read_text()
    assert "cascade: `" in err and "tau" in err  # the fit says what it chose


def _toy_policy(constant=None):
    """A CascadePolicy over two configs whose confidence is the first column's logistic."""
    from sklearn.linear_model import LogisticRegression

    from rag.config import RAGConfig
    from rl.routing.cascade import BASE_SIGNALS, Calibrator, CascadePolicy, ThresholdCascade

    Z = np.array([[-2.0] + [0.0] * 7, [-1.0] + [0.0] * 7, [1.0] + [0.0] * 7, [2.0] + [0.0] * 7])
    model = LogisticRegression().fit(Z, [0, 0, 1, 1]) if constant is None else None
    cal = Calibrator(np.zeros(8), np.ones(8), model, constant)
    cas = ThresholdCascade(0, 1, ("a", "b"), cal, 0.5, {"quality": 0.5})
    arms = [RAGConfig(generator="extractive", k=1), RAGConfig(generator="extractive", k=5)]
    return CascadePolicy(cas, arms, ["a", "b"], "b", ["f0"], BASE_SIGNALS), Z


def test_the_escalation_draw_flips_the_greedy_decision_with_probability_epsilon():
    pol, Z = _toy_policy()
    low, high = Z[0], Z[3]  # confidence below τ: escalate; above: answer with the cheap arm
    assert pol.decide(low, 0.0, 0.99)["escalate"] and not pol.decide(high, 0.0, 0.0)["escalate"]
    for z in (low, high):
        g = pol.decide(z, 0.2, 0.5)  # u >= ε: the greedy decision, propensity 1 − ε
        f = pol.decide(z, 0.2, 0.1)  # u < ε: flipped, propensity ε
        assert g["escalate"] == g["greedy_escalate"] and g["propensity"] == pytest.approx(0.8)
        assert f["escalate"] != f["greedy_escalate"] and f["propensity"] == pytest.approx(0.2)
    from rag.errors import ConfigError

    with pytest.raises(ConfigError, match="epsilon"):
        pol.decide(low, 1.5, 0.0)
    with pytest.raises(ConfigError) as exc:
        pol.decide(low[:3], 0.1, 0.0)
    assert exc.value.field == "z"


def test_a_cascade_round_trips_through_the_one_policy_directory_format(tmp_path):
    from rag.config import RAGConfig
    from rl.routing.base import load_policy, save_policy

    for constant in (None, 0.25):
        pol, Z = _toy_policy(constant)
        d = save_policy(pol, tmp_path / str(constant), base_config=RAGConfig(), names=pol.names,
                        feature_names=pol.feature_names, kind="cascade",
                        details=pol.manifest())
        lp = load_policy(d)
        assert lp.kind == "cascade" and lp.details == json.loads(json.dumps(pol.manifest()))
        assert lp.details["stage2"] == "b" and lp.details["tau"] == 0.5
        assert ("constant" in lp.details["calibrator"]) == (constant is not None)
        np.testing.assert_allclose(lp.policy.cascade.confidence(Z), pol.cascade.confidence(Z))


def test_the_cli_refuses_equal_cost_for_the_cascade(tmp_path, capsys):
    assert main(["router", "train", "--learner", "cascade", "--equal-cost",
                 "--out", str(tmp_path / "p")]) == 2
    assert "--equal-cost" in capsys.readouterr().err
    assert not (tmp_path / "p").exists()


def _offline_escalations(lp, data, examples) -> np.ndarray:
    """The batched path on the same questions: query features and `attempt_signals` of the
    cheap arm, then the fitted cascade's `escalate`."""
    from rag.metrics.signals import AnswerSignals
    from rl.routing.cascade import attempt_signals
    from rl.routing.features import QueryFeaturizer

    feat = QueryFeaturizer.for_names(data.indexes, lp.base_config, lp.feature_names)
    X = feat.matrix(examples)
    S = attempt_signals(data.indexes, lp.policy.arms[0], examples, None, AnswerSignals())
    return lp.policy.cascade.escalate(np.hstack([X, S]))


def test_served_decisions_equal_the_offline_cascade_and_log_their_propensities(trained,
                                                                              questions):
    from rag.generation.prompts import INSUFFICIENT
    from rag.pipeline import Pipeline
    from rl.routing.base import load_policy
    from serving.policy_router import PolicyService

    out, _, _ = trained
    data, examples = questions
    lp = load_policy(out)
    pol = lp.policy
    greedy = PolicyService(str(out), "synthetic", epsilon=0.0, warmup=False)
    explore = PolicyService(str(out), "synthetic", epsilon=EPSILON, seed=1, warmup=False)
    pipes = [Pipeline(data.indexes, c) for c in pol.arms]
    offline = _offline_escalations(lp, data, examples)
    served, flips = [], 0
    for e in examples:
        g = greedy.answer(e.question, e.id)
        p = g["policy"]
        cheap, second = p["decisions"]
        assert cheap == {"stage": "cheap", "arm": 0, "arm_name": pol.names[0],
                         "propensity": 1.0}
        assert second["escalate"] == second["greedy_escalate"] and second["propensity"] == 1.0
        assert second["escalate"] == (second["confidence"] < pol.cascade.tau)
        served.append(second["escalate"])
        assert p["propensity"] == 1.0 and p["arm"] == int(second["escalate"])
        assert len(p["features"]) == len(lp.feature_names) + len(pol.signal_names)
        c = pipes[0].run(e.question, e.id)
        if not second["escalate"]:
            assert (g["answer"], g["tokens_in"], g["tokens_out"]) == (
                c.text, c.tokens_in, c.tokens_out)
            assert p["config_hash"] == pol.arms[0].config_hash == g["variant_id"]
        elif pol.abstains:
            assert g["answer"] == INSUFFICIENT and p["arm_name"] == "abstain"
            assert (g["tokens_in"], g["tokens_out"]) == (c.tokens_in, c.tokens_out)
        else:  # the strong config answers, and both attempts are paid for
            s = pipes[1].run(e.question, e.id)
            assert g["answer"] == s.text and p["config_hash"] == pol.arms[1].config_hash
            assert g["tokens_in"] == c.tokens_in + s.tokens_in
            assert g["tokens_out"] == c.tokens_out + s.tokens_out
        x = explore.answer(e.question, e.id)["policy"]
        d = x["decisions"][1]
        assert d["confidence"] == pytest.approx(second["confidence"])
        flipped = d["escalate"] != d["greedy_escalate"]
        flips += flipped
        assert d["propensity"] == pytest.approx(EPSILON if flipped else 1 - EPSILON)
        assert 0.0 < x["propensity"] == d["propensity"] <= 1.0
    assert served == offline.tolist()
    assert 0 < flips < N_QUESTIONS, flips  # seeded: 0.3 of 20 flipped, not none or all


def test_a_candidate_beside_a_cascade_is_refused(trained, tmp_path):
    from rag.errors import ConfigError
    from serving.policy_router import PolicyService

    out, _, _ = trained
    with pytest.raises(ConfigError, match="cascade") as exc:
        PolicyService(str(out), "synthetic", warmup=False, candidate_dir=str(out),
                      candidate_share=0.1)
    assert exc.value.field == "candidate_dir"
