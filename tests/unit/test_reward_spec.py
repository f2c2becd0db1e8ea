"""The one reward specification (rl.kernel.reward.RewardSpec), the one incumbent rule
(rl.tuner.results.Incumbent), the bootstrap engine (rl.stats.bootstrap.bootstrap_statistic) and
the one RLlib PPO builder (rl.common.rllib.ppo_config). No dataset needed."""

import math

import numpy as np
import pytest

from rl.kernel.reward import (
    PII_COLUMN,
    GateVerdicts,
    RewardSpec,
    StepMetrics,
    feedback_reward,
    gate_verdicts,
    reward,
)
from rl.kernel.settings import RewardWeights, Thresholds, TunerSettings

T = Thresholds(faithfulness=0.7, relevancy=0.5, p95_latency_ms=400.0)
SPEC = RewardSpec(RewardWeights(), T, cost_ref=1000.0, instability_band=0.05)


def _queries(b: int, m: int, seed: int = 0):
    rng = np.random.default_rng(seed)
    F, R = rng.uniform(0.4, 1.0, (b, m)), rng.uniform(0.2, 1.0, (b, m))
    F[:, ::6] = np.nan
    R[:, ::4] = np.nan
    return F, R, rng.uniform(50, 700, (b, m)), rng.uniform(100, 2500, (b, m)), \
        rng.integers(0, 3, (b, m)).astype(float)


def test_scalar_and_vectorised_agree_bit_for_bit():
    F, R, lat, tok, leaks = _queries(40, 25)
    many = SPEC.batch(F, R, lat, tok, leaks)
    b = SPEC.breakdown(many)
    assert b.total.shape == (40,) and b.gates.passed.shape == (40,)
    for i in range(40):
        one = SPEC.batch(F[i], R[i], lat[i], tok[i], leaks[i])
        assert isinstance(one.faithfulness, float) and isinstance(one.quality_se, float)
        for field in ("faithfulness", "relevancy", "p95_latency_ms", "cost", "quality_se",
                      "pii_leaks", "faithfulness_se", "relevancy_se"):
            assert getattr(many, field)[i] == getattr(one, field)
        r, v = SPEC.reward(one)
        assert isinstance(r, float) and isinstance(v.passed, bool)
        assert b.total[i] == r and b.gates.passed[i] == v.passed
        assert b.penalty[i] == SPEC.penalty(v, one.pii_leaks)
    # per query: the vector is the queries one by one
    pq = SPEC.per_query(F[0], R[0], lat[0], tok[0], leaks[0])
    assert [SPEC.per_query(F[0, j], R[0, j], lat[0, j], tok[0, j], leaks[0, j])
            for j in range(25)] == list(pq)


def test_continuous_part_and_total_by_hand():
    m = StepMetrics(faithfulness=0.8, relevancy=0.6, p95_latency_ms=200, cost=500)
    b = SPEC.breakdown(m)
    # 0.5*0.8 + 0.5*0.6 - 0.2*0.5 - 0.2*0.5 = 0.5, every gate passes, stable
    assert b.continuous == pytest.approx(0.5) and b.penalty == 0.0 and b.total == b.continuous
    # saturation at 2 for latency and cost
    slow = StepMetrics(0.8, 0.6, p95_latency_ms=10_000, cost=1e6)
    assert SPEC.continuous(0.8, 0.6, 10_000, 1e6) == pytest.approx(0.7 - 0.4 - 0.4)
    assert SPEC.breakdown(slow).gates.failed == ["p95_latency_ms"]
    # the functional interface is the same spec
    assert reward(m, SPEC.weights, T, 1000.0, 0.05)[0] == b.total
    assert RewardSpec.from_settings(TunerSettings(), T) == SPEC


