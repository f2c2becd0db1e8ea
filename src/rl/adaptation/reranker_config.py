"""Configuration of cross-encoder reranker training (`ragpilot train-reranker`).

`RerankerTrainConfig` is read from the `reranker:` mapping of configs/rl/reranker.yaml; every
field is bounds-checked at load and an unknown or bad key raises `ConfigError` naming it
(`reranker.data.depth`). The trainer beside it is `rl.adaptation.reranker_trainer`.

Field groups (the YAML keys):
- identity: `name` (registry name of the trained model), `base_model`, `pooler_init`;
- model input: `max_length`, `group_size` (1 gold + group_size - 1 negatives per query);
- optimisation: `loss`, `margin`, `lr`, `head_lr`, `weight_decay`, `warmup_frac`, `epochs`,
  `batch_groups`, `max_items`, `seed`;
- curriculum: `hard_phase`, `hard_top`;
- run: `checkpoint_every`, `threads`;
- `data` (`DataSpec`): which train splits are mined and how negatives are drawn;
- `eval` (`EvalSpec`): the held-out check after training, whose metric decides `@best`;
- tracking: `mlflow`, `mlflow_dir`.
"""

from __future__ import annotations

import hashlib
import json
from typing import Any, Literal

from pydantic import Field, field_validator

from rag.settings_base import StrictSettings
from rl.adaptation.data import TRAIN_SPLITS

DATASETS = ("scifact", "hotpotqa", "mtrag")


class SourceSpec(StrictSettings):
    """One dataset the training items are mined from."""

    split: str = "train"
    """A training split only (valid/test queries must never train)."""
    max_queries: int | None = Field(None, ge=1)
    """Cap on the queries mined from this source (None: all of the split)."""

    @field_validator("split")
    @classmethod
    def _train_only(cls, v: str) -> str:
        if v not in TRAIN_SPLITS:
            raise ValueError(f"{v!r} is not a training split (allowed: {', '.join(TRAIN_SPLITS)})"
                             "; valid/test queries must never train")
        return v


class DataSpec(StrictSettings):
    """Mining of (query, gold passage, hard/easy negatives) items."""

    sources: dict[Literal["scifact", "hotpotqa", "mtrag"], SourceSpec] = Field(
        default_factory=lambda: {"scifact": SourceSpec()})
    retriever: Literal["bm25", "dense", "hybrid"] = "hybrid"
    """The retrieval whose top non-gold candidates become hard negatives."""
    depth: int = Field(30, ge=2, le=100)
    """Retrieval depth the hard negatives are taken from."""
    n_hard: int = Field(10, ge=1, le=100)
    """Hard negatives kept per item (the top non-gold retrieval candidates)."""
    n_easy: int = Field(10, ge=0, le=100)
    """Random corpus passages kept per item."""


class EvalSpec(StrictSettings):
    """A small held-out check after training (never the test split: that is for reports)."""

    dataset: Literal["scifact", "hotpotqa", "mtrag"] = "scifact"
    split: Literal["valid"] = "valid"
    queries: int = Field(40, ge=1)
    depth: int = Field(20, ge=2, le=100)
    """Candidates reranked per query."""
    metric: str = "ndcg@10"
    """Reported as `<dataset>_<split>_<metric>`; higher is better and decides `@best`."""


class RerankerTrainConfig(StrictSettings):
    SECTION = "reranker"

    # -- identity -------------------------------------------------------------------------------
    name: str = Field("reranker-minilm", pattern=r"^[A-Za-z0-9][A-Za-z0-9_.-]*$")
    """Registry name of the trained model (versions are `<name>@v<N>`, best `<name>@best`)."""
    base_model: str = "minilm"
    """Registry name (or local directory) of the BERT encoder the cross-encoder starts from."""
    pooler_init: Literal["identity", "pretrained"] = "identity"
    """identity: the head sees tanh([CLS]) at the start. The packaged pooler was never trained
    for this (the bi-encoder mean-pools), its outputs barely vary across inputs (measured std
    0.036 vs 0.21 for [CLS]), which stalls the new head's learning."""
    # -- model input ----------------------------------------------------------------------------
    max_length: int = Field(256, ge=16, le=512)
    """Tokens of the joint "[CLS] query [SEP] passage [SEP]" input (also the serving cut)."""
    group_size: int = Field(4, ge=2, le=32)
    """Passages per query group: 1 gold + group_size - 1 negatives."""
    # -- optimisation ---------------------------------------------------------------------------
    batch_groups: int = Field(2, ge=1, le=64)
    """Query groups per optimiser step (batch_groups * group_size sequences)."""
    loss: Literal["listwise", "margin"] = "listwise"
    """listwise: softmax cross-entropy over a group; margin: mean pairwise hinge."""
    margin: float = Field(1.0, gt=0.0)
    lr: float = Field(4e-5, gt=0.0, le=1e-2)
    """Learning rate of the encoder."""
    head_lr: float = Field(2e-3, gt=0.0, le=1e-1)
    """Learning rate of the freshly initialised classifier head."""
    weight_decay: float = Field(0.01, ge=0.0, le=1.0)
    warmup_frac: float = Field(0.1, ge=0.0, lt=1.0)
    """Fraction of steps with a linear warm-up (then linear decay to 0)."""
    epochs: float = Field(1.0, gt=0.0, le=20.0)
    max_items: int | None = Field(None, ge=1)
    """Cap on the mined items trained on (None: all)."""
    # -- curriculum -----------------------------------------------------------------------------
    hard_phase: float = Field(0.5, ge=0.0, le=1.0)
    """Fraction of steps whose negatives all come from the head of the retrieval list."""
    hard_top: int = Field(5, ge=1, le=100)
    """How deep "the head of the retrieval list" goes during the hard phase."""
    # -- run ------------------------------------------------------------------------------------
    checkpoint_every: int = Field(25, ge=1)
    threads: int = Field(1, ge=1, le=64)
    seed: int = 0
    # -- data, evaluation, tracking -------------------------------------------------------------
    data: DataSpec = DataSpec()
    eval: EvalSpec | None = EvalSpec()
    """None: no held-out check (then `@best` stays on the first version)."""
    mlflow: bool = True
    mlflow_dir: str = "runs/mlflow"

    def fingerprint(self) -> str:
        """Hash of everything that changes the trained weights (not eval/logging settings)."""
        d = self.model_dump(mode="json", exclude={"eval", "mlflow", "mlflow_dir",
                                                  "checkpoint_every", "threads"})
        return hashlib.sha256(json.dumps(d, sort_keys=True).encode()).hexdigest()[:12]

    def eval_key(self) -> str | None:
        """The eval metric's key in the metrics dict (`scifact_valid_ndcg@10`), None without
        an eval; it decides the registry's `@best`."""
        e = self.eval
        return f"{e.dataset}_{e.split}_{e.metric}" if e else None

    @classmethod
    def from_dict(cls, data: Any) -> RerankerTrainConfig:
        """A mapping, bare or as `{reranker: {...}}`; errors name `reranker.<key>`."""
        data, _ = cls._section_of(data, "")
        return cls.from_mapping(data)

    def replace(self, **changes: Any) -> RerankerTrainConfig:
        return self.from_dict({**self.model_dump(mode="json"), **changes})
