"""Policy config validation, the reward function, gates, and the action space (pure, fast)."""

import numpy as np
import pytest
import yaml

from rag.errors import ConfigError
from rl.kernel.reward import StepMetrics, gates, reward
from rl.kernel.settings import DEFAULTS_PATH, TunerSettings
from rl.kernel.space import ConfigSpace

ISSUE_EXAMPLE = """
policy: {bounds: {k: {min: 3, max: 32}, fusion_weight: {min: 0.0, max: 1.0}},
         discrete: {variant: [A, B], rerank: [off, on]},
         thresholds: {faithfulness: 0.75, relevancy: 0.75, p95_latency_ms: 500},
         reward_weights: {alpha: 0.5, beta: 0.5, gamma: 0.2, delta: 0.2, lambda: 1.0}}
"""


def test_issue_example_loads_as_is_and_labels_resolve_through_variants():
    p = TunerSettings.from_dict(yaml.safe_load(ISSUE_EXAMPLE))
    assert p.discrete.variant == ("A", "B") and p.discrete.rerank == ("off", "on")
    assert p.reward_weights.lambda_ == 1.0 and p.thresholds.p95_latency_ms == 500
    with pytest.raises(ConfigError, match="policy.discrete.variant"):
        ConfigSpace(p)  # A/B mean nothing until defined
    p2 = p.with_overrides(variants={"A": {"variant": "bm25"},
                                    "B": {"variant": "hybrid", "fusion_weight": 0.3}})
    space = ConfigSpace(p2)
    cfg = space.to_config({"variant": 1, "k": 0, "rerank": 1, "fusion_weight": [0.72],
                           "prompt": 0})
    assert (cfg.variant, cfg.k, cfg.rerank, cfg.fusion_weight) == ("hybrid", 3, "cosine", 0.7)


def test_defaults_file_matches_model_defaults():
    file = TunerSettings.from_yaml(DEFAULTS_PATH).model_dump()
    model = TunerSettings().model_dump()
    for key in model:
        if key != "datasets":
            assert file[key] == model[key], key
    assert set(file["datasets"]) >= {"hotpotqa", "scifact", "mtrag", "synthetic"}


@pytest.mark.parametrize(("data", "field"), [
    ({"bounds": {"k": {"min": 40, "max": 32}}}, "policy.bounds.k"),
    ({"bogus": 1}, "policy.bogus"),
    ({"reward_weights": {"alpha": -1}}, "policy.reward_weights.alpha"),
    ({"k_grid": [50]}, "policy.k_grid"),
    ({"base": {"k": 99}}, "policy.base.k"),
    ({"discrete": {"rerank": ["maybe"]}}, "policy.discrete.rerank"),
    ({"variants": {"A": {"variant": "x"}}}, "policy.variants.A.variant"),
    ({"episode": {"length": 0}}, "policy.episode.length"),
    ({"thresholds": {"relevancy": 1.5}}, "policy.thresholds.relevancy"),
])
def test_bad_policy_names_the_key(data, field):
    with pytest.raises(ConfigError) as e:
        TunerSettings.from_dict(data)
    assert e.value.field.startswith(field)


def test_bad_policy_file(tmp_path):
    f = tmp_path / "p.yaml"
    f.write_text("policy:\n  episode: {length: 5, batch: 3}\n")
    with pytest.raises(ConfigError, match="policy.episode.batch: unknown key"):
        TunerSettings.from_yaml(f)


