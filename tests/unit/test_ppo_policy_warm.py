"""Behaviour-cloning warm start of the per-query PPO policy (no Ray runtime): `HeadLayout.encode`
inverts `decode`, and a cloned module's greedy configs are the cloned ones (one config for
all queries, or one per query from the features)."""

from __future__ import annotations

import numpy as np
import pytest

from rag.config import RAGConfig
from rl.kernel.settings import TunerSettings
from rl.routing.heads import HeadLayout
from rl.routing.ppo_policy import PerQueryPPO
from rl.routing.settings import HeadSettings, PPOPolicySettings, WarmStartSettings
from rl.routing.warm_start import WarmStart, clone

pytest.importorskip("ray.rllib")


@pytest.fixture(scope="module")
def layout() -> HeadLayout:
    return HeadLayout(HeadSettings(), TunerSettings.defaults())


def _cfg(layout: HeadLayout, **kw) -> RAGConfig:
    a = {"variant": layout.variants.index("bm25"), "k": layout.ks.index(2), "rerank": 0,
         "generator": 0, "mmr_lambda": np.array([1.0]), "fusion_weight": np.array([0.5]),
         "abstain_threshold": np.array([0.5]), "normalisation": 0}
    a.update(kw)
    return layout.decode({h: a[h] for h in layout.names})


def test_encode_inverts_decode(layout):
    space = layout.action_space()
    space.seed(0)
    for _ in range(200):
        c = layout.decode(space.sample())
        a, exact = layout.encode(c)
        assert exact and layout.decode(a).config_hash == c.config_hash


def test_encode_flags_a_config_no_head_can_express(layout):
    hybrid = _cfg(layout, variant=layout.variants.index("hybrid"), rerank=1)
    c = hybrid.replace(rerank_mix=0.5)  # no head sets the rerank mix
    a, exact = layout.encode(c)
    assert not exact
    assert layout.decode(a).variant == "hybrid" and layout.decode(a).k == 2
    # the normalisation head expresses hybrid's zscore / rrf (the router's arms need them)
    for norm in ("zscore", "rrf"):
        a, exact = layout.encode(hybrid.replace(normalisation=norm))
        assert exact and layout.decode(a).normalisation == norm
    narrow = HeadLayout(HeadSettings(normalisations=("minmax",)), TunerSettings.defaults())
    assert not narrow.encode(hybrid.replace(normalisation="rrf"))[1]


def _policy(layout, X):
    s = PPOPolicySettings.load()
    return PerQueryPPO.create(layout, s, X)


def test_cloned_module_acts_the_single_target(layout):
    X = np.random.default_rng(1).normal(size=(120, 6)).astype(np.float32)
    target = _cfg(layout, variant=layout.variants.index("hybrid"), k=layout.ks.index(3),
                  fusion_weight=np.array([0.7]), rerank=1)
    pol = _policy(layout, X)
    module = pol.spec().build()
    fit = clone(module, layout, pol.standardise(X), WarmStart("b1", [target]).targets(120),
                np.full(120, 0.4), WarmStartSettings(), seed=0)
    assert fit["expressible"] == 1.0 and fit["greedy_agreement"] == 1.0
    pol.module = module
    assert {c.config_hash for c in pol.act(X)} == {target.config_hash}
    # the probabilities keep exploration: `keep` on the target, the rest spread
    P = pol.probs(X)
    assert np.allclose(P["variant"][:, layout.variants.index("hybrid")], 0.9, atol=0.03)
    assert np.all(P["k"].min(axis=1) > 0.002)


def test_cloned_module_follows_per_query_targets(layout):
    X = np.random.default_rng(2).normal(size=(200, 4)).astype(np.float32)
    bm25, dense = _cfg(layout), _cfg(layout, variant=layout.variants.index("dense"),
                                     k=layout.ks.index(8))
    targets = [bm25 if x < 0 else dense for x in X[:, 0]]
    pol = _policy(layout, X)
    module = pol.spec().build()
    fit = clone(module, layout, pol.standardise(X), targets, None, WarmStartSettings(), seed=0)
    assert fit["greedy_agreement"] >= 0.95
    pol.module = module
    Xn = np.random.default_rng(3).normal(size=(100, 4)).astype(np.float32)
    got = [c.config_hash for c in pol.act(Xn)]
    want = [(bm25 if x < 0 else dense).config_hash for x in Xn[:, 0]]
    assert np.mean(np.array(got) == np.array(want)) >= 0.9


def test_warm_start_needs_one_target_or_one_per_query(layout):
    with pytest.raises(ValueError, match="3 targets for 5"):
        WarmStart("x", [_cfg(layout)] * 3).targets(5)


def test_selection_keeps_the_earlier_candidate_on_ties_and_prefers_feasible():
    from rl.routing.selection import better_on_valid

    warm = {"valid_reward": 0.50, "valid_cost": 1.0}
    assert not better_on_valid({"valid_reward": 0.50, "valid_cost": 0.9}, warm, cap=1.05)
    assert not better_on_valid({"valid_reward": 0.49, "valid_cost": 0.5}, warm, cap=1.05)
    assert better_on_valid({"valid_reward": 0.51, "valid_cost": 1.0}, warm, cap=1.05)
    # a higher reward over the budget never replaces a feasible start
    assert not better_on_valid({"valid_reward": 0.90, "valid_cost": 2.0}, warm, cap=1.05)
    assert better_on_valid(warm, {"valid_reward": 0.90, "valid_cost": 2.0}, cap=1.05)


