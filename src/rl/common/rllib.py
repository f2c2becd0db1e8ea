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
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from rl.common.ppo_settings import PPOSettings


def steps_per_iteration(train_batch_size: int, num_env_runners: int = 0) -> int:
    """Env steps one PPO iteration samples: `num_env_runners` fragments of
    ceil(train_batch_size / num_env_runners) steps (one batch with no remote runner)."""
    n = max(1, num_env_runners)
    return n * math.ceil(train_batch_size / n)


def ppo_config(env: Any, env_config: Mapping[str, Any], *, seed: int, train_batch_size: int,
               module: Any, runners: PPOSettings | None = None,
               smoothing_episodes: int | None = None, disable_env_checking: bool = False,
               on_sample_end: Callable[..., None] | None = None, **training: Any):
    """A `PPOConfig` for `env` (a gymnasium.Env class, or a name registered with
    `ray.tune.registry.register_env`) built with `env_config`, sized as the module docstring
    says.

    `train_batch_size`: env steps per iteration (also the rollout fragment). `module`: either
    RLlib's `DefaultModelConfig` (its default module, e.g. an MLP torso of `fcnet_hiddens`
    units) or an `RLModuleSpec` of the caller's own module; anything else is a TypeError.
    `runners`: where sampling and learning run, read from `PPOSettings.num_env_runners`
    (remote env runners; 0: sample in the driver), `num_cpus_per_env_runner` and
    `env_runner_resources` (what each runner reserves, e.g. {"worker_node": 1} to pin them to
    nodes that offer it) and `num_learners` (0: one in the driver); None: everything in the
    driver. `on_sample_end`: an RLlib `on_sample_end` callback function (module-level, so
    remote runners can unpickle it). `smoothing_episodes`: episodes the reported returns
    average over (RLlib's default, 100, when None). Every other keyword goes to `.training()`
    as is (lr, gamma, lambda_, clip_param, entropy_coeff, minibatch_size, num_epochs,
    use_kl_loss, kl_target, vf_loss_coeff, ...); RLlib's defaults apply to those not given."""
    from ray.rllib.algorithms.ppo import PPOConfig
    from ray.rllib.core.rl_module.default_model_config import DefaultModelConfig
    from ray.rllib.core.rl_module.rl_module import RLModuleSpec

    if not isinstance(module, (DefaultModelConfig, RLModuleSpec)):
        raise TypeError(f"module must be a DefaultModelConfig (RLlib's default module) or an "
                        f"RLModuleSpec (a custom RLModule), got {type(module).__name__}")
    num_env_runners = runners.num_env_runners if runners is not None else 0
    fragment = steps_per_iteration(train_batch_size, num_env_runners) // max(1, num_env_runners)
    cfg = (PPOConfig()
           .environment(env, env_config=dict(env_config),
                        disable_env_checking=disable_env_checking)
           .framework("torch")
           .env_runners(num_env_runners=num_env_runners, num_envs_per_env_runner=1,
                        rollout_fragment_length=fragment,
                        num_cpus_per_env_runner=(runners.num_cpus_per_env_runner
                                                 if runners is not None else 1.0),
                        custom_resources_per_env_runner=dict(
                            runners.env_runner_resources if runners is not None else {}),
                        sample_timeout_s=None)
           .learners(num_learners=runners.num_learners if runners is not None else 0)
           .training(train_batch_size_per_learner=train_batch_size, **training)
           .debugging(seed=seed, log_level="ERROR"))
    if on_sample_end is not None:
        cfg = cfg.callbacks(on_sample_end=on_sample_end)
    if isinstance(module, RLModuleSpec):
        cfg = cfg.rl_module(rl_module_spec=module)
    else:
        cfg = cfg.rl_module(model_config=module)
    if smoothing_episodes is not None:
        cfg = cfg.reporting(metrics_num_episodes_for_smoothing=smoothing_episodes)
    return cfg
