"""The search benchmark's censored statistics (bench/search_stats.py): when a median over seeds
that never reached 99% of best-known is exact, when the acceptance ratio is only a bound, and
that parts run apart merge only when their rewards are comparable."""

from __future__ import annotations

import copy

import pytest
from bench.search import rows_for, target_of
from bench.search_stats import censored_median, median_ratio, merge_parts, reach


def curve(*pts):
    return [{"query_evals": q, "seconds": q / 10, "best_full": b} for q, b in pts]


def test_reach_is_the_first_point_at_the_target_within_the_budget():
    c = curve((100, None), (200, 0.5), (300, 0.9), (400, 1.0))
    assert reach(c, 0.9, budget=1000) == 300
    assert reach(c, 0.9, budget=1000, axis="seconds") == 30
    assert reach(c, 1.1, budget=1000) is None
    # reached only by the trial that ran past the budget: censored
    assert reach(c, 0.95, budget=350) is None


def test_median_is_exact_while_fewer_than_half_the_seeds_are_censored():
    b = [1000.0] * 5
    m = censored_median([100, 200, 300, None, None], b)
    assert m["median"] == 300 and m["exact"] and (m["reached"], m["censored"]) == (3, 2)
    m = censored_median([100, 200, None, None, None], b)
    assert m["median"] == 1000 and not m["exact"] and m["reached"] == 2
    # even n: both middle order statistics must be observed
    m4 = censored_median([100, 200, 300, None], [1000.0] * 4)
    assert m4["median"] == 250 and m4["exact"]
    m4 = censored_median([100, 200, None, None], [1000.0] * 4)
    assert m4["median"] == 600 and not m4["exact"]


def test_a_censored_seed_with_a_budget_below_the_middle_makes_the_median_a_bound():
    # seed 3 ran with a 150 budget and never reached: its value is only known to be > 150
    m = censored_median([100, 200, 300, None, 400], [1000, 1000, 1000, 150, 1000])
    assert m["median"] == 200 and not m["exact"]


def test_ratio_bound_and_verdict():
    exact = lambda v: {"median": v, "exact": True}  # noqa: E731
    bound = lambda v: {"median": v, "exact": False}  # noqa: E731
    assert median_ratio(exact(100), exact(400)) | {} == {
        "value": 0.25, "bound": "measured", "verdict": "met", "margin": pytest.approx(1 / 12)}
    assert median_ratio(exact(200), exact(400))["verdict"] == "missed"
    # TPE censored: its true median is larger, so the ratio can only fall
    r = median_ratio(exact(100), bound(400))
    assert (r["bound"], r["verdict"]) == ("upper", "met")
    assert median_ratio(exact(200), bound(400))["verdict"] == "undetermined"
    # the default searcher censored: the ratio can only rise
    r = median_ratio(bound(200), exact(400))
    assert (r["bound"], r["verdict"]) == ("lower", "missed")
    assert median_ratio(bound(100), exact(400))["verdict"] == "undetermined"
    assert median_ratio(bound(400), bound(400)) | {} == {
        "value": 1.0, "bound": "undetermined", "verdict": "undetermined",
        "margin": pytest.approx(-2 / 3)}


def _part(runs, budget=1000, best=1.0, cost=1.0):
    summ = {"reward": 0.5, "faithfulness": 0.5, "relevancy": 0.5, "cost": 100.0,
            "p95_latency_ms": 10.0}
    return {"dataset": "toy", "n_valid": 100, "n_test": 100, "budget": budget,
            "space_size": 10**6, "seeds": [], "warm_start": True,
            "default": {"valid": {**summ, "reward": 0.5}, "test": summ, "config_hash": "d"},
            "best_known": {"reward": best, "method": "tpe", "seed": 0, "config_hash": "b"},
            "weights": {"alpha": 0.5, "beta": 0.5},
            "cost_model": {"components": {"generate:extractive:cpu": {"intercept_ms": cost}}},
            "runs": runs}


def _run(seed, reached_at, budget=1000):
    pts = [(100, 0.5)] + ([(reached_at, 1.0)] if reached_at else []) + [(budget, None)]
    c = curve(*pts)
    for i in range(1, len(c)):  # a running best
        c[i]["best_full"] = max(p["best_full"] or 0 for p in c[:i + 1])
    return {"seed": seed, "budget": budget, "curve": c, "best_reward": c[-1]["best_full"],
            "test": {"reward": 0.6, "faithfulness": 0.6, "relevancy": 0.6, "cost": 90.0,
                     "p95_latency_ms": 9.0}, "seconds": budget / 10}


def test_rows_give_the_acceptance_ratio_with_its_bound_and_reach_counts():
    asha = [_run(s, 200) for s in range(4)] + [_run(4, None)]
    tpe = [_run(s, None) for s in range(3)] + [_run(3, 900), _run(4, 800)]
    rows, _ = rows_for(_part({"tpe-asha": asha, "tpe": tpe}))
    by = {(r["system"], r["metric"]): r for r in rows}
    e = by[("tpe-asha", "evals_to_99pct")]
    assert (e["value"], e["reached"], e["censored"], e["median_exact"]) == (200, 4, 1, True)
    t = by[("tpe", "evals_to_99pct")]
    assert (t["value"], t["reached"], t["median_exact"]) == (1000, 2, False)
    ratio = by[("tpe-asha", "evals_to_99pct_ratio_vs_tpe")]
    assert ratio["value"] == pytest.approx(0.2)
    assert (ratio["bound"], ratio["verdict"]) == ("upper", "met")
    assert ratio["reached"] == {"tpe-asha": 4, "tpe": 2}
    assert ratio["ci_low"] <= ratio["value"] <= ratio["ci_high"]
    assert target_of(1.0) == pytest.approx(0.99) and target_of(-1.0) == pytest.approx(-1.01)


def test_parts_merge_by_searcher_and_refuse_incomparable_rewards():
    a = _part({"tpe": [_run(0, 200), _run(1, 300)]}, best=1.0)
    b = _part({"tpe": [_run(2, 400)], "random": [_run(0, None)]}, best=1.2)
    (m,) = merge_parts([copy.deepcopy(a), copy.deepcopy(b)])
    assert [r["seed"] for r in m["runs"]["tpe"]] == [0, 1, 2]
    assert set(m["runs"]) == {"tpe", "random"} and m["best_known"]["reward"] == 1.2
    with pytest.raises(ValueError, match="seed"):
        merge_parts([copy.deepcopy(a), copy.deepcopy(a)])
    with pytest.raises(ValueError, match="cost model"):
        merge_parts([copy.deepcopy(a), _part({"random": [_run(0, 100)]}, cost=2.0)])


def test_a_fixed_earlier_target_is_reported_beside_the_moving_best_known():
    asha = [_run(s, 200) for s in range(3)]
    tpe = [_run(s, 500) for s in range(3)]
    part = _part({"tpe-asha": asha, "tpe": tpe}, best=1.2)  # this run's best-known: 1.2
    part["earlier_best"] = {"reward": 1.0, "method": "earlier-run", "source": "x"}
    rows, _ = rows_for(part)
    by = {(r["system"], r["metric"]): r for r in rows}
    # 99% of 1.2 is above every curve: censored; 99% of the earlier 1.0 is reached
    assert by[("tpe-asha", "evals_to_99pct")]["reached"] == 0
    fixed = by[("tpe-asha", "evals_to_99pct_of_earlier_best_ratio_vs_tpe")]
    assert fixed["value"] == pytest.approx(200 / 500) and fixed["bound"] == "measured"
    assert fixed["verdict"] == "missed" and fixed["target"] == pytest.approx(0.99)
