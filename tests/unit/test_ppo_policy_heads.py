"""The per-query PPO policy without Ray running: gated heads are masked out of the
log-probability (and weighted in entropy), the PPO-Lagrangian multiplier update and its trip
to the envs, action -> RAGConfig decoding with snapped continuous heads, propensity masses."""

from __future__ import annotations

import numpy as np
import pytest

from rag.errors import ConfigError
from rl.kernel.settings import TunerSettings
from rl.routing.heads import HeadLayout, active_masks, masked_sum
from rl.routing.ppo_policy import _BUNDLES, PolicyEnv, _pop_costs, _set_lambda, lagrange_update
from rl.routing.settings import HeadSettings, PPOPolicySettings
from rl.routing.worlds import Outcome


@pytest.fixture(scope="module")
def layout() -> HeadLayout:
    return HeadLayout(HeadSettings(), TunerSettings.defaults())


def _action(layout, variant="bm25", w=0.3, arm=0, **kw):
    a = {"variant": layout.variants.index(variant), "k": layout.ks.index(5), "rerank": 0,
         "generator": arm, "mmr_lambda": np.array([1.0]), "fusion_weight": np.array([w]),
         "abstain_threshold": np.array([0.5]), "normalisation": 0}
    a.update(kw)
    return {h: a[h] for h in layout.names}


# ---- masking ------------------------------------------------------------------------------------
def test_gates_name_the_no_op_heads(layout):
    assert layout.gates["fusion_weight"] == ("variant", (layout.variants.index("hybrid"),))
    assert layout.gates["abstain_threshold"][0] == "generator"
    assert layout.gates["normalisation"] == layout.gates["fusion_weight"]
    one = HeadLayout(HeadSettings(normalisations=("zscore",)), TunerSettings.defaults())
    assert "normalisation" not in one.names  # one value: no head, hybrid always uses it
    assert one.decode(_action(one, "hybrid")).normalisation == "zscore"
    assert "query_formulation" not in layout.names  # single-turn data: no such head
    conv = HeadLayout(HeadSettings(), TunerSettings.defaults(), conversational=True)
    assert "query_formulation" in conv.names


def test_masked_sum_drops_inactive_terms():
    acts = {"variant": np.array([0, 2, 2])}
    m = active_masks(acts, {"fusion_weight": ("variant", (2,))})
    assert m["fusion_weight"].tolist() == [0.0, 1.0, 1.0]
    total = masked_sum({"variant": np.array([1.0, 1.0, 1.0]),
                        "fusion_weight": np.array([5.0, 5.0, 5.0])}, m)
    assert total.tolist() == [1.0, 6.0, 6.0]


def _dist(layout, seed=0):
    torch = pytest.importorskip("torch")
    pytest.importorskip("ray.rllib")
    from ray.rllib.core.distribution.torch.torch_distribution import (
        TorchCategorical,
        TorchDiagGaussian,
    )

    from rl.routing.ppo_module import MaskedHeadsDistribution

    g = torch.Generator().manual_seed(seed)
    logits = {}
    for h in layout.names:
        n = layout.discrete.get(h, 2)
        logits[h] = torch.randn(1, n, generator=g, requires_grad=True)
    kids = {h: (TorchCategorical if h in layout.discrete else TorchDiagGaussian)
            .from_logits(x) for h, x in logits.items()}
    return MaskedHeadsDistribution(kids, gates=layout.gates_spec()), logits, torch


