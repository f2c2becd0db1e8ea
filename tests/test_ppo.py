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