def test_penalty_pii_term_batch_query_and_feedback():
    m = StepMetrics(0.8, 0.6, 200, 500, quality_se=0.01, pii_leaks=0.25)
    b = SPEC.breakdown(m)
    assert b.penalty == pytest.approx(0.25) and b.total == pytest.approx(0.5 - 0.25)
    lam2 = RewardSpec(RewardWeights(lambda_=2.0), T, pii_weight=0.5)
    assert lam2.breakdown(m).total == pytest.approx(0.5 - 2.0 * 0.5 * 0.25)
    # P adds failed gates, 0.5 for instability and w_pii x leaks
    v = GateVerdicts(faithfulness=False, relevancy=True, p95_latency_ms=False, stable=False)
    assert SPEC.penalty(v) == 2.5 and SPEC.penalty(v, 2.0) == 4.5
    # per query: λ·w_pii per leak, and no gates
    base = SPEC.per_query(0.1, 0.1, 390.0, 100.0)
    assert SPEC.per_query(0.1, 0.1, 390.0, 100.0, 2.0) == pytest.approx(base - 2.0)
    assert lam2.per_query(0.1, 0.1, 390.0, 100.0, 2.0) == pytest.approx(
        lam2.per_query(0.1, 0.1, 390.0, 100.0) - 2.0 * 0.5 * 2.0)
    # one logged interaction: clipped to [0, 1]
    assert feedback_reward(0.9, 0) == 0.9 and feedback_reward(0.9, 1, 0.25) == pytest.approx(0.65)
    for bad in (-1.0, math.nan):
        with pytest.raises(ValueError, match="pii_leaks"):
            SPEC.penalty(v, bad)
        with pytest.raises(ValueError, match="pii_leaks"):
            SPEC.batch([0.8], [0.8], [1.0], [1.0], [0.0, bad][1:])
    with pytest.raises(ValueError, match="pii_weight"):
        RewardSpec(pii_weight=-1)


def test_missing_value_rule():
    F = np.array([1.0, np.nan, 0.5, np.nan])
    R = np.array([np.nan, np.nan, 0.4, 0.8])
    lat, tok = np.full(4, 100.0), np.full(4, 400.0)
    m = SPEC.batch(F, R, lat, tok)
    # batch means leave a missing query out (not 0)
    assert m.faithfulness == pytest.approx(0.75) and m.relevancy == pytest.approx(0.6)
    # per query, a missing metric is left out too (the other stands for both at α+β); a
    # query with neither has no quality term; se is of that per-query quality
    q = SPEC.quality(F, R)
    assert list(q) == pytest.approx([1.0, 0.0, 0.45, 0.8])
    assert m.quality_se == pytest.approx(q.std(ddof=1) / 2)
    assert list(SPEC.per_query(F, R, lat, tok)) == pytest.approx(list(q - 0.2 * 0.25 - 0.2 * 0.4))
    # no query has the metric: NaN mean, the gate fails, the reward is NaN
    none = SPEC.batch(np.full(4, np.nan), R, lat, tok)
    r, v = SPEC.reward(none)
    assert math.isnan(none.faithfulness) and not v.faithfulness and math.isnan(r)
    # leaks absent = 0
    assert SPEC.batch(F, R, lat, tok).pii_leaks == 0.0


def test_gate_verdicts_at_their_boundaries():
    eps = 1e-9

    def verdicts(f, r, p95, se):
        return SPEC.gates(StepMetrics(f, r, p95, 100.0, quality_se=se))

    on = verdicts(0.7, 0.5, 400.0, 0.05)  # every statistic exactly on its bound: pass
    assert on.as_dict() == {"faithfulness": True, "relevancy": True, "p95_latency_ms": True,
                            "stable": True, "passed": True}
    off = verdicts(0.7 - eps, 0.5 - eps, 400.0 + eps, 0.05 + eps)
    assert off.failed == ["faithfulness", "relevancy", "p95_latency_ms"] and not off.stable
    assert off.n_failed == 3.0 and SPEC.penalty(off) == 3.5
    nan = verdicts(math.nan, math.nan, math.nan, math.nan)
    assert nan.failed == ["faithfulness", "relevancy", "p95_latency_ms"] and not nan.stable
    # vectorised verdicts agree
    many = SPEC.gates(StepMetrics(np.array([0.7, 0.7 - eps]), np.array([0.5, 0.5]),
                                  np.array([400.0, 400.0]), np.array([1.0, 1.0]),
                                  np.array([0.05, 0.05])))
    assert list(many.passed) == [True, False] and list(many.n_failed) == [0.0, 1.0]
    # the promotion reports' form: not measured = None (does not fail)
    assert gate_verdicts({"faithfulness": 0.7, "relevancy": None, "p95_latency_ms": 400.0 + eps},
                         T) == {"faithfulness": True, "relevancy": None,
                                "p95_latency_ms": False}
    assert [g.name for g in SPEC.gates_spec] == ["faithfulness", "relevancy", "p95_latency_ms",
                                                 "stable"]