def test_inactive_head_log_prob_is_excluded(layout):
    dist, logits, torch = _dist(layout)

    def t(a):
        return {h: torch.as_tensor(np.atleast_1d(v) if h in layout.discrete
                                   else np.asarray(v, dtype=np.float32).reshape(1, 1))
                for h, v in a.items()}

    # variant bm25: the fusion weight does nothing, so its value must not move logp ...
    lp1 = dist.logp(t(_action(layout, "bm25", w=-0.9)))
    lp2 = dist.logp(t(_action(layout, "bm25", w=0.8)))
    assert torch.allclose(lp1, lp2)
    # ... and its logits get no gradient
    lp1.sum().backward()
    assert torch.count_nonzero(logits["fusion_weight"].grad) == 0
    assert torch.count_nonzero(logits["variant"].grad) > 0
    # hybrid: the same head now counts
    dist2, logits2, _ = _dist(layout)
    h1 = dist2.logp(t(_action(layout, "hybrid", w=-0.9)))
    h2 = dist2.logp(t(_action(layout, "hybrid", w=0.8)))
    assert not torch.allclose(h1, h2)
    h1.sum().backward()
    assert torch.count_nonzero(logits2["fusion_weight"].grad) > 0
    # the per-head sum minus the inactive heads' terms is what logp returns
    parts = dist.head_logps(t(_action(layout, "bm25", w=0.8, arm=0)))
    expect = sum(v for h, v in parts.items()
                 if h not in ("fusion_weight", "abstain_threshold", "normalisation"))
    assert torch.allclose(lp2, expect)


def test_gated_entropy_counts_by_gate_probability(layout):
    dist, _, torch = _dist(layout, seed=3)
    kids = dist._children()
    p_hyb = kids["variant"]._dist.probs[0, layout.variants.index("hybrid")]
    p_abs = kids["generator"]._dist.probs[0, list(layout.gates["abstain_threshold"][1])].sum()
    expect = sum(d.entropy() for h, d in kids.items()
                 if h not in ("fusion_weight", "abstain_threshold", "normalisation"))
    expect = expect + p_hyb * (kids["fusion_weight"].entropy()
                               + kids["normalisation"].entropy()) \
        + p_abs * kids["abstain_threshold"].entropy()
    assert torch.allclose(dist.entropy(), expect)


# ---- PPO-Lagrangian -----------------------------------------------------------------------------
def test_lambda_rises_over_budget_and_falls_to_zero_under_it():
    lam = 0.0
    for _ in range(3):
        new = lagrange_update(lam, mean_cost=0.5, budget=0.2, lr=2.0, lam_max=5.0)
        assert new > lam
        lam = new
    assert lam == pytest.approx(1.8)
    assert lagrange_update(4.9, 3.0, 0.2, 2.0, 5.0) == 5.0  # capped
    for _ in range(10):
        lam = lagrange_update(lam, mean_cost=0.1, budget=0.2, lr=2.0, lam_max=5.0)
    assert lam == 0.0  # projected: never negative


class _World:
    n, cost_ref = 3, 1000.0

    def outcome(self, i, config):
        return Outcome(1.0, 1.0, config.k / 10)

    def outcomes(self, configs):
        return [self.outcome(i, c) for i, c in enumerate(configs)]


def test_lambda_reaches_the_env_and_prices_its_reward(layout):
    _BUNDLES["t"] = {"world": _World(), "layout": layout, "X": np.zeros((3, 2))}
    try:
        env = PolicyEnv({"bundle": "t", "seed": 0, "lam": 0.0})

        class Runner:  # what `foreach_env_runner` hands the functions: a runner with a vector env
            class env:  # noqa: N801
                class unwrapped:  # noqa: N801
                    envs = [env]

        env.reset()
        assert env.step(_action(layout))[1] == pytest.approx(1.0)
        _set_lambda(2.0)(Runner)
        assert env.lam == 2.0
        assert env.step(_action(layout))[1] == pytest.approx(1.0 - 2.0 * 0.5)
        assert _pop_costs(Runner) == [0.5, 0.5] and env.costs == []
    finally:
        _BUNDLES.pop("t")


