"""The tuner's policy configuration: what it may change, what it must not break, what it wants.

`configs/rl/policy.defaults.yaml` documents every key; `TunerSettings.from_yaml` validates a file
at load time and names the offending key (`policy.bounds.k.min: ...`). A file only needs the
keys it changes: everything else takes the documented default.

The action heads:
    variant      Discrete over `discrete.variant` labels: a retriever name (bm25, dense, hybrid,
                 graph) or a label defined under `variants:` (RAGConfig overrides, e.g. A/B arms)
    k            Discrete over `k_grid` (RLlib rejects integer Boxes), clipped to `bounds.k`
    rerank       Discrete(2) over `discrete.rerank` ([off, on]); "on" means `reranker`
    fusion_weight Box within `bounds.fusion_weight` (snapped to `fusion_step` for caching)
    prompt_id    Discrete over `discrete.prompt_id`
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from rag.config import RAGConfig, _to_config_error
from rag.errors import ConfigError

RETRIEVERS = ("bm25", "dense", "hybrid", "graph")
REPO = Path(__file__).resolve().parents[3]
DEFAULTS_PATH = REPO / "configs" / "rl" / "policy.defaults.yaml"


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class IntRange(_Strict):
    min: int
    max: int

    @model_validator(mode="after")
    def _ordered(self) -> IntRange:
        if self.min > self.max:
            raise ValueError(f"min ({self.min}) must be <= max ({self.max})")
        return self


class FloatRange(_Strict):
    min: float
    max: float

    @model_validator(mode="after")
    def _ordered(self) -> FloatRange:
        if self.min > self.max:
            raise ValueError(f"min ({self.min}) must be <= max ({self.max})")
        return self


class Bounds(_Strict):
    k: IntRange = IntRange(min=3, max=32)
    fusion_weight: FloatRange = FloatRange(min=0.0, max=1.0)

    @model_validator(mode="after")
    def _inside(self) -> Bounds:
        if self.k.min < 1 or self.k.max > 32:
            raise ValueError("k bounds must lie within [1, 32]")
        if self.fusion_weight.min < 0.0 or self.fusion_weight.max > 1.0:
            raise ValueError("fusion_weight bounds must lie within [0, 1]")
        return self


class Discrete(_Strict):
    variant: tuple[str, ...] = RETRIEVERS
    rerank: tuple[Literal["off", "on"], ...] = ("off", "on")
    prompt_id: tuple[str, ...] = ("cite_concise", "cite_concise_abstain")

    @field_validator("rerank", mode="before")
    @classmethod
    def _yaml_bools(cls, v: Any) -> Any:
        # YAML 1.1 reads a bare `off` / `on` as false / true
        if isinstance(v, (list, tuple)):
            return [("on" if x else "off") if isinstance(x, bool) else x for x in v]
        return v

    @model_validator(mode="after")
    def _non_empty(self) -> Discrete:
        for name in ("variant", "rerank", "prompt_id"):
            vals = getattr(self, name)
            if not vals:
                raise ValueError(f"{name} needs at least one choice")
            if len(set(vals)) != len(vals):
                raise ValueError(f"{name} has duplicate choices")
        return self


class Thresholds(_Strict):
    """Hard gates: a config is never promoted when one fails."""

    faithfulness: float = Field(0.75, ge=0.0, le=1.0)
    relevancy: float = Field(0.75, ge=0.0, le=1.0)
    p95_latency_ms: float = Field(500.0, gt=0.0)


class RewardWeights(_Strict):
    """r = αF + βR − γ·min(p95/T, 2) − δ·min(cost/C_ref, 2) − λ·P."""

    model_config = ConfigDict(extra="forbid", frozen=True, populate_by_name=True)

    alpha: float = Field(0.5, ge=0.0)
    beta: float = Field(0.5, ge=0.0)
    gamma: float = Field(0.2, ge=0.0)
    delta: float = Field(0.2, ge=0.0)
    lambda_: float = Field(1.0, ge=0.0, alias="lambda")


class Episode(_Strict):
    length: int = Field(10, ge=1, le=1000)
    """Steps (config evaluations) per episode."""
    batch_size: int = Field(200, ge=1, le=100_000)
    """Validation queries per step (sampled without replacement; capped at the slice size)."""


class DatasetSlice(_Strict):
    """Which split the tuner optimises on, which it reports on, and which per-query metrics
    play faithfulness (F) and relevancy (R) for this dataset."""

    tune_split: str = "valid"
    holdout_split: str = "test"
    faithfulness: str = "support"
    relevancy: str = "f1"
    thresholds: Thresholds | None = None
    """Dataset-specific gates; the global `thresholds` when absent."""


class PPOSettings(_Strict):
    lr: float = Field(0.01, gt=0.0)
    clip_param: float = Field(0.2, gt=0.0, le=1.0)
    gae_lambda: float | None = Field(None, ge=0.0, le=1.0)
    """None: 0.95 in delta mode, 0 in absolute mode (see `gamma`)."""
    gamma: float | None = Field(None, ge=0.0, le=1.0)
    """None: 0.99 in delta mode; 0 in absolute mode, where a step's reward does not depend on
    earlier actions (a fresh config on a fresh batch), so discounting only adds variance."""
    kl_target: float = Field(0.01, gt=0.0)
    use_kl_loss: bool = False
    """Adaptive KL penalty towards `kl_target`; off = clipped objective only (CleanRL-style)."""
    entropy_coeff: float = Field(0.01, ge=0.0)
    train_batch_size: int = Field(10, ge=2)
    """Env steps (config evaluations) per PPO iteration."""
    minibatch_size: int = Field(10, ge=1)
    num_epochs: int = Field(16, ge=1)
    hidden: tuple[int, ...] = (32, 32)


class TunerSettings(_Strict):
    bounds: Bounds = Bounds()
    k_grid: tuple[int, ...] = (3, 4, 5, 6, 8, 12, 16, 24, 32)
    """Values the k head chooses from (those outside `bounds.k` are dropped)."""
    fusion_step: float = Field(0.05, gt=0.0, le=1.0)
    """fusion_weight actions are snapped to this grid so evaluations can be cached."""
    fusion_grid: float = Field(0.1, gt=0.0, le=1.0)
    """Spacing of fusion_weight in the exhaustive-grid baseline."""
    discrete: Discrete = Discrete()
    variants: dict[str, dict[str, Any]] = Field(default_factory=dict)
    reranker: Literal["cosine", "cross_encoder"] = "cosine"
    thresholds: Thresholds = Thresholds()
    reward_weights: RewardWeights = RewardWeights()
    cost_ref_tokens: float = Field(1000.0, gt=0.0)
    """C_ref: tokens per query (in + out) that cost one unit."""
    instability_band: float = Field(0.05, ge=0.0)
    """P += 0.5 when the standard error of the batch's mean quality exceeds this."""
    action_mode: Literal["absolute", "delta"] = "absolute"
    episode: Episode = Episode()
    base: dict[str, Any] = Field(default_factory=lambda: {"generator": "extractive",
                                                          "n_candidates": 50})
    """RAGConfig fields every action starts from (the static default config)."""
    datasets: dict[str, DatasetSlice] = Field(default_factory=dict)
    ppo: PPOSettings = PPOSettings()
    seed: int = 0

    @model_validator(mode="after")
    def _check(self) -> TunerSettings:
        ks = [k for k in self.k_grid if self.bounds.k.min <= k <= self.bounds.k.max]
        if not ks:
            raise ValueError(f"k_grid has no value inside bounds.k "
                             f"[{self.bounds.k.min}, {self.bounds.k.max}]")
        if list(self.k_grid) != sorted(set(self.k_grid)):
            raise ValueError("k_grid must be strictly increasing")
        return self

    def _check_configs(self) -> TunerSettings:
        """The base config and every variant label must make valid RAGConfigs."""
        RAGConfig.from_dict(dict(self.base), where="policy.base")
        for label, over in self.variants.items():
            if not isinstance(over, dict):
                raise ConfigError(f"policy.variants.{label}", "must be a mapping")
            RAGConfig.from_dict({**self.base, **over}, where=f"policy.variants.{label}")
        return self

    # ---- derived ----------------------------------------------------------------------------
    def ppo_discount(self) -> tuple[float, float]:
        """(γ, GAE λ) with the mode-dependent defaults resolved."""
        delta = self.action_mode == "delta"
        g = self.ppo.gamma if self.ppo.gamma is not None else (0.99 if delta else 0.0)
        lam = self.ppo.gae_lambda if self.ppo.gae_lambda is not None else (
            0.95 if delta else 0.0)
        return g, lam

    @property
    def ks(self) -> tuple[int, ...]:
        return tuple(k for k in self.k_grid if self.bounds.k.min <= k <= self.bounds.k.max)

    def base_config(self) -> RAGConfig:
        return RAGConfig.from_dict(dict(self.base), where="policy.base")

    def variant_overrides(self, label: str) -> dict[str, Any]:
        """RAGConfig fields a variant label stands for."""
        if label in self.variants:
            return dict(self.variants[label])
        if label in RETRIEVERS:
            return {"variant": label}
        raise ConfigError("policy.discrete.variant",
                          f"label {label!r} is neither a retriever ({', '.join(RETRIEVERS)}) "
                          f"nor defined under policy.variants")

    def check_variants(self) -> None:
        for label in self.discrete.variant:
            self.variant_overrides(label)

    def slice_for(self, dataset: str) -> DatasetSlice:
        return self.datasets.get(dataset, DatasetSlice())

    def thresholds_for(self, dataset: str) -> Thresholds:
        return self.slice_for(dataset).thresholds or self.thresholds

    # ---- loading ----------------------------------------------------------------------------
    @classmethod
    def from_dict(cls, data: Any) -> TunerSettings:
        if isinstance(data, dict) and set(data) == {"policy"}:
            data = data["policy"]
        if not isinstance(data, dict):
            raise ConfigError("policy", "must be a mapping")
        try:
            cfg = cls(**data)
        except ValidationError as exc:
            raise _to_config_error(exc, "policy") from None
        return cfg._check_configs()

    @classmethod
    def from_yaml(cls, path: str | Path) -> TunerSettings:
        p = Path(path)
        if not p.exists():
            raise ConfigError("policy", f"file {p} does not exist")
        try:
            data = yaml.safe_load(p.read_text()) or {}
        except yaml.YAMLError as exc:
            raise ConfigError("policy", f"{p} is not valid YAML: {exc}") from None
        return cls.from_dict(data)

    @classmethod
    def defaults(cls) -> TunerSettings:
        """The documented defaults file (its values equal the model defaults plus the
        per-dataset slices)."""
        return cls.from_yaml(DEFAULTS_PATH)

    def with_overrides(self, **changes: Any) -> TunerSettings:
        data = self.model_dump(mode="json", by_alias=True)
        data.update(changes)
        return TunerSettings.from_dict(data)
