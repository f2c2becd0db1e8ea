"""`serving.policy_router.PolicyRouter` without Ray, over the synthetic world's real indexes:
what a pick logs as its propensity is the exploring policy's probability of the drawn arm,
with and without a candidate policy explored beside it (candidate-aware exploration,
rl.routing.base), and a candidate on other arms or other features is refused by name.
The Serve app path of the same router is tests/test_serve_policy.py."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from rag.config import RAGConfig
from rag.errors import ConfigError

BASE = {"generator": "extractive"}
ARMS = [RAGConfig(**BASE), RAGConfig(**BASE, variant="bm25"), RAGConfig(**BASE, k=3)]


def _save(d: Path, seed: int, arms=ARMS, feature_names=None, base=None) -> Path:
    from rl.routing.base import RouterPolicy, save_policy
    from rl.routing.features import FEATURE_NAMES, N_FEATURES
    from rl.routing.router import RouterParams, SupervisedRouter

    rng = np.random.default_rng(seed)
    X = rng.normal(size=(200, N_FEATURES))
    R = rng.random((200, len(arms)))
    router = SupervisedRouter(RouterParams(max_iter=10, min_samples_leaf=10)).fit(X, R)
    return save_policy(RouterPolicy(router, arms), d, base_config=base or RAGConfig(**BASE),
                       feature_names=FEATURE_NAMES if feature_names is None else feature_names,
                       epsilon=0.1)


@pytest.fixture(scope="module")
def indexes():
    from rl.common.data import TuningData

    return TuningData.open("synthetic").indexes


def test_picks_log_the_mixture_propensity_with_and_without_a_candidate(indexes, tmp_path):
    from rag.corpus.synthetic import make_synthetic_world
    from rl.routing.base import Exploring
    from serving.policy_router import PolicyRouter

    served, cand = _save(tmp_path / "v1", 0), _save(tmp_path / "v2", 1)
    questions = [e.question for e in make_synthetic_world().examples[:40]]
    plain = PolicyRouter.open(str(served), indexes, 0.1, seed=3)
    mixed = PolicyRouter.open(str(served), indexes, 0.1, seed=3, candidate_dir=str(cand),
                              candidate_share=0.3)
    lp, lc = plain.loaded, mixed.candidate
    n_cand_arm = 0
    for q in questions:
        a, b = plain.pick(q), mixed.pick(q)
        assert a.features == b.features and a.candidate_id == "" and a.candidate_share == 0.0
        assert b.candidate_id == lc.policy_id and b.candidate_share == 0.3
        x = np.asarray([b.features])
        pa = Exploring(lp.policy, 0.1).probs(x)[0]
        pb = Exploring(lp.policy, 0.1, lc.policy, 0.3).probs(x)[0]
        assert a.propensity == pytest.approx(pa[a.arm])
        assert b.propensity == pytest.approx(pb[b.arm])
        c_arm = int(lc.policy.act(x)[0])
        assert pb[c_arm] >= 0.3 + 0.1 / len(ARMS) - 1e-12  # the candidate's choice
        assert pb.min() >= 0.1 / len(ARMS) - 1e-12  # the uniform floor
        n_cand_arm += b.arm == c_arm
    assert n_cand_arm >= 12  # >= share of 40 picks, drawn: a seeded count that could fail


def test_a_candidate_on_other_arms_or_features_is_refused(indexes, tmp_path):
    from rl.routing.features import FEATURE_NAMES
    from serving.policy_router import PolicyRouter

    served = _save(tmp_path / "v1", 0)
    other_arms = _save(tmp_path / "arms", 1, arms=[c.replace(k=c.k + 1) for c in ARMS])
    other_feats = _save(tmp_path / "feats", 1, feature_names=list(FEATURE_NAMES)[::-1])
    other_base = _save(tmp_path / "base", 1, base=RAGConfig(**BASE, variant="bm25"))
    for d, words in ((other_arms, "arms differ"), (other_feats, "other features"),
                     (other_base, "featurizer base config")):
        with pytest.raises(ConfigError) as e:
            PolicyRouter.open(str(served), indexes, 0.1, candidate_dir=str(d),
                              candidate_share=0.1)
        assert e.value.field == "candidate" and words in e.value.message



def test_a_conversational_policy_reads_the_turns_with_its_formulation_views(indexes, tmp_path):
    """A policy saved with formulation views (rl.routing.train on conversational data) is
    served by a featurizer rebuilt from its feature names: the picks' features have those
    columns and the earlier turns change them; a policy whose names are no featurizer's
    columns is refused by name."""
    from rl.routing.base import RouterPolicy, save_policy
    from rl.routing.features import CONVERSATION_VIEWS, RETRIEVAL_NAMES, feature_names
    from rl.routing.router import RouterParams, SupervisedRouter
    from serving.policy_router import PolicyRouter

    names = feature_names(CONVERSATION_VIEWS)
    rng = np.random.default_rng(0)
    router = SupervisedRouter(RouterParams(max_iter=10, min_samples_leaf=10)).fit(
        rng.normal(size=(200, len(names))), rng.random((200, len(ARMS))))
    d = save_policy(RouterPolicy(router, ARMS), tmp_path / "conv",
                    base_config=RAGConfig(**BASE), feature_names=names, epsilon=0.1)
    r = PolicyRouter.open(str(d), indexes, 0.1, seed=0)
    assert r.featurizer.formulations == CONVERSATION_VIEWS
    history = [{"role": "user", "text": "Which river runs through the capital?"},
               {"role": "agent", "text": "The capital is on a river [1]."}]
    alone, turn = r.pick("How long is it?"), r.pick("How long is it?", history)
    n, base = len(RETRIEVAL_NAMES), len(names) - 4 * len(RETRIEVAL_NAMES)
    assert len(alone.features) == len(turn.features) == len(names)
    assert not any(alone.features[base + 2 * n:])  # no turns: every view is the question
    assert any(turn.features[base + 2 * n:])  # the turns change what the views retrieve
    bad = _save(tmp_path / "bad", 1, feature_names=list(names)[::-1])
    with pytest.raises(ConfigError) as e:
        PolicyRouter.open(str(bad), indexes, 0.1)
    assert e.value.field == "policy" and "not this featurizer's columns" in e.value.message

def test_serve_settings_validate_the_candidate_fields():
    from serving.schemas import ServeSettings

    ok = ServeSettings.from_args({"traffic": {"mode": "policy"},
                                  "policy": {"dir": "p", "candidate_dir": "c",
                                             "candidate_share": 0.1}})
    assert ok.policy.candidate_share == 0.1
    for pol, words in (({"candidate_share": 0.1}, "needs candidate_dir"),
                       ({"candidate_dir": "c"}, "without candidate_share"),
                       ({"candidate_dir": "c", "candidate_share": 0.6}, "candidate_share"),
                       ({"candidate_dir": "c", "candidate_share": 0.5, "epsilon": 0.6},
                        "must not exceed 1")):
        with pytest.raises(ConfigError) as e:
            ServeSettings.from_args({"traffic": {"mode": "policy"},
                                     "policy": {"dir": "p", **pol}})
        assert e.value.field.startswith("serve.policy"), e.value
        assert words in f"{e.value.field}: {e.value.message}", e.value