def test_the_evidence_rule_needs_a_gain_whose_paired_ci_is_above_zero():
    from rl.routing.selection import has_evidence, replaces

    rng = np.random.default_rng(0)
    inc = rng.uniform(0, 1, 100)
    noise = rng.normal(0.0, 0.2, 100)
    noisy = inc + 0.01 + noise - noise.mean()  # +0.01 on average, CI spans 0
    steady = inc + rng.uniform(0.005, 0.02, 100)  # small but on every query
    assert noisy.mean() > inc.mean() and not has_evidence(noisy, inc)
    assert has_evidence(steady, inc)
    best = {"valid_reward": float(inc.mean()), "valid_cost": 1.0}

    def rec(r, cost=1.0):
        return {"valid_reward": float(np.mean(r)), "valid_cost": cost}

    # the mean rule takes the lucky checkpoint, the evidence rule keeps the incumbent
    assert replaces(rec(noisy), best, 1.05, noisy, inc, rule="mean")
    assert not replaces(rec(noisy), best, 1.05, noisy, inc, rule="evidence")
    assert replaces(rec(steady), best, 1.05, steady, inc, rule="evidence")
    # feasibility still comes first: an infeasible incumbent is replaced without evidence,
    # and a lower mean never replaces, whatever the rule
    assert replaces(rec(noisy), {**best, "valid_cost": 2.0}, 1.05, noisy, inc, "evidence")
    assert not replaces(rec(inc - 0.01), best, 1.05, inc - 0.01, inc, "evidence")
    assert replaces(rec(noisy), None, 1.05, noisy, None, "evidence")  # nothing to beat yet
    with pytest.raises(ValueError, match="both per-query"):
        replaces(rec(steady), best, 1.05, steady, None, "evidence")
    with pytest.raises(ValueError, match="different queries"):
        has_evidence(steady[:50], inc)
    with pytest.raises(ValueError, match="unknown selection rule"):
        replaces(rec(steady), best, 1.05, steady, inc, "vote")


def test_a_policy_saved_before_the_normalisation_head_still_loads(tmp_path):
    import json

    old = HeadSettings(normalisations=("minmax",))
    layout = HeadLayout(old, TunerSettings.defaults())
    s = PPOPolicySettings.load()
    s = s.model_copy(update={"heads": old})
    X = np.random.default_rng(0).normal(size=(20, 4)).astype(np.float32)
    pol = PerQueryPPO.create(layout, s, X)
    pol.module = pol.spec().build()
    pol.save(tmp_path)
    j = json.loads((tmp_path / "policy.json").read_text())
    del j["settings"]["heads"]["normalisations"]  # what an older version wrote
    (tmp_path / "policy.json").write_text(json.dumps(j))
    back = PerQueryPPO.load(tmp_path)
    assert "normalisation" not in back.layout.names
    assert [c.config_hash for c in back.act(X)] == [c.config_hash for c in pol.act(X)]


def test_a_defer_clone_acts_as_the_base_policy_and_needs_its_configs():
    d = HeadLayout(HeadSettings(defer=True), TunerSettings.defaults())
    rng = np.random.default_rng(4)
    X = rng.normal(size=(150, 5)).astype(np.float32)
    bm25, dense = _cfg(layout=d, defer=0), _cfg(d, variant=d.variants.index("dense"), defer=0)
    base = [bm25 if x < 0 else dense for x in X[:, 1]]
    s = PPOPolicySettings.load().model_copy(update={"heads": HeadSettings(defer=True)})
    pol = PerQueryPPO.create(d, s, X)
    module = pol.spec().build()
    fit = clone(module, d, pol.standardise(X), base, None, WarmStartSettings(), seed=0,
                defer=True, base=base)
    assert fit["greedy_agreement"] == 1.0
    pol.module = module
    assert pol.deferred(X).all()
    # acting defers: whatever base it is handed comes back, row by row
    other = list(reversed(base))
    assert [c.config_hash for c in pol.act(X, other)] == [c.config_hash for c in other]
    P = pol.probs(X)
    assert np.allclose(P["defer"][:, 1], 0.9, atol=0.03)  # keep: PPO still explores
    _, props = pol.sample(X[:20], np.random.default_rng(0), base[:20])
    assert np.all(props > 0)
    with pytest.raises(ValueError, match="defer head and needs the base"):
        pol.act(X)
    with pytest.raises(ValueError, match="needs a layout with the defer head"):
        clone(_policy(HeadLayout(HeadSettings(), TunerSettings.defaults()), X).spec().build(),
              HeadLayout(HeadSettings(), TunerSettings.defaults()), X, base, None,
              WarmStartSettings(), defer=True, base=base)
