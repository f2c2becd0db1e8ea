"""SelectionConfig: configs/rl/selection.yaml, validated at load (unknown key or bad value ->
`ConfigError` naming `selection.<section>.<key>`)."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from rag.config import _to_config_error
from rag.errors import ConfigError

REPO = Path(__file__).resolve().parents[3]
DEFAULT_PATH = REPO / "configs" / "rl" / "selection.yaml"
RETRIEVERS = ("bm25", "dense", "graph", "hybrid")


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class EnvConfig(_Strict):
    k: Literal[20, 50, 100] = 20
    max_steps: int = Field(4, ge=3, le=5)
    retrievers: tuple[Literal["bm25", "dense", "graph"], ...] = ("bm25", "dense", "graph")
    candidates_from: Literal["bm25", "dense", "graph", "hybrid"] = "hybrid"
    fusion_weight: float = Field(0.5, ge=0.0, le=1.0)
    reranker: Literal["none", "cosine", "cross_encoder"] = "cosine"
    reranker_model: str = "reranker-minilm@best"  # the cross-encoder (registry name or folder)

    @model_validator(mode="after")
    def _sources(self) -> EnvConfig:
        need = {"bm25", "dense"} if self.candidates_from == "hybrid" else {self.candidates_from}
        if not need <= set(self.retrievers):
            raise ValueError(f"candidates_from {self.candidates_from!r} needs retrievers "
                             f"{sorted(need)}")
        return self


class RewardConfig(_Strict):
    answer_f1: float = Field(1.0, ge=0.0)
    support_f1: float = Field(0.5, ge=0.0)
    faithfulness: float = Field(0.0, ge=0.0)
    reward_model: float = Field(0.0, ge=0.0)
    reward_model_name: str = "quality-rm"
    passage_cost: float = Field(0.02, ge=0.0, le=1.0)
    shaping: Literal["final_only", "stepwise"] = "stepwise"
    shaping_weight: float = Field(0.1, ge=0.0, le=10.0)
    mmr_lambda: float = Field(0.6, ge=0.0, le=1.0)


class BCConfig(_Strict):
    hidden: int = Field(64, ge=4, le=1024)
    lr: float = Field(3e-3, gt=0.0, le=1.0)
    weight_decay: float = Field(1e-4, ge=0.0)
    epochs: int = Field(60, ge=1, le=10_000)
    batch_size: int = Field(64, ge=1)
    patience: int = Field(6, ge=1)
    val_fraction: float = Field(0.15, gt=0.0, lt=1.0)


class RaftConfig(_Strict):
    rounds: int = Field(3, ge=0, le=100)
    samples: int = Field(8, ge=1, le=256)
    temperature: float = Field(1.0, gt=0.0, le=10.0)
    epochs: int = Field(8, ge=1, le=1000)
    lr: float = Field(1e-3, gt=0.0, le=1.0)
    keep_expert: bool = True


class PPOConfig(_Strict):
    enabled: bool = True
    iterations: int = Field(6, ge=0, le=10_000)
    train_batch_size: int = Field(256, ge=8)
    minibatch_size: int = Field(64, ge=4)
    num_epochs: int = Field(4, ge=1, le=100)
    lr: float = Field(1e-4, gt=0.0, le=1.0)
    clip_param: float = Field(0.2, gt=0.0, le=1.0)
    entropy_coeff: float = Field(0.005, ge=0.0)
    gamma: float = Field(1.0, gt=0.0, le=1.0)
    lambda_: float = Field(0.95, ge=0.0, le=1.0)

    @model_validator(mode="after")
    def _batches(self) -> PPOConfig:
        if self.minibatch_size > self.train_batch_size:
            raise ValueError("minibatch_size must be <= train_batch_size")
        return self


class MtragConfig(_Strict):
    rewrite: Literal["last_turn", "concat", "generator"] = "concat"
    history_turns: int = Field(2, ge=0, le=50)
    generator: str = "smollm2-135m-instruct"


class SelectionConfig(_Strict):
    seed: int = 0
    env: EnvConfig = EnvConfig()
    reward: RewardConfig = RewardConfig()
    bc: BCConfig = BCConfig()
    raft: RaftConfig = RaftConfig()
    ppo: PPOConfig = PPOConfig()
    mtrag: MtragConfig = MtragConfig()

    @classmethod
    def from_dict(cls, data: dict[str, Any], where: str = "selection") -> SelectionConfig:
        if not isinstance(data, dict):
            raise ConfigError(where, f"expected a mapping, got {type(data).__name__}")
        try:
            return cls.model_validate(data)
        except ValidationError as exc:
            raise _to_config_error(exc, where) from None

    @classmethod
    def load(cls, path: str | Path | None = None) -> SelectionConfig:
        """Read `selection: {...}` from YAML (default configs/rl/selection.yaml)."""
        p = Path(path) if path else DEFAULT_PATH
        if not p.exists():
            raise ConfigError("config", f"file {p} does not exist")
        try:
            data = yaml.safe_load(p.read_text()) or {}
        except yaml.YAMLError as exc:
            raise ConfigError("config", f"{p} is not valid YAML: {exc}") from None
        if not isinstance(data, dict) or set(data) != {"selection"}:
            extra = sorted(set(data) - {"selection"}) if isinstance(data, dict) else []
            raise ConfigError(extra[0] if extra else "selection",
                              "unknown top-level key" if extra else "missing `selection:`")
        return cls.from_dict(data["selection"] or {})

    def replace(self, **changes: Any) -> SelectionConfig:
        """A copy with dotted-path overrides, e.g. replace(**{"env.k": 50}), validated."""
        data = self.model_dump(mode="json")
        for key, value in changes.items():
            node = data
            parts = key.split(".")
            for part in parts[:-1]:
                if part not in node or not isinstance(node[part], dict):
                    raise ConfigError(f"selection.{key}", "unknown key")
                node = node[part]
            node[parts[-1]] = value
        return SelectionConfig.from_dict(data)
