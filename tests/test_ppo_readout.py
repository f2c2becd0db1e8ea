"""The PPO read-out decodes a policy output exactly as training does (issue 18): RLlib's env
runner unsquashes the Gaussian fusion-weight head from [-1, 1] to its Box bounds before the env
sees it, so `PPOTuner.greedy_action` must too. Checked against the env runner itself: the
configs the env decoded while the runner stepped it with deterministic actions equal the
read-out's configs for the same observations, in absolute and in delta mode."""

import numpy as np
import pytest

from rl.common.data import TuningData
from rl.kernel.evaluator import TunerEvaluator
from rl.kernel.settings import TunerSettings
from rl.kernel.space import DELTA_W, ConfigSpace

pytestmark = pytest.mark.ray


def _policy(mode: str) -> TunerSettings:
    # hybrid only: the fusion weight acts (other retrievers keep the base weight)
    return TunerSettings.defaults().with_overrides(
        action_mode=mode, k_grid=[3, 5, 8], fusion_step=0.05,
        discrete={"variant": ["hybrid"], "rerank": ["off"], "prompt_id": ["cite_concise"]},
        episode={"length": 4, "batch_size": 20},
        ppo={"train_batch_size": 4, "minibatch_size": 4, "num_epochs": 1, "hidden": [8]}
    ).with_legacy_space()  # the heads issue 18 added pinned: the five heads read out below


@pytest.fixture(scope="module")
def data():
    return TuningData.open("synthetic")


@pytest.mark.parametrize("mode", ["absolute", "delta"])
def test_training_and_readout_decode_the_same_config(data, mode, tmp_path):
    from rl.tuner.ppo import PPOTuner, env_action

    policy = _policy(mode)
    ev = TunerEvaluator(data, policy, cache_root=tmp_path)
    tuner = PPOTuner(ev, policy, seed=3)
    try:
        tuner.build()
        runner, env = tuner.algo.env_runner, tuner.env
        start = len(env.history)
        episodes = runner.sample(num_episodes=1, explore=False, force_reset=True)
        steps = env.history[start:]
        ep = episodes[0]
        assert len(ep) == len(steps) == policy.episode.length
        space = ConfigSpace(policy)
        current = space.base
        for t, h in enumerate(steps):
            obs = np.asarray(ep.get_observations(t), dtype=np.float32)
            raw = ep.get_actions(t)  # the module's output, before the connector
            # what the env decoded in training = what the read-out decodes
            read = tuner.greedy_action(obs)
            assert space.to_config(read, current).config_hash == h["config_hash"], t
            assert space.to_config(env_action(runner._module_to_env, raw),
                                   current).config_hash == h["config_hash"], t
            # the raw output read as an env action is what the old read-out did: w off by
            # the unsquash (absolute: 0.0 -> lo, not the middle; delta: 4x the step)
            u = float(np.asarray(raw["fusion_weight"]).reshape(-1)[0])
            w = float(np.asarray(read["fusion_weight"]).reshape(-1)[0])
            if mode == "absolute":
                lo, hi = space.w_lo, space.w_hi
                assert w == pytest.approx(np.clip(lo + (u + 1) * (hi - lo) / 2, lo, hi),
                                          abs=1e-6)
            else:
                assert w == pytest.approx(np.clip(u * DELTA_W, -DELTA_W, DELTA_W), abs=1e-6)
            current = h["config"]
    finally:
        tuner.stop()


def test_unsquash_of_known_outputs(data, tmp_path):
    """Policy output 0.0 is the middle of the Box (w = 0.5 in [0, 1]; no move in delta mode);
    ±1 its ends; beyond ±1 clipped."""
    from rl.tuner.ppo import PPOTuner, env_action

    for mode, expect in (("absolute", {0.0: 0.5, -1.0: 0.0, 1.0: 1.0, 3.0: 1.0}),
                         ("delta", {0.0: 0.0, -1.0: -DELTA_W, 1.0: DELTA_W, 0.5: DELTA_W / 2})):
        policy = _policy(mode)
        tuner = PPOTuner(TunerEvaluator(data, policy, cache_root=tmp_path), policy)
        env = ConfigSpace(policy)
        pipe = tuner.config().build_module_to_env_connector(
            spaces={"__env_single__": (None, env.action_space())})
        for u, want in expect.items():
            raw = {"variant": np.int64(0), "k": np.int64(1), "rerank": np.int64(0),
                   "prompt": np.int64(0), "fusion_weight": np.array([u], dtype=np.float32)}
            got = env_action(pipe, raw)
            assert float(got["fusion_weight"][0]) == pytest.approx(want), (mode, u)
            assert int(got["k"]) == 1 and int(got["variant"]) == 0
        base = env.base
        raw0 = {"variant": 0, "k": 1, "rerank": 0, "prompt": 0,
                "fusion_weight": np.array([0.0], dtype=np.float32)}
        cfg = env.to_config(env_action(pipe, raw0), base)
        if mode == "absolute":
            assert cfg.fusion_weight == pytest.approx(0.5)
        else:
            assert cfg.fusion_weight == pytest.approx(base.fusion_weight)
