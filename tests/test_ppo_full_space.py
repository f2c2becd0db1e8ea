"""RLlib PPO on the full config space (issue 18): the Dict action space with every extra head
(normalisation, MMR lambda, rerank depth and mix, abstain threshold) trains, and the read-out
decodes each Box head exactly as training does, in absolute and in delta mode."""

import numpy as np
import pytest

from rl.common.data import TuningData
from rl.kernel.evaluator import TunerEvaluator
from rl.kernel.settings import TunerSettings
from rl.kernel.space import ConfigSpace

pytestmark = pytest.mark.ray


@pytest.fixture(scope="module")
def data():
    return TuningData.open("synthetic")


@pytest.mark.parametrize("mode", ["absolute", "delta"])
def test_full_space_trains_and_reads_out_as_trained(data, mode, tmp_path):
    from rl.tuner.ppo import PPOTuner, env_action

    policy = TunerSettings.defaults().with_overrides(
        action_mode=mode, episode={"length": 4, "batch_size": 20},
        ppo={"train_batch_size": 4, "minibatch_size": 4, "num_epochs": 1, "hidden": [8]})
    space = ConfigSpace(policy)
    assert space.size() >= 10**6
    assert set(space.extra_heads) >= {"normalisation", "mmr_lambda", "rerank_depth",
                                      "rerank_mix", "abstain_threshold"}
    ev = TunerEvaluator(data, policy, cache_root=tmp_path)
    tuner = PPOTuner(ev, policy, seed=5)
    try:
        tuner.build()
        tuner.algo.train()  # one iteration on the full Dict action space
        runner, env = tuner.algo.env_runner, tuner.env
        start = len(env.history)
        ep = runner.sample(num_episodes=1, explore=False, force_reset=True)[0]
        steps = env.history[start:]
        assert len(ep) == len(steps) == policy.episode.length
        current = space.base
        for t, h in enumerate(steps):
            obs = np.asarray(ep.get_observations(t), dtype=np.float32)
            read = tuner.greedy_action(obs)
            assert set(read) == set(space.action_space())
            assert space.to_config(read, current).config_hash == h["config_hash"], t
            raw = ep.get_actions(t)
            assert space.to_config(env_action(runner._module_to_env, raw),
                                   current).config_hash == h["config_hash"], t
            for head in ("mmr_lambda", "rerank_mix", "abstain_threshold"):
                b = space.box(head)  # unsquashed from [-1, 1] to the head's bounds
                u = float(np.asarray(raw[head]).reshape(-1)[0])
                want = np.clip(b.lo + (u + 1) * (b.hi - b.lo) / 2, b.lo, b.hi)
                assert float(np.asarray(read[head]).reshape(-1)[0]) == pytest.approx(
                    want, abs=1e-6), head
            current = h["config"]
    finally:
        tuner.stop()
