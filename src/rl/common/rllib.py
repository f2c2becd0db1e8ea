"""The one builder of RLlib PPO configs: every PPO learner of the control plane (the tuner, the
per-query adaptive policy, passage selection) gets the project's sizing from here.

Sizing (docs/platform notes: the default `PPOConfig()` spawns 2 env runners and samples 4000
steps per iteration, 14 s and 3.4 GB to build): the new API stack (RLModule + Learner, RLlib's
default), torch, `num_env_runners=0` (the env steps in the driver, where the cached evaluators
and registered data live), `num_learners=0` (one local learner), one env per runner, and a
rollout fragment of exactly one train batch, so an iteration is `train_batch_size` env steps.
Seeded, and quiet (`log_level="ERROR"`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any


def ppo_config(env: Any, env_config: Mapping[str, Any], *, seed: int, train_batch_size: int,
               hidden: Sequence[int] | None = None, model: Mapping[str, Any] | None = None,
               module_spec: Any = None, smoothing_episodes: int | None = None,
               disable_env_checking: bool = False, **training: Any):
    """A `PPOConfig` for `env` (a gymnasium.Env class) built with `env_config`, sized as the
    module docstring says.

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
    cfg = (PPOConfig()
           .environment(env, env_config=dict(env_config),
                        disable_env_checking=disable_env_checking)
           .framework("torch")
           .env_runners(num_env_runners=0, num_envs_per_env_runner=1,
                        rollout_fragment_length=train_batch_size)
           .learners(num_learners=0)
           .training(train_batch_size_per_learner=train_batch_size, **training)
           .debugging(seed=seed, log_level="ERROR"))
    if module_spec is not None:
        cfg = cfg.rl_module(rl_module_spec=module_spec)
    else:
        from ray.rllib.core.rl_module.default_model_config import DefaultModelConfig

        cfg = cfg.rl_module(model_config=DefaultModelConfig(fcnet_hiddens=list(hidden),
                                                            **dict(model or {})))
    if smoothing_episodes is not None:
        cfg = cfg.reporting(metrics_num_episodes_for_smoothing=smoothing_episodes)
    return cfg
