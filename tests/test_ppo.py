"""RLlib PPO (new API stack) on TunerEnv's mixed Dict action heads, on the synthetic world:
it trains, keeps its evaluation budget, returns a config from the space, checkpoints and
restores to the same greedy policy."""

import numpy as np
import pytest

from rag.errors import ConfigError
from rl.common.data import TuningData
from rl.kernel.evaluator import TunerEvaluator
from rl.kernel.settings import TunerSettings
from rl.kernel.space import ConfigSpace

pytestmark = pytest.mark.ray


@pytest.fixture(scope="module")
def tuner(tmp_path_factory):
    from rl.tuner.ppo import PPOTuner

    policy = TunerSettings.defaults().with_overrides(
        k_grid=[3, 5, 8], fusion_grid=0.5, fusion_step=0.5,
        discrete={"variant": ["bm25", "hybrid"], "rerank": ["off", "on"],
                  "prompt_id": ["cite_concise"]},
        episode={"length": 4, "batch_size": 40},
        ppo={"train_batch_size": 8, "minibatch_size": 4, "num_epochs": 2, "hidden": [16]}
    ).with_legacy_space()  # the heads issue 18 added pinned: the small space of this module
    ev = TunerEvaluator(TuningData.open("synthetic"), policy,
                        cache_root=tmp_path_factory.mktemp("tuner"))
    t = PPOTuner(ev, policy, seed=0)
    yield t
    t.stop()


def test_ppo_trains_within_budget_and_checkpoints(tuner, tmp_path):
    logged = []
    res = tuner.train(2, log=lambda it, m: logged.append((it, m)))
    # 2 iterations x 8 steps, then one 4-step greedy read-out episode
    assert res.evaluations == 2 * 8 + 4 == len(res.curve)
    assert res.extra["readout_steps"] == 4
    assert res.best_config in (res.extra["greedy_config"], tuner.ev.seen[res.extra["incumbent_hash"]])
    assert [it for it, _ in logged] == [0, 1]
    assert "losses/entropy" in logged[-1][1] and "reward" in logged[-1][1]
    space = ConfigSpace(tuner.policy)
    assert res.best_config.config_hash in {c.config_hash for c in space.grid()}
    best_so_far = [c["best_so_far"] for c in res.curve]
    assert best_so_far == sorted(best_so_far)

    obs = np.zeros(tuner.env.observation_space.shape, dtype=np.float32)
    before = tuner.greedy_action(obs)
    path = tuner.save(tmp_path / "ckpt")
    tuner.train(1)  # move the weights
    tuner.restore(path)
    after = tuner.greedy_action(obs)
    for k in before:
        assert np.allclose(before[k], after[k]), k


def test_ppo_budget_in_distinct_configs(tuner):
    n_grid = len(list(ConfigSpace(tuner.policy).grid()))
    start = len(tuner.env.history)
    res = tuner.train_configs(14, max_steps=40)
    distinct = {c["config_hash"] for c in res.curve}  # this call's steps and read-out
    # an iteration (8 steps) runs only while 14 - 4 (read-out) - 8 >= the configs seen, so the
    # run never passes 14 distinct configs; the step cap bounds the revisits
    assert len(distinct) <= 14 < n_grid == 24
    assert res.evaluations == len(res.curve) <= 40 + 4 and res.extra["readout_steps"] == 4
    assert res.extra["iterations"] >= 1 and len(tuner.env.history) > start
    with pytest.raises(ConfigError, match="budget: 11 distinct configs cannot hold"):
        tuner.train_configs(11)  # < 8 steps + the 4-step read-out


def test_adaptive_policy_learns_a_planted_context_rule(tmp_path):
    """Two arms; arm 1 pays only when feature 0 is positive. PPO as a contextual bandit must
    learn the rule, its propensities must be a distribution per query, and its logged
    decisions must feed off-policy evaluation."""
    from rl.tuner.adaptive import AdaptivePolicy, QueryBandit

    rng = np.random.default_rng(0)
    X = rng.normal(size=(400, 3)).astype(np.float32)
    R = np.stack([np.full(400, 0.5), np.where(X[:, 0] > 0, 1.0, 0.0)], axis=1)
    pol = AdaptivePolicy(QueryBandit([None, None], X, R), seed=0, batch=128)
    try:
        pol.fit(iterations=15)
        P = pol.probabilities(X)
        assert np.allclose(P.sum(axis=1), 1.0, atol=1e-5)
        acts = pol.act(X)
        agree = np.mean(acts == (X[:, 0] > 0))
        assert agree > 0.85, agree
        assert R[np.arange(400), acts].mean() > 0.7  # both static arms give 0.5 on average
        # its decisions, sampled from its propensities, logged and evaluated off-policy
        log = pol.log_decisions(pol.train_data, tmp_path / "decisions.jsonl", seed=0)
        assert len((tmp_path / "decisions.jsonl").read_text().splitlines()) == 400
        assert np.allclose(log.p, P[np.arange(400), log.a], atol=1e-6)
        for name, e in log.estimate(np.eye(2)[acts]).items():  # the greedy policy
            assert np.isfinite([e.value, e.ci_low, e.ci_high]).all(), name
            assert e.ci_low <= e.value <= e.ci_high
    finally:
        pol.stop()
