"""SelectionConfig: configs/rl/selection.yaml, validated at load (unknown key or bad value ->
`ConfigError` naming `selection.<section>.<key>`)."""

from __future__ import annotations

import os
from importlib.resources.abc import Traversable
from typing import Any, Literal

from pydantic import Field, SerializationInfo, field_serializer, field_validator, model_validator

from rag.errors import ConfigError
from rag.resources import default_config
from rag.settings_base import StrictSettings
from rl.common.ppo_settings import SELECTION_PPO, PPOSettings

DEFAULT_PATH = default_config("rl/selection.yaml")
RETRIEVERS = ("bm25", "dense", "graph", "hybrid")


class EnvConfig(StrictSettings):
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


class RewardConfig(StrictSettings):
    answer_f1: float = Field(1.0, ge=0.0)
    support_f1: float = Field(0.5, ge=0.0)
    faithfulness: float = Field(0.0, ge=0.0)
    reward_model: float = Field(0.0, ge=0.0)
    reward_model_name: str = "quality-rm"
    passage_cost: float = Field(0.02, ge=0.0, le=1.0)
    shaping: Literal["final_only", "stepwise"] = "stepwise"
    shaping_weight: float = Field(0.1, ge=0.0, le=10.0)
    mmr_lambda: float = Field(0.6, ge=0.0, le=1.0)


class BCConfig(StrictSettings):
    hidden: int = Field(64, ge=4, le=1024)
    lr: float = Field(3e-3, gt=0.0, le=1.0)
    weight_decay: float = Field(1e-4, ge=0.0)
    epochs: int = Field(60, ge=1, le=10_000)
    batch_size: int = Field(64, ge=1)
    patience: int = Field(6, ge=1)
    val_fraction: float = Field(0.15, gt=0.0, lt=1.0)


class RaftConfig(StrictSettings):
    rounds: int = Field(3, ge=0, le=100)
    samples: int = Field(8, ge=1, le=256)
    temperature: float = Field(1.0, gt=0.0, le=10.0)
    epochs: int = Field(8, ge=1, le=1000)
    lr: float = Field(1e-3, gt=0.0, le=1.0)
    keep_expert: bool = True


class MtragConfig(StrictSettings):
    rewrite: Literal["last_turn", "concat", "generator"] = "concat"
    history_turns: int = Field(2, ge=0, le=50)
    generator: str = "smollm2-135m-instruct"


class SelectionConfig(StrictSettings):
    SECTION = "selection"

    seed: int = 0
    env: EnvConfig = EnvConfig()
    reward: RewardConfig = RewardConfig()
    bc: BCConfig = BCConfig()
    raft: RaftConfig = RaftConfig()
    ppo: PPOSettings = SELECTION_PPO.settings
    """PPO fine-tuning (`rl.common.ppo_settings`); unset keys take `SELECTION_PPO`'s values."""
    mtrag: MtragConfig = MtragConfig()

    @field_validator("ppo", mode="before")
    @classmethod
    def _ppo_defaults(cls, v: Any) -> Any:
        return SELECTION_PPO.fill(v)

    @field_serializer("ppo")
    def _ppo_keys(self, ppo: PPOSettings, info: SerializationInfo) -> dict[str, Any]:
        return SELECTION_PPO.dump(ppo, info)

    @classmethod
    def from_dict(cls, data: dict[str, Any], where: str = "selection") -> SelectionConfig:
        return cls.from_mapping(data, where)

    @classmethod
    def load(cls, path: str | os.PathLike[str] | Traversable | None = None
             ) -> SelectionConfig:
        """Read `selection: {...}` from YAML (default configs/rl/selection.yaml)."""
        return cls.from_yaml(path if path else DEFAULT_PATH)

    @classmethod
    def _section_of(cls, data: Any, name: str) -> tuple[Any, tuple[str, ...]]:
        # the file must hold exactly `selection:` (other tools' sections are typos here)
        if not isinstance(data, dict) or set(data) != {"selection"}:
            extra = sorted(set(data) - {"selection"}) if isinstance(data, dict) else []
            raise ConfigError(extra[0] if extra else "selection",
                              "unknown top-level key" if extra else "missing `selection:`",
                              source=name, line=None)
        return data["selection"] or {}, ("selection",)

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
