"""rl.promotion.metrics: per-metric verdicts, the stage decision (paired shadow vs unpaired
canary guardrails), a critical veto, and the vectorised path agreeing with the scalar one."""

import numpy as np
import pytest

from rag.errors import ConfigError
from rl.promotion.metrics import (
    BETTER,
    NON_INFERIOR,
    MetricRule,
    MetricStats,
    judge,
    requests_needed,
    verdicts,
)
from rl.promotion.settings import PromotionSettings

RULES = PromotionSettings().metrics


def _pairs(n, dq=0.0, dt=0.0, dl=0.0, seed=0):
    rng = np.random.default_rng(seed)
    q = rng.uniform(0, 1, n)
    t = rng.normal(200, 20, n)
    lat = rng.normal(50, 5, n)
    e = np.zeros(n)
    noise = rng.normal(0, 0.05, n)
    return {"quality": MetricStats.of_pairs(q, q + dq + noise),
            "tokens": MetricStats.of_pairs(t, t + dt + rng.normal(0, 5, n)),
            "latency_ms": MetricStats.of_pairs(lat, lat + dl + rng.normal(0, 2, n)),
            "error_rate": MetricStats.of_pairs(e, e)}


def test_cheaper_at_equal_quality_passes_shadow():
    j, decision, why = judge(RULES, _pairs(200, dt=-40.0), 0.05, 2000, 30)
    v = {x.metric: x.verdict for x in j}
    assert decision == "pass" and why.startswith("better on tokens")
    assert v["quality"] == "non_inferior" and v["tokens"] == "better"
    # judged on served requests only: mirrored answers get no ratings, and their timing is
    # confounded by the mirroring itself
    assert "feedback" not in v and "latency_ms" not in v


def test_no_gain_waits_and_a_critical_regression_vetoes():
    _, decision, why = judge(RULES, _pairs(200), 0.05, 2000, 30)
    assert decision == "continue" and "no objective metric significantly better" in why
    _, decision, _ = judge(RULES, _pairs(200, dq=-0.1, dt=-40.0), 0.05, 2000, 30)
    assert decision == "veto"
    _, decision, why = judge(RULES, _pairs(20, dt=-40.0), 0.05, 2000, 30)  # below min_n
    assert decision == "continue" and "quality pending" in why


def test_unpaired_canary_is_a_guardrail():
    rng = np.random.default_rng(1)
    stats = {"tokens": MetricStats.of_arms(rng.normal(200, 20, 400), rng.normal(200, 20, 40)),
             "error_rate": MetricStats.of_arms(np.zeros(400), np.zeros(40)),
             "quality": MetricStats.of_arms(rng.uniform(0, 1, 400), rng.uniform(0, 1, 40))}
    j, decision, why = judge(RULES, stats, 0.05, 1600, 30)
    assert decision == "pass" and "no regression in 40 requests" in why
    assert "quality" not in {x.metric for x in j}  # paired only
    slow = {"latency_ms": MetricStats.of_arms(rng.normal(50, 5, 400), rng.normal(80, 5, 40))}
    j, decision, why = judge(RULES, slow, 0.05, 1600, 30)
    assert decision == "veto" and why.endswith("latency_ms")  # 60% slower: margin is 10%
    lat = next(x for x in j if x.metric == "latency_ms")
    assert lat.low > lat.margin and lat.critical and not lat.paired


def test_latency_is_judged_on_served_requests_not_mirrored_pairs():
    """Mirrored answers are timed behind the served one: a +25 ms (50%) bias on the pairs of a
    cheaper candidate does not veto shadow; the same regression on served requests (the
    canary's live split) does."""
    biased = _pairs(200, dt=-40.0, dl=25.0)
    j, decision, why = judge(RULES, biased, 0.05, 2000, 30)
    assert decision == "pass" and "latency_ms" not in {x.metric for x in j}
    rng = np.random.default_rng(2)
    served = {"tokens": MetricStats.of_arms(rng.normal(200, 20, 600), rng.normal(160, 20, 60)),
              "latency_ms": MetricStats.of_arms(rng.normal(50, 5, 600), rng.normal(75, 5, 60)),
              "error_rate": MetricStats.of_arms(np.zeros(600), np.zeros(60))}
    assert judge(RULES, served, 0.05, 1600, 30)[1] == "veto"
    served["latency_ms"] = MetricStats.of_arms(rng.normal(50, 5, 600), rng.normal(50, 5, 60))
    assert judge(RULES, served, 0.05, 1600, 30)[1] == "pass"


def test_judged_on_is_validated():
    with pytest.raises(ConfigError) as e:
        PromotionSettings.from_dict({"rollout": {"metrics": {"latency_ms": {
            "direction": "lower", "judged_on": "mirrored"}}}})
    assert "judged_on" in e.value.field


def test_vectorised_verdicts_match_one_at_a_time():
    rule = MetricRule(direction="lower", margin=0.05, relative=True, objective=True)
    stats = [_pairs(100, dt=d, seed=i)["tokens"] for i, d in enumerate((-40.0, 0.0, 30.0))]
    arr = lambda k: np.array([getattr(s, k) for s in stats])  # noqa: E731
    v = verdicts(rule, True, (arr("n"), arr("sum"), arr("sumsq")),
                 (arr("s_n"), arr("s_sum"), arr("s_sumsq")), (arr("d_sum"), arr("d_sumsq")),
                 0.05, 0.01, 30)
    assert list(v["verdict"][:2]) == [BETTER, NON_INFERIOR] and v["verdict"][2] == 0  # worse
    for i, s in enumerate(stats):
        one = verdicts(rule, True, (s.n, s.sum, s.sumsq), (s.s_n, s.s_sum, s.s_sumsq),
                       (s.d_sum, s.d_sumsq), 0.05, 0.01, 30)
        assert int(one["verdict"]) == v["verdict"][i]
        assert float(one["low"]) == pytest.approx(v["low"][i])


def test_stats_add_round_trip_and_refuse_bad_input():
    a, b = _pairs(50)["tokens"], _pairs(70, seed=3)["tokens"]
    both = a + b
    assert both.n == 120 and both.d_sum == pytest.approx(a.d_sum + b.d_sum)
    assert MetricStats.from_dict(both.to_dict()) == both
    with pytest.raises(ConfigError) as e:
        MetricStats.from_dict({**both.to_dict(), "n": -1}, "report.metrics.tokens")
    assert e.value.field == "report.metrics.tokens.n"
    with pytest.raises(ConfigError) as e:
        MetricStats.from_dict({**both.to_dict(), "s_n": 3})
    assert e.value.field == "metrics.s_n"
    with pytest.raises(ConfigError):
        a + MetricStats.of_arms([1.0], [2.0])


def test_requests_needed_grows_as_the_effect_shrinks():
    n = requests_needed(RULES, {"quality": 0.05, "tokens": -10.0}, {"quality": 0.3,
                                                                  "tokens": 30.0},
                        {"tokens": 200.0}, 0.05)
    m = requests_needed(RULES, {"quality": 0.025, "tokens": -5.0}, {"quality": 0.3,
                                                                   "tokens": 30.0},
                        {"tokens": 200.0}, 0.05)
    assert m["quality"] > 3 * n["quality"] and m["tokens"] > 3 * n["tokens"]
    worse = requests_needed(RULES, {"quality": -0.05}, {"quality": 0.3}, {}, 0.05)
    assert worse["quality"] is None  # expected to fail: no size shows it non-inferior
