"""The per-query policy served by the real Serve app (issue 19, item 5): with the traffic mode
`policy`, the Policy deployment picks a config per request from the question's features with
ε-exploration and a candidate policy explored beside it (candidate-aware exploration), answers
with it, and the interaction log keeps the propensity (the mixture's), arm, policy id, candidate
id and features hash of every pick; the OPE gate evaluates a candidate policy from that log.

Synthetic world, extractive generator, a 3-arm router fitted on random features (what the
policy chooses is not under test here, only that it is served and logged). Deployed on the
session's shared Serve runtime (tests/conftest.py `serve_app`) like tests/test_serving_app.py.
"""

from __future__ import annotations

import sqlite3
from pathlib import Path

import httpx
import numpy as np
import pytest

from rag.config import RAGConfig

pytestmark = pytest.mark.ray

BASE = {"generator": "extractive"}
ARMS = [RAGConfig(**BASE), RAGConfig(**BASE, variant="bm25"), RAGConfig(**BASE, k=3)]
EPSILON = 0.3
SHARE = 0.2
"""The candidate policy's share (candidate-aware exploration, rl.routing.base)."""


def _save_policy(d: Path, seed: int = 0) -> Path:
    from rl.routing.base import RouterPolicy, save_policy
    from rl.routing.features import FEATURE_NAMES, N_FEATURES
    from rl.routing.router import RouterParams, SupervisedRouter

    rng = np.random.default_rng(seed)
    X = rng.normal(size=(200, N_FEATURES))
    R = rng.random((200, len(ARMS)))
    router = SupervisedRouter(RouterParams(max_iter=10, min_samples_leaf=10)).fit(X, R)
    return save_policy(RouterPolicy(router, ARMS), d, base_config=RAGConfig(**BASE),
                       names=["hybrid", "bm25", "hybrid-k3"], feature_names=FEATURE_NAMES,
                       epsilon=EPSILON)


@pytest.fixture(scope="module")
def served(serve_app, tmp_path_factory):
    from serving.auth import KeyFile

    root = tmp_path_factory.mktemp("serve-policy")
    policy_dir = _save_policy(root / "policy")
    candidate_dir = _save_policy(root / "candidate", seed=1)
    store = root / "interactions.sqlite"
    token, _ = KeyFile(root / "keys.json").create("admin", name="test")
    args = {"store_url": str(store), "auth": {"keys_file": str(root / "keys.json")},
            "base": BASE, "traffic": {"mode": "policy"},
            "policy": {"dir": str(policy_dir), "epsilon": EPSILON, "seed": 1,
                       "candidate_dir": str(candidate_dir), "candidate_share": SHARE},
            "limits": {"rate_per_s": 1000.0, "burst": 1000.0},
            "pipelines": {"num_replicas": 1, "autoscaling": None, "num_cpus": 0.1},
            "rollout_dir": str(root / "rollout")}
    url = serve_app.deploy(args)
    with httpx.Client(base_url=url, timeout=60.0, headers={"X-API-Key": token}) as client:
        yield client, store, policy_dir, candidate_dir


