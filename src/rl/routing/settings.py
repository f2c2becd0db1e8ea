"""PPOPolicySettings: configs/routing/ppo.yaml (`ppo_policy:`), validated at load (unknown key
or bad value -> `ConfigError` naming `ppo_policy.<section>.<key>`, with the YAML line).

Four groups: `heads` (the mixed action space of `rl.routing.heads`), `train` (RLlib PPO sizing
and model selection), `lagrange` (the PPO-Lagrangian cost multiplier) and `warm_start` (the
behaviour-cloning start of `rl.routing.warm_start`)."""

from __future__ import annotations

import os
from importlib.resources.abc import Traversable
from typing import Literal

from pydantic import Field, model_validator

from rag.resources import default_config
from rag.settings_base import StrictSettings

DEFAULT_PATH = default_config("routing/ppo.yaml")


class Range(StrictSettings):
    min: float = Field(ge=0.0, le=1.0)
    max: float = Field(ge=0.0, le=1.0)

    @model_validator(mode="after")
    def _ordered(self) -> Range:
        if self.min > self.max:
            raise ValueError(f"min ({self.min}) > max ({self.max})")
        return self


class HeadSettings(StrictSettings):
    variants: tuple[str, ...] = ("bm25", "dense", "hybrid", "graph")
    """Retriever variants (categorical head); the fusion weight acts on `hybrid` only."""
    ks: tuple[int, ...] = (1, 2, 3, 4, 5, 6, 8, 10, 12, 16, 20, 24, 32)
    """The coarse set the k head picks from (passages handed to the generator)."""
    rerank_depths: tuple[int, ...] = (0, 10, 30)
    """Rerank head: 0 = off, d > 0 = rerank d candidates (raised to k) with the reranker."""
    generator_arms: tuple[str, ...] = ("extractive:cite_concise",
                                       "extractive:cite_concise_abstain")
    """`generator:prompt_id` arms; the abstain head acts on extractive `*_abstain` arms only."""
    query_formulations: tuple[str, ...] = ("last_turn", "last_two_user", "all_user")
    """Conversational data only (the head does not exist on single-turn data)."""
    normalisations: tuple[str, ...] = ("minmax", "zscore", "rrf")
    """Hybrid fusion's score normalisation (categorical head, acts on `hybrid` only; one
    value: no head, every hybrid config uses it)."""
    defer: bool = False
    """A `defer` head (residual policy): 1 = the base policy's config for this query (the
    caller supplies one per query, e.g. the supervised router's pick), 0 = the heads decide.
    Every other head is gated on defer == 0."""
    box_step: float = Field(0.1, gt=0.0, le=0.5)
    """Continuous heads snap to multiples of this before evaluation (row-cache hits)."""
    mmr_range: Range = Range(min=0.5, max=1.0)
    abstain_range: Range = Range(min=0.2, max=0.8)

    @model_validator(mode="after")
    def _check(self) -> HeadSettings:
        if not self.variants or not self.ks or not self.generator_arms:
            raise ValueError("variants, ks and generator_arms need at least one value each")
        if any(not 1 <= k <= 32 for k in self.ks):
            raise ValueError(f"ks must lie in [1, 32], got {list(self.ks)}")
        if any(d < 0 or d > 100 for d in self.rerank_depths):
            raise ValueError("rerank_depths must lie in [0, 100] (0 = off)")
        if not self.normalisations or set(self.normalisations) - {"minmax", "zscore", "rrf"}:
            raise ValueError(f"normalisations are minmax, zscore or rrf (at least one), got "
                             f"{list(self.normalisations)}")
        bad = [a for a in self.generator_arms if ":" not in a]
        if bad:
            raise ValueError(f"generator_arms are `generator:prompt_id`, got {bad}")
        return self


class TrainSettings(StrictSettings):
    iters: int = Field(12, ge=1, le=10_000)
    batch: int = Field(256, ge=8)
    minibatch: int = Field(64, ge=8)
    epochs: int = Field(6, ge=1, le=100)
    lr: float = Field(3e-3, gt=0.0, le=1.0)
    entropy_coeff: float = Field(0.01, ge=0.0, le=1.0)
    hidden: tuple[int, ...] = (64, 64)
    eval_every: int = Field(3, ge=1)
    seeds: tuple[int, ...] = (0, 1, 2, 3, 4)
    selection: Literal["mean", "evidence"] = "evidence"
    """How a later checkpoint replaces the incumbent (the warm start, or an earlier
    checkpoint) on valid: "mean" (higher valid mean reward, within the cost cap) or
    "evidence" (also a paired bootstrap 95% CI of the per-query gain above 0:
    `rl.routing.selection.replaces`)."""


class WarmStartSettings(StrictSettings):
    """Behaviour-cloning warm start (`rl.routing.warm_start`)."""

    keep: float = Field(0.9, gt=0.5, lt=1.0)
    """Probability the cloned module puts on each categorical head's target value (> 1/2, so
    the greedy action is the target; the rest is PPO's initial exploration)."""
    std: float = Field(0.2, gt=0.0, le=2.0)
    """Raw Gaussian std of the box heads after cloning (u = (clip(x, -1, 1) + 1) / 2)."""
    steps: int = Field(300, ge=1, le=100_000)
    """Full-batch Adam steps of the cloning fit."""
    lr: float = Field(1e-2, gt=0.0, le=1.0)


class LagrangeSettings(StrictSettings):
    lr: float = Field(0.5, ge=0.0)
    """Step size eta of the projected ascent on lambda (cost in units of C_ref tokens)."""
    init: float = Field(0.0, ge=0.0)
    max: float = Field(2.0, ge=0.0)
    slack: float = Field(0.05, ge=0.0, le=1.0)
    """Model selection: a checkpoint is feasible when its valid mean cost <= budget*(1+slack)."""


class PPOPolicySettings(StrictSettings):
    SECTION = "ppo_policy"

    heads: HeadSettings = HeadSettings()
    train: TrainSettings = TrainSettings()
    lagrange: LagrangeSettings = LagrangeSettings()
    warm_start: WarmStartSettings = WarmStartSettings()

    @classmethod
    def load(cls, path: str | os.PathLike[str] | Traversable | None = None
             ) -> PPOPolicySettings:
        """Read `ppo_policy: {...}` from YAML (default configs/routing/ppo.yaml)."""
        return cls.from_yaml(path if path else DEFAULT_PATH)

    def with_train(self, **train: object) -> PPOPolicySettings:
        """A copy with some `train` fields replaced (validated)."""
        return self.from_mapping({**self.model_dump(mode="json"), "train": {
            **self.train.model_dump(mode="json"), **train}})

    def with_heads(self, **heads: object) -> PPOPolicySettings:
        """A copy with some `heads` fields replaced (validated)."""
        return self.from_mapping({**self.model_dump(mode="json"), "heads": {
            **self.heads.model_dump(mode="json"), **heads}})
