"""TrafficSplitter: canary split by percentage, stickiness, shadow mirroring, bandit mode (no
Ray)."""

from __future__ import annotations

import numpy as np
import pytest
from pydantic import ValidationError

from rag.errors import ConfigError
from serving.schemas import BanditSettings, TrafficSettings
from serving.traffic import TrafficSplitter, arm_probabilities, bucket


def _router(**traffic) -> TrafficSplitter:
    return TrafficSplitter("S", TrafficSettings(**traffic), canary="C", shadow="X")


def test_bucket_is_uniform_and_stable():
    xs = np.array([bucket(f"k{i}", "salt") for i in range(20_000)])
    assert xs.min() >= 0 and xs.max() < 100
    assert abs((xs < 10).mean() - 0.10) < 0.01 and abs((xs < 50).mean() - 0.5) < 0.015
    assert bucket("k1", "salt") == bucket("k1", "salt") != bucket("k1", "other salt")


def test_canary_share_and_propensity():
    r = _router(canary_percent=10.0)
    ds = [r.route(f"req-{i}") for i in range(20_000)]
    share = np.mean([d.variant == "C" for d in ds])
    assert abs(share - 0.10) < 0.01
    assert {d.propensity for d in ds if d.variant == "C"} == {0.1}
    assert {d.propensity for d in ds if d.variant == "S"} == {0.9}
    assert {d.route for d in ds} == {"stable", "canary"}
    assert all(d.shadow is None for d in ds)


def test_sticky_by_user_then_session_then_request():
    r = _router(canary_percent=30.0)
    for u in range(50):
        first = r.route("a", user_id=f"u{u}")
        assert all(r.route(f"b{i}", user_id=f"u{u}", session_id=f"s{i}").variant ==
                   first.variant for i in range(5))
        assert first.sticky_key == "user"
    assert r.route("x", session_id="s1").sticky_key == "session"
    assert r.route("x").sticky_key == "request"
    per_session = _router(canary_percent=30.0, sticky="session")
    assert per_session.route("x", user_id="u", session_id="s").sticky_key == "session"


def test_raising_the_canary_share_keeps_canary_users_on_canary():
    r = _router(canary_percent=5.0)
    before = {u for u in range(2000) if r.route("i", user_id=str(u)).variant == "C"}
    r.set_traffic(canary_percent=25.0)
    after = {u for u in range(2000) if r.route("i", user_id=str(u)).variant == "C"}
    assert before < after and abs(len(after) / 2000 - 0.25) < 0.03


def test_shadow_mirrors_a_fraction_never_the_served_variant():
    r = _router(canary_percent=50.0, shadow_percent=20.0)
    ds = [r.route(f"q{i}") for i in range(10_000)]
    mirrored = [d for d in ds if d.shadow]
    assert abs(len(mirrored) / len(ds) - 0.20) < 0.015
    assert {d.shadow for d in mirrored} == {"X"}
    r.set_traffic(canary=None, shadow="S")  # shadow == stable: nothing to compare
    assert all(r.route(f"q{i}").shadow is None for i in range(200))


def test_set_traffic_validates_and_removes():
    r = _router(canary_percent=10.0)
    with pytest.raises(ValidationError):
        r.set_traffic(canary_percent=150.0)
    assert r.traffic.canary_percent == 10.0
    state = r.set_traffic(canary=None)
    assert state["canary"] is None
    assert {r.route(f"q{i}").variant for i in range(100)} == {"S"}
    assert r.route("q").propensity == 1.0


def test_ucb1_probabilities_are_exact():
    r = TrafficSplitter("a", TrafficSettings(mode="bandit"), BanditSettings(algorithm="ucb1"),
               arms=["a", "b", "c"])
    d = r.route("q", category="x")
    assert d.route == "bandit" and d.propensity == pytest.approx(1 / 3)
    for arm, reward in (("a", 0.2), ("b", 0.9), ("c", 0.1)):
        r.update("x", arm, reward)
    d = r.route("q2", category="x")
    assert d.variant == "b" and d.propensity == 1.0


@pytest.mark.parametrize("algorithm", ["ucb1", "thompson"])
def test_bandit_learns_best_arm_per_category(algorithm):
    rng = np.random.default_rng(0)
    means = {"single": {"a": 0.8, "b": 0.3}, "bridge": {"a": 0.2, "b": 0.7}}
    r = TrafficSplitter("a", TrafficSettings(mode="bandit"),
               BanditSettings(algorithm=algorithm, prior_sd=0.5, noise_sd=0.5), arms=["a", "b"])
    for i in range(1500):
        cat = "single" if i % 2 else "bridge"
        d = r.route(f"q{i}", category=cat)
        assert 0 < d.propensity <= 1
        r.update(cat, d.variant, float(rng.random() < means[cat][d.variant]))
    board = r.leaderboard()
    assert board["single"][0]["arm"] == "a" and board["bridge"][0]["arm"] == "b"
    assert board["single"][0]["pulls"] > 400


def test_thompson_probabilities_sum_to_one_and_are_positive():
    r = TrafficSplitter("a", TrafficSettings(mode="bandit"), BanditSettings(algorithm="thompson"),
               arms=["a", "b", "c"])
    b = r._bandit_for("c")
    for _ in range(50):
        b.update("a", 1.0)
        b.update("b", 0.0)
    p = arm_probabilities(b, np.random.default_rng(0))
    assert sum(p.values()) == pytest.approx(1.0) and min(p.values()) > 0
    assert p["a"] > p["c"] > p["b"] and p["a"] > 0.75  # c: unpulled, wide prior


def test_bandit_state_is_bounded_and_validates():
    r = TrafficSplitter("a", TrafficSettings(mode="bandit"), BanditSettings(max_categories=2),
               arms=["a", "b"])
    for cat in ("x", "y", "z", "w"):
        r.route("q", category=cat)
    assert set(r.leaderboard()) == {"x", "y", "other"} and r.category_key("z") == "other"
    with pytest.raises(ConfigError):
        r.update("x", "a", 1.5)
    r.update("x", "gone", 1.0)  # an arm removed since: ignored
    r.update("x", "a", 1.0)
    r.add_arm("c")
    rows = {row["arm"]: row for row in r.leaderboard("x")["x"]}
    assert rows["a"]["pulls"] == 1 and rows["c"]["pulls"] == 0 and rows["c"]["mean_reward"] \
        is None