def test_policy_mode_serves_picks_and_logs_propensities(served, tmp_path):
    from rag.corpus.synthetic import make_synthetic_world
    from rl.promotion.log_evaluators import policy_from_log
    from rl.routing.base import load_policy
    from rl.routing.features import N_FEATURES
    from serving.store import open_store

    client, store, policy_dir, candidate_dir = served
    examples = make_synthetic_world().examples[:24]
    hashes = [c.config_hash for c in ARMS]
    got = []
    for ex in examples:
        r = client.post("/query", json={"question": ex.question, "category": ex.category})
        assert r.status_code == 200, r.text
        body = r.json()
        assert body["route"] == "policy" and body["variant_id"] in hashes
        assert EPSILON / len(ARMS) - 1e-9 <= body["propensity"] <= 1.0
        assert "policy_pick" in body["latency_ms"] and body["answer"]
        got.append(body)
    fb = client.post("/feedback", json={"interaction_id": got[0]["interaction_id"],
                                        "reward": 0.7})
    assert fb.status_code == 200 and fb.json()["route"] == "policy"

    with sqlite3.connect(store) as db:
        rows = db.execute("SELECT id, route, variant_id, propensity, policy_id, arm, "
                          "features_hash FROM interactions WHERE route = 'policy'").fetchall()
    by_id = {r[0]: r for r in rows}
    lp = load_policy(policy_dir)
    for body in got:
        _, route, variant, prop, pid, arm, fh = by_id[body["interaction_id"]]
        assert variant == body["variant_id"] == hashes[arm]
        assert prop == pytest.approx(body["propensity"]) and pid == lp.policy_id
        assert len(fh) == 12
    # the propensities are the exploring policy's own probabilities of the logged arm
    s = open_store(store)
    try:
        s.export_jsonl(tmp_path / "log.jsonl")
    finally:
        s.close()
    import json

    logged = [json.loads(x) for x in (tmp_path / "log.jsonl").read_text().splitlines()]
    logged = [r for r in logged if r["route"] == "policy"]
    X = np.array([r["features"]["policy_x"] for r in logged])
    assert X.shape == (len(got), N_FEATURES)
    from rl.routing.base import Exploring

    lc = load_policy(candidate_dir)
    probs = Exploring(lp.policy, EPSILON, lc.policy, SHARE).probs(X)
    assert np.allclose([probs[i, r["arm"]] for i, r in enumerate(logged)],
                       [r["propensity"] for r in logged], atol=1e-6)
    assert {r["features"]["policy_candidate_id"] for r in logged} == {lc.policy_id}
    # the candidate's own choices were logged with at least its share
    c_arm = lc.policy.act(X)
    assert all(r["propensity"] >= SHARE for r, c in zip(logged, c_arm, strict=True)
               if r["arm"] == c)
    # the OPE gate runs on this log (synthetic gold: reward = the logged F1)
    rep = policy_from_log(logged, lp.policy.probs, hashes, reward_key="f1", margin=0.05)
    assert rep.kind == "offline" and rep.meta["rows"] == len(got)
    assert rep.meta["min_propensity"] >= EPSILON / len(ARMS) - 1e-9


@pytest.mark.parametrize("epsilon", [0.0, 0.03, None])
def test_the_exploration_rate_is_the_one_the_user_sets(world, world_indexes, tmp_path, epsilon):
    """ε is the user's (any value in [0, 1], the directory's when none is given): the greedy
    arm is drawn with propensity 1 − ε + ε/M and logged with it; ε = 0 serves greedily."""
    from pydantic import ValidationError

    from rag.errors import ConfigError
    from rl.routing.base import Exploring, load_policy
    from serving.policy_router import PolicyRouter
    from serving.schemas import PolicyServeSettings

    d = _save_policy(tmp_path / "policy")
    router = PolicyRouter.open(str(d), world_indexes, epsilon=epsilon, seed=0)
    eps = EPSILON if epsilon is None else epsilon
    assert router.epsilon == eps
    greedy = 1 - eps + eps / len(ARMS)
    picks = [router.pick(e.question) for e in world.examples[:30]]
    lp = load_policy(d)
    for p in picks:
        assert p.greedy_arm == int(lp.policy.act(np.asarray([p.features]))[0])
        want = greedy if p.arm == p.greedy_arm else eps / len(ARMS)
        assert p.propensity == pytest.approx(want)
    if eps == 0.0:
        assert all(p.propensity == 1.0 for p in picks)
    assert PolicyServeSettings(dir="d", epsilon=0.0).epsilon == 0.0
    with pytest.raises(ValidationError, match="epsilon"):
        PolicyServeSettings(dir="d", epsilon=1.5)
    with pytest.raises(ConfigError) as e:
        Exploring(lp.policy, -0.05)
    assert e.value.field == "epsilon"
