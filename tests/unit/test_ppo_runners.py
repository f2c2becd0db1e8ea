"""PPO with remote env runners (issue 23), the parts that need no Ray runtime and no model:
the runner settings and their sizing in `ppo_config`, the tuner env's plain-dict spec, and the
step records that carry budgets and incumbents through RLlib's results."""

from __future__ import annotations

import json

import pytest

from rag.errors import ConfigError
from rl.common.ppo_settings import PPOSettings
from rl.common.rllib import steps_per_iteration
from rl.kernel.settings import TunerSettings


def test_runner_settings_default_to_the_driver_and_are_bounded():
    p = TunerSettings.defaults().ppo
    assert (p.num_env_runners, p.num_learners, p.env_runner_resources) == (0, 0, {})
    assert p.num_cpus_per_env_runner == 1.0
    s = TunerSettings.defaults().with_overrides(
        ppo={"num_env_runners": 4, "env_runner_resources": {"tuner_node": 1}})
    assert s.ppo.num_env_runners == 4 and s.ppo.train_batch_size == 10  # the rest kept
    assert TunerSettings.from_dict(s.model_dump(mode="json", by_alias=True)).ppo == s.ppo
    for bad in ({"num_env_runners": -1}, {"num_learners": 100},
                {"env_runner_resources": {"x": -1}}):
        with pytest.raises((ConfigError, ValueError)):
            PPOSettings(**bad)


def test_selection_refuses_runner_keys_and_says_why():
    from rl.selection.config import SelectionConfig

    with pytest.raises(ConfigError) as e:
        SelectionConfig.from_dict({"ppo": {"num_env_runners": 2}})
    assert e.value.field == "selection.ppo.num_env_runners"
    assert "env steps in the driver" in str(e.value)


def test_steps_per_iteration():
    assert steps_per_iteration(10) == steps_per_iteration(10, 1) == 10
    assert steps_per_iteration(10, 2) == 10 and steps_per_iteration(10, 5) == 10
    assert steps_per_iteration(10, 3) == 12  # 3 fragments of ceil(10 / 3) = 4 steps


def test_ppo_config_sizes_remote_runners():
    pytest.importorskip("ray.rllib")
    import gymnasium as gym
    from ray.rllib.core.rl_module.default_model_config import DefaultModelConfig

    from rl.common.rllib import ppo_config
    from rl.tuner.env import log_step_records

    runners = PPOSettings(num_env_runners=3, num_learners=0, num_cpus_per_env_runner=0.5,
                          env_runner_resources={"worker_node": 1})
    cfg = ppo_config(gym.Env, {}, seed=1, train_batch_size=10,
                     module=DefaultModelConfig(fcnet_hiddens=[8]), runners=runners,
                     on_sample_end=log_step_records)
    assert cfg.num_env_runners == 3 and cfg.rollout_fragment_length == 4
    assert cfg.num_cpus_per_env_runner == 0.5
    assert cfg.custom_resources_per_env_runner == {"worker_node": 1}
    assert cfg.sample_timeout_s is None  # a first table can take minutes: wait for it
    assert cfg.callbacks_on_sample_end is log_step_records


def test_env_spec_is_plain_json_and_rebuilds_the_policy():
    from rl.tuner.env import env_spec

    pol = TunerSettings.defaults().with_overrides(ppo={"num_env_runners": 2})
    spec = env_spec("synthetic", pol, 3, "/srv/cache")
    assert json.loads(json.dumps(spec)) == spec
    assert spec["dataset"] == "synthetic" and spec["seed"] == 3
    assert spec["cache_root"] == "/srv/cache"
    assert TunerSettings.from_dict(spec["policy"]) == pol
    assert env_spec("synthetic", pol, 0)["cache_root"] is None


def test_env_without_a_registered_evaluator_or_a_dataset_says_so():
    from rl.tuner.env import TunerEnv

    with pytest.raises(KeyError, match="names no dataset"):
        TunerEnv({"evaluator": "not-here", "seed": 0})


class _Logger:
    def __init__(self):
        self.items = []

    def log_value(self, key, value, reduce=None):
        assert reduce == "item_series"
        self.items.append((key, value))


class _FakeEnv:
    def __init__(self, recs):
        self.unwrapped = self
        self._recs = recs

    def drain_records(self):
        out, self._recs = self._recs, []
        return out


def test_step_records_travel_through_the_results_in_runner_order():
    from rl.tuner.env import STEPS_KEY, log_step_records, step_records

    class Runner:
        def __init__(self, idx, recs):
            self.worker_index = idx
            self.env = type("Vec", (), {"unwrapped": type("U", (), {
                "envs": [_FakeEnv(recs)]})()})()

    logs = {}
    for idx in (2, 1):  # runner 2 reports first
        recs = [{"config_hash": f"h{idx}{t}", "reward": float(t), "seq": t, "env_id": "e"}
                for t in range(2)]
        log = _Logger()
        log_step_records(env_runner=Runner(idx, recs), metrics_logger=log)
        assert all(k == STEPS_KEY for k, _ in log.items)
        logs[idx] = [v for _, v in log.items]
        assert all(v["runner"] == idx and "node_id" in v for v in logs[idx])
    result = {"env_runners": {STEPS_KEY[0]: {STEPS_KEY[1]: logs[2] + logs[1]}}}
    got = step_records(result)
    assert [r["config_hash"] for r in got] == ["h10", "h11", "h20", "h21"]
    assert step_records({}) == [] and step_records({"env_runners": {}}) == []
