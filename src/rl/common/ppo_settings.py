"""PPO settings: the one model of an RLlib PPO learner's knobs, read by the tuner (`policy.ppo`,
rl.tuner) and by the passage-selection policy (`selection.ppo`, rl.selection).

Bounds are checked once, here. What differs between the two readers is
- their defaults: `TUNER_PPO` and `SELECTION_PPO` (a file sets only the keys it changes; the
  others take the reader's defaults, through `fill` as a field validator of the parent model);
- the keys a reader does not use, refused at load as unknown keys for that reader (the tuner
  derives its iterations from the evaluation budget; selection sizes its network from `bc`).

Units: `train_batch_size` and `minibatch_size` are env steps; `lr` is Adam's step size.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from pydantic import AliasChoices, Field, SerializationInfo, model_validator

from rag.settings_base import StrictSettings, UnknownKey

__all__ = ["PPODefaults", "PPOSettings", "SELECTION_PPO", "TUNER_PPO"]


class PPOSettings(StrictSettings):
    """One PPO learner's hyperparameters (RLlib `PPOConfig.training` names where they exist)."""

    enabled: bool = True
    """false skips the PPO stage (selection; the tuner always runs PPO)."""
    iterations: int = Field(6, ge=0, le=10_000)
    """PPO iterations (selection; the tuner's follow from its evaluation budget)."""
    lr: float = Field(0.01, gt=0.0, le=1.0)
    clip_param: float = Field(0.2, gt=0.0, le=1.0)
    gamma: float | None = Field(None, ge=0.0, le=1.0)
    """Discount; None: the reader's default (tuner: by action mode, see
    TunerSettings.ppo_discount; selection: 1.0)."""
    gae_lambda: float | None = Field(None, ge=0.0, le=1.0,
                                     validation_alias=AliasChoices("gae_lambda", "lambda_"))
    """GAE λ (also written `lambda_`, RLlib's name); None: the reader's default."""
    kl_target: float = Field(0.01, gt=0.0)
    use_kl_loss: bool = False
    """Adaptive KL penalty towards `kl_target`; off = clipped objective only (CleanRL-style)."""
    entropy_coeff: float = Field(0.01, ge=0.0)
    train_batch_size: int = Field(10, ge=2)
    """Env steps per PPO iteration."""
    minibatch_size: int = Field(10, ge=1)
    num_epochs: int = Field(16, ge=1, le=100)
    hidden: tuple[int, ...] = (32, 32)
    """Hidden layer widths of the policy and value networks (the tuner's MLP)."""
    num_env_runners: int = Field(0, ge=0, le=256)
    """Remote RLlib env runners sampling in parallel (Ray actors, on any node of the cluster);
    0: the env steps in the driver process. Each runner builds its own env from a plain-dict
    spec (the tuner: `rl.tuner.env.env_spec`)."""
    num_learners: int = Field(0, ge=0, le=64)
    """Remote RLlib learners (0: one learner in the driver)."""
    num_cpus_per_env_runner: float = Field(1.0, ge=0.0, le=64.0)
    """CPUs each remote env runner reserves (Ray places runners by it)."""
    env_runner_resources: dict[str, float] = Field(default_factory=dict)
    """Custom Ray resources each remote env runner reserves, e.g. {"tuner_node": 1}: runners
    go only to nodes started with that resource (`ray start --resources=...`)."""

    @model_validator(mode="after")
    def _batches(self) -> PPOSettings:
        if self.minibatch_size > self.train_batch_size:
            raise ValueError("minibatch_size must be <= train_batch_size")
        if any(v < 0 for v in self.env_runner_resources.values()):
            raise ValueError("env_runner_resources amounts must be >= 0")
        return self

    def discount(self, gamma: float, gae_lambda: float) -> tuple[float, float]:
        """(γ, GAE λ), the given defaults standing in for unset values."""
        return (gamma if self.gamma is None else self.gamma,
                gae_lambda if self.gae_lambda is None else self.gae_lambda)


@dataclass(frozen=True)
class PPODefaults:
    """One reader's PPO defaults and the keys it does not use."""

    settings: PPOSettings
    unused: frozenset[str] = frozenset()
    why: str = ""
    """Appended to "unknown key" for an unused key."""
    reasons: Mapping[str, str] = field(default_factory=dict)
    """Per-key text that replaces `why` for those unused keys."""

    def fill(self, value: Any) -> Any:
        """`value` (a partial mapping from a file) over `settings`, as a mapping to validate;
        an `unused` key is refused as an unknown key. Use as a `field_validator(mode="before")`
        of the parent's `ppo` field."""
        if not isinstance(value, Mapping):
            return value
        for key in value:
            if key in self.unused:
                raise UnknownKey(str(key), self.reasons.get(key, self.why))
        written = {n for n, f in PPOSettings.model_fields.items()
                   if any(a in value for a in _aliases(n, f.validation_alias))}
        base = {k: v for k, v in self.settings.model_dump().items()
                if k not in written and k not in self.unused}
        return {**base, **value}

    def dump(self, ppo: PPOSettings, info: SerializationInfo) -> dict[str, Any]:
        """`ppo` as its reader writes it: without the keys it does not use (so a dump loads
        back). Use from a `field_serializer` of the parent's `ppo` field."""
        data = ppo.model_dump(mode=info.mode, by_alias=info.by_alias)
        return {k: v for k, v in data.items() if k not in self.unused}


def _aliases(name: str, alias: Any) -> tuple[str, ...]:
    return tuple(alias.choices) if isinstance(alias, AliasChoices) else (name,)


_REMOTE = frozenset({"num_env_runners", "num_learners", "num_cpus_per_env_runner",
                     "env_runner_resources"})

TUNER_PPO = PPODefaults(
    PPOSettings(),
    unused=frozenset({"enabled", "iterations"}),
    why=" for the tuner (its PPO iterations follow the evaluation budget)")
"""The tuner's defaults (configs/rl/tuner.yaml records why these values)."""

SELECTION_PPO = PPODefaults(
    PPOSettings(lr=1e-4, gamma=1.0, gae_lambda=0.95, entropy_coeff=0.005,
                train_batch_size=256, minibatch_size=64, num_epochs=4),
    unused=frozenset({"hidden"}) | _REMOTE,
    why=" for selection (its network is the behaviour-cloned one, sized by `bc.hidden`)",
    reasons=dict.fromkeys(_REMOTE, " for selection (its env steps in the driver, on the "
                                   "pools of the memoised retrieval; the arms run as Ray "
                                   "tasks instead: `--parallel`)"))
"""The selection policy's defaults (configs/rl/selection.yaml)."""
