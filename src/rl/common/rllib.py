"""The one builder of RLlib PPO configs: every PPO learner of the control plane (the tuner, the
per-query adaptive policy, passage selection) gets the project's sizing from here.

Sizing (docs/platform notes: the default `PPOConfig()` spawns 2 env runners and samples 4000
steps per iteration, 14 s and 3.4 GB to build): the new API stack (RLModule + Learner, RLlib's
default), torch, one env per runner, and by default `num_env_runners=0` (the env steps in the
driver, where the cached evaluators and registered data live) and `num_learners=0` (one local
learner). With N >= 1 remote env runners (`PPOSettings.num_env_runners`) each samples a rollout
fragment of ceil(train_batch_size / N) steps, so an iteration is `steps_per_iteration` env
steps (exactly `train_batch_size` when N divides it); the env must then be buildable in the
runner's process from its `env_config` (e.g. a name registered with `register_env`). Sampling
waits for slow steps (no sample timeout: a first evaluation of a config can take minutes).
Seeded (env runner i seeds its env with seed + i), and quiet (`log_level="ERROR"`).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from typing import Any


def steps_per_iteration(train_batch_size: int, num_env_runners: int = 0) -> int:
    """Env steps one PPO iteration samples: `num_env_runners` fragments of
    ceil(train_batch_size / num_env_runners) steps (one batch with no remote runner)."""
    n = max(1, num_env_runners)
    return n * math.ceil(train_batch_size / n)


def ppo_config(env: Any, env_config: Mapping[str, Any], *, seed: int, train_batch_size: int,
               hidden: Sequence[int] | None = None, model: Mapping[str, Any] | None = None,
               module_spec: Any = None, smoothing_episodes: int | None = None,
               disable_env_checking: bool = False, num_env_runners: int = 0,
               num_learners: int = 0, num_cpus_per_env_runner: float = 1.0,
               env_runner_resources: Mapping[str, float] | None = None,
               on_sample_end: Callable[..., None] | None = None, **training: Any):
    """A `PPOConfig` for `env` (a gymnasium.Env class, or a name registered with
    `ray.tune.registry.register_env`) built with `env_config`, sized as the module docstring
    says.

    `num_env_runners` remote env runners (0: sample in the driver), each reserving
    `num_cpus_per_env_runner` CPUs and the custom Ray resources `env_runner_resources` (e.g.
    {"worker_node": 1} to pin them to nodes that offer it); `num_learners` remote learners
    (0: one in the driver). `on_sample_end`: an RLlib `on_sample_end` callback function
    (module-level, so remote runners can unpickle it).

    `train_batch_size`: env steps per iteration (also the rollout fragment). The module is
    either RLlib's default one with an MLP torso of `hidden` units (plus any other
    `DefaultModelConfig` fields in `model`, e.g. {"vf_share_layers": False}) or, with
    `module_spec`, an `RLModuleSpec` of the caller's own module. `smoothing_episodes`: episodes
    the reported returns average over (RLlib's default, 100, when None). Every other keyword
    goes to `.training()` as is (lr, gamma, lambda_, clip_param, entropy_coeff, minibatch_size,
    num_epochs, use_kl_loss, kl_target, vf_loss_coeff, ...); RLlib's defaults apply to those
    not given."""
    from ray.rllib.algorithms.ppo import PPOConfig

    if (hidden is None) == (module_spec is None):
        raise ValueError("give exactly one of hidden (the default module's torso) or "
                         "module_spec (a custom RLModule)")
    fragment = steps_per_iteration(train_batch_size, num_env_runners) // max(1, num_env_runners)
    cfg = (PPOConfig()
           .environment(env, env_config=dict(env_config),
                        disable_env_checking=disable_env_checking)
           .framework("torch")
           .env_runners(num_env_runners=num_env_runners, num_envs_per_env_runner=1,
                        rollout_fragment_length=fragment,
                        num_cpus_per_env_runner=num_cpus_per_env_runner,
                        custom_resources_per_env_runner=dict(env_runner_resources or {}),
                        sample_timeout_s=None)
           .learners(num_learners=num_learners)
           .training(train_batch_size_per_learner=train_batch_size, **training)
           .debugging(seed=seed, log_level="ERROR"))
    if on_sample_end is not None:
        cfg = cfg.callbacks(on_sample_end=on_sample_end)
    if module_spec is not None:
        cfg = cfg.rl_module(rl_module_spec=module_spec)
    else:
        from ray.rllib.core.rl_module.default_model_config import DefaultModelConfig

        cfg = cfg.rl_module(model_config=DefaultModelConfig(fcnet_hiddens=list(hidden),
                                                            **dict(model or {})))
    if smoothing_episodes is not None:
        cfg = cfg.reporting(metrics_num_episodes_for_smoothing=smoothing_episodes)
    return cfg
