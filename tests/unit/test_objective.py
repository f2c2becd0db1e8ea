"""Objectives as a user states them (rl.kernel.objective, TunerSettings.objective) and the
Pareto front the operating point is chosen from (rl.tuner.pareto)."""

import numpy as np
import pytest

from rag.errors import ConfigError
from rl.kernel.objective import COST, P95, QUALITY, choose, paired_deltas, statement
from rl.kernel.settings import DEFAULTS_PATH, Objective, TunerSettings
from rl.tuner.pareto import hypervolume, nondominated

N = 400


def _cols(q, tokens, lat=100.0, f=None, r=None, seed=0):
    rng = np.random.default_rng(seed)
    q = np.asarray(q, dtype=float)
    return {QUALITY: q, "support": q if f is None else f, "f1": q if r is None else r,
            COST: np.full(N, float(tokens)) + rng.normal(0, 1, N),
            "latency_ms": np.full(N, float(lat))}


def _base_quality(seed=1):
    return np.random.default_rng(seed).uniform(0, 1, N)


def test_defaults_file_states_the_objective_and_its_gates():
    s = TunerSettings.from_yaml(DEFAULTS_PATH)
    assert s.objective == TunerSettings().objective
    assert s.objective.kind == "min_cost" and s.objective.margin == 0.01
    # the seed's 0.75 binds the RAGAS-style metrics by name, nothing else
    assert s.objective.quality_floors == {"q_faithfulness": 0.75, "q_answer_relevancy": 0.75}
    assert "Default min_cost" in DEFAULTS_PATH.read_text()


@pytest.mark.parametrize(("data", "field"), [
    ({"objective": {"kind": "cheapest"}}, "policy.objective.kind"),
    ({"objective": {"margin": -0.1}}, "policy.objective.margin"),
    ({"objective": {"level": 1.0}}, "policy.objective.level"),
    ({"objective": {"budgets": {"tokens": 0}}}, "policy.objective.budgets.tokens"),
    ({"objective": {"quality_floors": {"f1": 1.5}}}, "policy.objective.quality_floors"),
    ({"objective": {"budgets": {"cost_per_1k_queries": 2.0}}}, "policy.objective"),
])
def test_bad_objective_names_the_key(data, field):
    with pytest.raises(ConfigError) as e:
        TunerSettings.from_dict(data)
    assert e.value.field.startswith(field)


def test_cost_budget_becomes_tokens_at_the_price():
    o = Objective(budgets={"tokens": 500, "cost_per_1k_queries": 0.6}, price_per_1k_tokens=0.002)
    assert o.token_budget() == pytest.approx(300.0)  # 0.6 per 1k queries / 0.002 per 1k tokens
    assert Objective().token_budget() is None


def test_paired_deltas_match_hand_computation():
    a = _cols(_base_quality(), 200, lat=100)
    b = _cols(a[QUALITY] + 0.05, 100, lat=80, seed=3)
    d = paired_deltas(b, a, 2000, 0, 0.95)
    assert d[QUALITY].diff == pytest.approx(0.05)
    # every query moved by exactly +0.05: no sampling spread in the paired difference
    assert d[QUALITY].ci_low == pytest.approx(0.05) == pytest.approx(d[QUALITY].lcb)
    assert d[COST].diff == pytest.approx(b[COST].mean() - a[COST].mean())
    assert d[COST].relative == pytest.approx(d[COST].diff / a[COST].mean())
    assert d[COST].ci_low < d[COST].diff < d[COST].ci_high
    assert d[P95].diff == pytest.approx(-20.0)
    assert d[QUALITY].lcb <= d[QUALITY].ucb


def test_paired_deltas_leave_missing_values_out():
    a, b = _cols(_base_quality(), 100), _cols(_base_quality(), 100)
    a["f1"] = a["f1"].copy()
    a["f1"][:100] = np.nan
    b["f1"] = b["f1"] + 0.1
    d = paired_deltas(b, a)
    assert d["f1"].n == N - 100 and d["f1"].diff == pytest.approx(0.1)


def _candidates():
    q = _base_quality()
    noise = np.random.default_rng(7).normal(0, 0.3, N)
    return {"inc": _cols(q, 1000),
            "same_cheap": _cols(q, 400),                   # non-inferior, -60% tokens
            "worse_cheaper": _cols(q - 0.05, 100),         # cheapest, but quality drops
            "noisy_cheap": _cols(np.clip(q + noise, 0, 1), 300),  # mean ~ same, wide CI
            "better_costly": _cols(q + 0.04, 1200),        # better quality, over budget
            "better_within": _cols(q + 0.02, 900)}         # better quality, within budget


def test_min_cost_picks_the_cheapest_non_inferior_config():
    c = choose(Objective(kind="min_cost"), _candidates(), "inc", "support", "f1", 500)
    assert c.better and c.key == "same_cheap"
    assert "not non-inferior" in c.verdicts["worse_cheaper"]
    assert "not non-inferior" in c.verdicts["noisy_cheap"]  # its lower bound is below -0.01
    assert "not cheaper" in c.verdicts["better_costly"]
    d = c.deltas["same_cheap"]
    assert d[COST].ucb < 0 and d[QUALITY].lcb >= -0.01