# ---- decoding -----------------------------------------------------------------------------------
def test_decode_snaps_and_canonicalises(layout):
    c = layout.decode(_action(layout, "hybrid", w=0.33))
    assert c.variant == "hybrid" and c.k == 5 and c.rerank == "none"
    assert c.fusion_weight == pytest.approx(0.3)  # u=0.33 on [0, 1], snapped to 0.1
    # non-hybrid: the fusion weight is canonical, so two weights give one config (cache hit)
    a, b = (layout.decode(_action(layout, "bm25", w=w)) for w in (0.1, 0.9))
    assert a.config_hash == b.config_hash
    # the abstain threshold acts only on the extractive *_abstain arm
    plain = [layout.decode(_action(layout, arm=0, abstain_threshold=np.array([u])))
             for u in (0.0, 1.0)]
    assert plain[0].config_hash == plain[1].config_hash and plain[0].abstain_threshold is None
    arm = layout.gates["abstain_threshold"][1][0]
    thr = layout.decode(_action(layout, arm=arm, abstain_threshold=np.array([1.0])))
    assert thr.prompt_id.endswith("_abstain") and thr.abstain_threshold == pytest.approx(0.8)
    depth = layout.decode(_action(layout, rerank=layout.depths.index(10),
                                  k=layout.ks.index(16)))
    assert depth.rerank != "none" and depth.rerank_depth == 16  # raised to k


def test_snapped_value_masses_sum_to_one(layout):
    box = layout.boxes["mmr_lambda"]
    m = box.bin_masses(0.2, 0.7)
    assert set(m) == set(box.values()) and sum(m.values()) == pytest.approx(1.0)
    assert box.values() == pytest.approx([0.5, 0.6, 0.7, 0.8, 0.9, 1.0])


def test_settings_reject_unknown_keys_and_bad_values():
    s = PPOPolicySettings.load()
    assert s.train.seeds == (0, 1, 2, 3, 4)
    with pytest.raises(ConfigError):
        PPOPolicySettings.from_mapping({"heads": {"kk": [1]}})
    with pytest.raises(ConfigError):
        PPOPolicySettings.from_mapping({"heads": {"ks": [0, 40]}})


# ---- the defer head (a residual policy over a base policy) ---------------------------------------
def test_defer_gates_every_other_head_and_chains_with_variant():
    d = HeadLayout(HeadSettings(defer=True), TunerSettings.defaults())
    assert "defer" in d.names and d.discrete["defer"] == 2
    assert all(d.gates[h] == ("defer", (0,)) for h in d.names
               if h not in ("defer", "fusion_weight", "normalisation", "abstain_threshold"))
    own = _action(d, "hybrid", arm=1, defer=0)  # arm 1: the abstain arm, so every head acts
    assert all(d.active(own).values())
    assert d.active({**own, "defer": 1}) == {h: h == "defer" for h in d.names}
    # the fusion weight acts only when defer == 0 *and* the variant is hybrid
    assert not d.active(_action(d, "bm25", defer=0))["fusion_weight"]
    acts = {"defer": np.array([0, 1, 0]), "variant": np.array([2, 2, 0])}
    acts.update({h: np.zeros(3) for h in ("generator",)})
    m = active_masks(acts, d.gates)
    assert m["fusion_weight"].tolist() == [1.0, 0.0, 0.0] and m["k"].tolist() == [1, 0, 1]
    # gate weights multiply along the chain: P(defer=0) * P(variant=hybrid)
    from rl.routing.heads import gate_weights

    probs = {"defer": np.array([[0.25, 0.75]]), "variant": np.array([[0.1, 0.1, 0.6, 0.2]]),
             "generator": np.array([[0.5, 0.5]])}
    w = gate_weights(probs, d.gates)
    assert np.isclose(w["fusion_weight"][0], 0.25 * 0.6) and np.isclose(w["k"][0], 0.25)
    with pytest.raises(ValueError, match="cycle"):
        gate_weights(probs, {"a": ("b", (0,)), "b": ("a", (0,))})


def test_defer_decodes_to_the_base_config_and_needs_one():
    d = HeadLayout(HeadSettings(defer=True), TunerSettings.defaults())
    base = d.decode(_action(d, "dense", defer=0))
    assert d.decode(_action(d, "bm25", defer=1), base).config_hash == base.config_hash
    assert d.decode(_action(d, "bm25", defer=0), base).variant == "bm25"
    with pytest.raises(ValueError, match="no base config"):
        d.decode(_action(d, "bm25", defer=1))
    a, exact = d.encode(base)  # encode never defers: it names the config with the heads
    assert exact and a["defer"] == 0