def test_tuner_tables_with_leaks_pay_the_term_everywhere():
    """A table with a `pii_leaks` column: evaluate's summary, the report's vectorised batches and
    the per-query reward all charge it; without the column nothing changes."""
    from rl.kernel.evaluator import TunerEvaluator
    from rl.tuner.report import batch_components, batch_rewards

    class Stub:
        policy = TunerSettings()
        thresholds = T

        def quality(self, tab):
            return tab["support"], tab["f1"]

    F, R, lat, tok, leaks = _queries(1, 30, seed=3)
    tab = {"support": F[0], "f1": R[0], "latency_ms": lat[0], "tokens": tok[0]}
    leaky = {**tab, PII_COLUMN: leaks[0]}
    stub = Stub()
    m0, m1 = TunerEvaluator.summarize(stub, tab), TunerEvaluator.summarize(stub, leaky)
    assert m0.pii_leaks == 0.0 and m1.pii_leaks == pytest.approx(leaks[0].mean())
    r0, r1 = SPEC.reward(m0)[0], SPEC.reward(m1)[0]
    assert r1 == pytest.approx(r0 - leaks[0].mean())
    full = np.arange(30)[None, :]
    assert batch_rewards(stub, leaky, full)[0] == r1 and batch_rewards(stub, tab, full)[0] == r0
    assert batch_components(stub, leaky, full)["pii_leaks"][0] == m1.pii_leaks
    ev = TunerEvaluator.__new__(TunerEvaluator)
    ev.policy, ev.thresholds, ev.quality = stub.policy, T, stub.quality
    assert list(ev.per_query_reward(leaky)) == pytest.approx(
        list(ev.per_query_reward(tab) - leaks[0]))


# ---- the incumbent rule --------------------------------------------------------------------
def test_incumbent_is_best_mean_then_more_evidence_then_first_seen():
    from rl.tuner.results import Incumbent, incumbent

    hist = [("a", 0.5), ("b", 0.4), ("b", 0.6), ("c", 0.5)]
    # a, b, c all have mean 0.5: b has two observations
    assert incumbent({"config_hash": h, "reward": r} for h, r in hist) == ("b", 0.5)
    # equal mean and count: the config evaluated first, whatever came later
    for order in (["x", "y", "z"], ["z", "y", "x"]):
        inc = Incumbent()
        for h in order:
            inc.add(h, 0.3)
        assert inc.best() == (order[0], 0.3) and inc.best() == inc.best()
    # a strictly better mean wins regardless of evidence
    inc = Incumbent()
    for h, r in hist + [("d", 0.51)]:
        inc.add(h, r)
    assert inc.best() == ("d", 0.51) and len(inc) == 4
    with pytest.raises(ValueError, match="no config"):
        Incumbent().best()