def test_max_quality_stays_within_the_incumbents_budget_unless_given_one():
    c = choose(Objective(kind="max_quality"), _candidates(), "inc", "support", "f1", 500)
    assert c.key == "better_within"
    assert "over the budget" in c.verdicts["better_costly"]
    c2 = choose(Objective(kind="max_quality", budgets={"tokens": 1500}), _candidates(), "inc",
                "support", "f1", 500)
    assert c2.key == "better_costly"


def test_nothing_better_keeps_the_incumbent_and_says_why():
    cands = {k: v for k, v in _candidates().items() if k in ("inc", "worse_cheaper")}
    c = choose(Objective(kind="min_cost"), cands, "inc", "support", "f1", 500)
    assert not c.better and c.key == "inc"
    assert statement("min_cost", {}, 0.01, better=False, reason=c.reason).startswith(
        "the static default stays: no evaluated config was cheaper")


def test_floors_bind_only_the_metric_named_and_slo_binds_latency():
    cands = _candidates()
    low = np.full(N, 0.2)  # absolute quality far below 0.75
    cands = {"inc": _cols(low, 1000), "cheap": _cols(low, 300), "slow": _cols(low, 200, lat=900)}
    # F = recall@k-like metrics have no floor: the cheaper config wins on non-inferiority
    c = choose(Objective(), cands, "inc", "support", "f1", 500)
    assert c.key == "cheap"
    assert "p95 900 ms > SLO 500 ms" in c.verdicts["slow"]
    # a floor on the metric that plays F binds
    c2 = choose(Objective(quality_floors={"support": 0.75}), cands, "inc", "support", "f1", 500)
    assert not c2.better and "support 0.200 < floor 0.75" in c2.verdicts["cheap"]


def test_reward_objective_takes_the_search_pick():
    c = choose(Objective(kind="reward"), _candidates(), "inc", "support", "f1", 500,
               search_best="worse_cheaper")
    assert c.key == "worse_cheaper" and c.better


def test_statement_speaks_the_objectives_terms():
    a = _cols(_base_quality(), 1000)
    d = paired_deltas(_cols(a[QUALITY], 620), a)
    s = statement("min_cost", d, 0.01)
    assert s.startswith("-38% tokens") and "at non-inferior quality (margin 0.01" in s
    assert "reward" not in s
    d2 = paired_deltas(_cols(a[QUALITY] + 0.03, 950), a)
    s2 = statement("max_quality", d2, 0.01)
    assert s2.startswith("+0.0300 quality") and "at ≤ the default's cost" in s2
    d3 = paired_deltas(_cols(a[QUALITY] - 0.05, 500), a)
    assert "not shown non-inferior" in statement("min_cost", d3, 0.01)


def test_front_and_hypervolume():
    pts = np.array([[0.5, 100, 10], [0.6, 200, 10], [0.4, 300, 10],  # third: dominated
                    [0.6, 200, 5]])                                   # dominates the second
    assert nondominated(pts) == [0, 3]
    ref = np.array([0.0, 400.0, 20.0])
    # one point: a box (0.5 - 0) x (400 - 100) x (20 - 10)
    assert hypervolume(pts[:1], ref) == pytest.approx(0.5 * 300 * 10)
    # two points: union of two boxes minus their overlap
    two = hypervolume(pts[[0, 3]], ref)
    box0, box3 = 0.5 * 300 * 10, 0.6 * 200 * 15
    overlap = 0.5 * 200 * 10
    assert two == pytest.approx(box0 + box3 - overlap)
    # dominated points add nothing; a point outside the reference adds nothing
    assert hypervolume(pts, ref) == pytest.approx(two)
    assert hypervolume(np.array([[0.9, 500, 1]]), ref) == 0.0


def test_min_cost_picks_a_non_inferior_config_the_front_leaves_out(monkeypatch):
    # `tight` (-40% tokens, answers as the incumbent's but 0.001 lower) is dominated on point
    # estimates by `noisy` (-70% tokens, 0.001 higher mean, spread over every query), whose
    # lower bound fails the margin: the pick must look past the front to find `tight`
    from types import SimpleNamespace

    import rl.tuner.pareto as pareto

    settings = TunerSettings.defaults()
    inc = settings.base_config()
    tight, noisy = inc.replace(k=4), inc.replace(k=3)
    q = _base_quality()
    noise = np.random.default_rng(7).normal(0, 0.3, N)
    cols = {inc.config_hash: _cols(q, 1000), tight.config_hash: _cols(q - 0.001, 600),
            noisy.config_hash: _cols(q + noise - noise.mean() + 0.001, 300)}
    ev = SimpleNamespace(evaluate=lambda c, split: None,
                         table=lambda c, split: cols[c.config_hash],
                         slice=SimpleNamespace(tune_split="valid", faithfulness="support",
                                               relevancy="f1"),
                         thresholds=SimpleNamespace(p95_latency_ms=500.0))
    monkeypatch.setattr(pareto, "full_fidelity", lambda ev, split: [inc, tight, noisy])
    monkeypatch.setattr(pareto, "columns", lambda ev, tab: tab)
    p = pareto.build(ev, settings)
    assert tight.config_hash not in p.front and noisy.config_hash in p.front
    assert "not non-inferior" in p.choice.verdicts[noisy.config_hash]
    assert p.choice.better and p.choice.key == tight.config_hash