def test_reward_by_hand():
    p = TunerSettings()
    m = StepMetrics(faithfulness=0.8, relevancy=0.6, p95_latency_ms=250, cost=500)
    r, v = reward(m, p.reward_weights, p.thresholds.model_copy(update={"relevancy": 0.5}),
                  1000, 0.05)
    # 0.5*0.8 + 0.5*0.6 - 0.2*0.5 - 0.2*0.5 - 1.0*0 = 0.5
    assert r == pytest.approx(0.5) and v.passed
    # relevancy gate (0.75) fails: one penalty
    r2, v2 = reward(m, p.reward_weights, p.thresholds, 1000, 0.05)
    assert r2 == pytest.approx(-0.5) and v2.failed == ["relevancy"]
    # latency and cost terms saturate at 2; instability adds 0.5
    slow = StepMetrics(0.8, 0.8, p95_latency_ms=10_000, cost=50_000, quality_se=0.2)
    r3, v3 = reward(slow, p.reward_weights, p.thresholds, 1000, 0.05)
    assert r3 == pytest.approx(0.8 - 0.4 - 0.4 - 1.0 - 0.5)
    assert v3.failed == ["p95_latency_ms"] and not v3.stable
    assert gates(m, p.thresholds, 0.05).as_dict()["passed"] is False


def test_space_grid_and_round_trip():
    # the space before issue 18 (the default one has > 10^6 configs: tests/unit/test_config_space.py)
    p = TunerSettings.defaults().with_legacy_space()
    space = ConfigSpace(p)
    grid = list(space.grid())
    # bm25/dense/graph: 9 k x 2 rerank x 2 prompts; hybrid also 11 fusion weights
    assert len(grid) == 3 * 9 * 2 * 2 + 11 * 9 * 2 * 2
    assert len({c.config_hash for c in grid}) == len(grid)
    for cfg in grid[::37]:
        assert space.to_config(space.to_action(cfg)) == cfg
    assert space.action_space().contains(space.to_action(grid[0]))
    # non-hybrid configs ignore the weight: equal configs hash equal
    a = space.make("bm25", 5, "off", 0.1, "cite_concise")
    b = space.make("bm25", 5, "off", 0.9, "cite_concise")
    assert a.config_hash == b.config_hash


def test_delta_mode_moves_one_grid_step_and_clips():
    p = TunerSettings.defaults().with_overrides(action_mode="delta").with_legacy_space()
    space = ConfigSpace(p)
    cur = space.make("hybrid", 5, "off", 0.5, "cite_concise")
    up = space.to_config({"variant": 2, "k": 2, "rerank": 0, "fusion_weight": [0.12],
                          "prompt": 0}, cur)
    assert up.k == 6 and up.fusion_weight == pytest.approx(0.6)
    down = space.to_config({"variant": 2, "k": 0, "rerank": 0, "fusion_weight": [-0.25],
                            "prompt": 0}, space.make("hybrid", 3, "off", 0.1, "cite_concise"))
    assert down.k == 3 and down.fusion_weight == 0.0
    assert space.action_space()["k"].n == 3
    assert np.isclose(space.action_space()["fusion_weight"].high[0], 0.25)


def test_robust_scaler_centres_scales_and_clips():
    from rl.tuner.features import RobustScaler, StateTracker

    rng = np.random.default_rng(0)
    x = np.column_stack([rng.normal(5, 2, 2001), np.full(2001, 7.0)])
    s = RobustScaler().fit(x)
    z = s.transform(x)
    assert abs(np.median(z[:, 0])) < 1e-9 and 0.9 < z[:, 0].std() < 1.1
    assert np.all(z[:, 1] == 0)  # a constant feature maps to 0, not to inf
    assert s.transform(np.array([1e6, 7.0]))[0] == 3.0  # clipped to +3 sigma
    t = StateTracker(["bridge", "comparison"], config_dim=4, n_passages=1000,
                     latency_gate_ms=500, cost_ref=1000)
    t.update(0.8, 0.4, 100, 250, 500, 0.3)
    obs = t.observe(np.ones(4, dtype=np.float32), ["bridge", "bridge", "comparison"], 0.5)
    assert obs.shape == (t.dim,)
    mix = obs[6 + 4: 6 + 4 + 2]
    assert np.allclose(mix, [2 / 3, 1 / 3])