# ---- the bootstrap engine --------------------------------------------------------------------
def test_bootstrap_statistic_is_the_engine_of_the_mean_bootstrap():
    from rl.stats.bootstrap import bootstrap_mean_ci, bootstrap_statistic, unpaired_bootstrap

    x = np.random.default_rng(2).normal(0.2, 1.0, 3000)  # > 1 chunk at 10k resamples
    means = bootstrap_statistic(lambda idx: x[idx].mean(axis=1), x.size, 2000, seed=4)
    b = bootstrap_mean_ci(x, 2000, seed=4)
    assert means.shape == (2000,)
    tail = (1 - 0.95) / 2
    assert (b.ci_low, b.ci_high) == tuple(float(q) for q in np.quantile(means, [tail, 1 - tail]))
    both = bootstrap_statistic(lambda idx: {"m": x[idx].mean(axis=1), "p": x[idx].max(axis=1)},
                               x.size, 2000, seed=4)
    assert np.array_equal(both["m"], means) and both["p"].shape == (2000,)
    # unpaired: b's resamples drawn before a's in each chunk, as the canary evaluator did
    a, c = x[:40], x[40:100] + 0.5
    rng = np.random.default_rng(9)
    d = c[rng.integers(0, c.size, (500, c.size))].mean(1) - a[rng.integers(0, a.size,
                                                                            (500, a.size))].mean(1)
    u = unpaired_bootstrap(a, c, 500, seed=9)
    assert (u.ci_low, u.ci_high) == tuple(float(q) for q in np.quantile(d, [tail, 1 - tail]))
    assert u.mean_diff == pytest.approx(c.mean() - a.mean()) and u.n == 100


# ---- the RLlib PPO builder -----------------------------------------------------------------
def test_ppo_config_applies_the_project_sizing():
    pytest.importorskip("ray.rllib")
    import gymnasium as gym
    from ray.rllib.core.rl_module.default_model_config import DefaultModelConfig

    from rl.common.rllib import ppo_config

    cfg = ppo_config(gym.Env, {"k": 1}, seed=7, train_batch_size=12,
                     module=DefaultModelConfig(fcnet_hiddens=[16, 8], vf_share_layers=False),
                     smoothing_episodes=5, lr=0.01, gamma=0.0, minibatch_size=6, num_epochs=3)
    assert cfg.num_env_runners == 0 and cfg.num_learners == 0
    assert cfg.num_envs_per_env_runner == 1 and cfg.rollout_fragment_length == 12
    assert cfg.train_batch_size_per_learner == 12 and cfg.minibatch_size == 6
    assert cfg.lr == 0.01 and cfg.gamma == 0.0 and cfg.num_epochs == 3 and cfg.seed == 7
    assert cfg.env_config == {"k": 1} and cfg.framework_str == "torch"
    assert cfg.metrics_num_episodes_for_smoothing == 5
    assert cfg.model_config["fcnet_hiddens"] == [16, 8]
    assert cfg.model_config["vf_share_layers"] is False
    assert cfg.enable_rl_module_and_learner  # the new API stack
    for bad in ((4,), object()):  # a module is RLlib's model config or a module spec
        with pytest.raises(TypeError, match="DefaultModelConfig"):
            ppo_config(gym.Env, {}, seed=0, train_batch_size=4, module=bad)


def test_gate_margin_uses_the_lower_bound_of_f_and_r_only():
    """gate_z > 0: F and R gates compare mean - z*se (se of the NaN-aware mean, by hand here);
    p95, the continuous part and per-query rewards are unchanged; z = 0 is the old reward."""
    F = np.array([0.9, 0.5, np.nan, 0.8, 0.7, 0.6])  # mean 0.70 over 5 present: on the gate
    R = np.array([0.6, 0.4, 0.5, 0.7, 0.3, np.nan])  # mean 0.50: on the gate
    lat, tok = np.full(6, 100.0), np.full(6, 500.0)
    m = SPEC.batch(F, R, lat, tok)
    f_present = F[~np.isnan(F)]
    assert m.faithfulness_se == pytest.approx(f_present.std(ddof=1) / math.sqrt(5))
    assert m.relevancy_se == pytest.approx(R[~np.isnan(R)].std(ddof=1) / math.sqrt(5))
    assert SPEC.gates(m).passed  # on the threshold: passes at z = 0
    z = RewardSpec(RewardWeights(), T, 1000.0, 0.05, gate_z=1.645)
    v = z.gates(m)
    assert v.failed == ["faithfulness", "relevancy"] and v.p95_latency_ms
    assert z.continuous(m.faithfulness, m.relevancy, m.p95_latency_ms, m.cost) == \
        SPEC.continuous(m.faithfulness, m.relevancy, m.p95_latency_ms, m.cost)
    assert z.reward(m)[0] == pytest.approx(SPEC.reward(m)[0] - 2.0)
    viol = z.violations(m)
    assert viol["faithfulness"] == pytest.approx(1.645 * m.faithfulness_se / 0.7)
    assert viol["p95_latency_ms"] == SPEC.violations(m)["p95_latency_ms"]
    assert list(z.per_query(F, R, lat, tok)) == list(SPEC.per_query(F, R, lat, tok))
    # a batch far above the gates passes with the margin too; one query has se 0
    hi = SPEC.batch(F + 0.25, R + 0.4, lat, tok)
    assert z.gates(hi).passed
    one = SPEC.batch(F[:1], R[:1], lat[:1], tok[:1])
    assert one.faithfulness_se == 0.0 and z.gates(one).faithfulness
    # from the settings, validated
    s = TunerSettings.defaults().model_copy(update={"gate_z": 1.645})
    assert RewardSpec.from_settings(s).gate_z == 1.645
    assert RewardSpec.from_settings(TunerSettings.defaults()).gate_z == 0.0
    with pytest.raises(ValueError, match="gate_z"):
        RewardSpec(gate_z=-1.0)


def test_expected_gates_charge_the_probability_of_failing_on_new_queries():
    """gate_expected: each F/R gate costs Phi((theta - mean) / (sqrt 2 * se)) instead of 0/1;
    verdicts, p95, stability and the continuous part are the point ones; exclusive with
    gate_z."""
    from scipy.stats import norm

    e = RewardSpec(RewardWeights(), T, 1000.0, 0.05, gate_expected=True)
    F, R, lat, tok, leaks = _queries(30, 25, seed=3)
    many = SPEC.batch(F, R, lat, tok, leaks)
    b, be = SPEC.breakdown(many), e.breakdown(many)
    assert np.array_equal(b.continuous, be.continuous)
    assert np.array_equal(b.gates.passed, be.gates.passed)
    for i in range(30):
        one = SPEC.batch(F[i], R[i], lat[i], tok[i], leaks[i])
        pf = norm.cdf((0.7 - one.faithfulness) / (math.sqrt(2) * one.faithfulness_se))
        pr = norm.cdf((0.5 - one.relevancy) / (math.sqrt(2) * one.relevancy_se))
        v = SPEC.gates(one)
        want = pf + pr + (not v.p95_latency_ms) + 0.5 * (not v.stable) + one.pii_leaks
        assert e.breakdown(one).penalty == pytest.approx(want, abs=1e-12)
        assert be.penalty[i] == pytest.approx(want, abs=1e-12)  # vectorised agrees
    # on the threshold: a coin flip (0.5 per gate); far above: ~0; se 0: the 0/1 verdict
    on = StepMetrics(0.7, 0.5, 100.0, 500.0, 0.01, 0.0, 0.02, 0.02)
    assert e.breakdown(on).penalty == pytest.approx(1.0)
    far = StepMetrics(0.95, 0.9, 100.0, 500.0, 0.01, 0.0, 0.02, 0.02)
    assert e.breakdown(far).penalty == pytest.approx(0.0, abs=1e-12)
    exact = StepMetrics(0.69, 0.9, 100.0, 500.0, 0.01, 0.0, 0.0, 0.0)
    assert e.breakdown(exact).penalty == 1.0
    nan = StepMetrics(math.nan, 0.9, 100.0, 500.0, 0.01, 0.0, 0.02, 0.02)
    assert e.breakdown(nan).penalty == pytest.approx(1.0, abs=1e-12)
    assert RewardSpec.from_settings(TunerSettings.defaults().model_copy(
        update={"gate_expected": True})).gate_expected
    with pytest.raises(ValueError, match="set one"):
        RewardSpec(gate_z=1.0, gate_expected=True)
    with pytest.raises(ValueError, match="set one"):
        TunerSettings.model_validate({"gate_z": 1.0, "gate_expected": True})
