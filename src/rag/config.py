"""RAGConfig: everything that determines a pipeline's behaviour, frozen and hashable.

An RL action is a RAGConfig (or a delta to one); `config_hash` is the variant id used in logs,
MLflow, Prometheus labels and promotion records. Documented defaults live in
`configs/rag/default.yaml`.
"""

from __future__ import annotations

import hashlib
import json
import os
from importlib.resources.abc import Traversable
from typing import Any, Literal

import yaml
from pydantic import Field, field_validator, model_validator

from rag.errors import ConfigError
from rag.settings_base import StrictSettings

Variant = Literal["bm25", "dense", "hybrid", "graph"]
Rerank = Literal["none", "cosine", "cross_encoder"]
Normalisation = Literal["minmax", "zscore", "rrf"]
QueryFormulation = Literal["last_turn", "last_two_user", "all_user"]

MAX_CANDIDATES = 100

CONFIG_FILE_SECTIONS = ("rag", "indexes")
"""The top-level keys of a config file with a `rag:` section (`indexes:`: rag.index.settings)."""


HASH_OPTIONAL = frozenset({"rerank_mix", "abstain_threshold", "query_formulation",
                           "context_budget"})
"""Fields left out of a config's identity while unset (None)."""


class RAGConfig(StrictSettings):
    """One pipeline configuration. Field bounds are checked at construction."""

    SECTION = "rag"

    variant: Variant = "hybrid"
    """Candidate source: bm25, dense, hybrid (fusion of bm25 + dense) or graph (PPR)."""
    n_candidates: int = Field(50, ge=1, le=MAX_CANDIDATES)
    """Top-N candidates each retriever returns before fusion/rerank."""
    k: int = Field(5, ge=1, le=32)
    """Passages handed to the generator."""
    fusion_weight: float = Field(0.5, ge=0.0, le=1.0)
    """Weight of the dense scores in hybrid fusion (1 - w goes to bm25)."""
    normalisation: Normalisation = "minmax"
    """Score normalisation before the convex combination; rrf ignores scores and uses ranks."""
    rrf_k: int = Field(60, ge=1, le=1000)
    rerank: Rerank = "none"
    reranker_model: str = "minilm"
    """Registry name of the encoder (cosine) or cross-encoder used to rerank."""
    rerank_depth: int = Field(30, ge=1, le=MAX_CANDIDATES)
    """How many fused candidates the reranker rescores."""
    rerank_mix: float | None = Field(None, ge=0.0, le=1.0)
    """None: order the reranked head by the reranker's score alone. w in [0, 1]: by
    w * minmax(reranker score) + (1 - w) * minmax(-retrieval rank), so a reranker that is
    weaker than the retrieval alone can still add what the retrieval misses (the trained
    cross-encoder at w = 0.5: docs/retired_studies.md, `adaptation`)."""
    mmr_lambda: float = Field(1.0, ge=0.0, le=1.0)
    """MMR trade-off: 1.0 keeps the ranking (no diversity), lower values penalise redundancy."""
    graph_damping: float = Field(0.5, gt=0.0, lt=1.0)
    """Personalised PageRank damping (probability to follow an edge) of the graph retriever."""
    graph_seeds: int = Field(5, ge=1, le=50)
    """Lexical+dense hits that seed the graph walk."""
    prompt_id: str = "cite_concise"
    abstain_threshold: float | None = Field(None, ge=0.0, le=1.0)
    """`*_abstain` prompts with the extractive generator: abstain when no sentence holds at
    least this share of the question's content words. None: the generator's default
    (`ExtractiveReader.abstain_below`, 0.5). Other generators ignore it."""
    query_formulation: QueryFormulation | None = None
    """Conversations: the retrieval query built from the history and the question
    (`rag.query_formulation`): last_turn (the question alone; also what None means),
    last_two_user (the previous user turn + the question), all_user (every user turn). The
    generator always answers the question itself."""
    context_budget: int | None = Field(None, ge=1, le=1024)
    """Tokens (whitespace words) kept per passage handed to the generator: each passage's
    sentences that best cover the question's content words, up to this many, the best one
    always (`rag.generation.context.compress`). None: whole passages."""
    generator: str = "extractive"
    """Registry name of the generator backend (`extractive`, `smollm2-135m-instruct`, ...)."""
    max_new_tokens: int = Field(48, ge=1, le=1024)
    temperature: float = Field(0.0, ge=0.0, le=2.0)
    encoder: str = "minilm"
    """Registry name of the bi-encoder used by the dense index."""
    dense_index: Literal["flat", "hnsw"] = "flat"
    bm25_backend: Literal["tantivy", "bm25s"] = "tantivy"
    device: Literal["cpu", "cuda"] = "cpu"

    @field_validator("prompt_id")
    @classmethod
    def _known_prompt(cls, v: str) -> str:
        # every generator reads it (the extractive one its `*_abstain` variants), so an
        # unknown id is refused here, not only once an LLM generator looks it up
        from rag.generation.prompts import list_prompts

        if v not in list_prompts():
            raise ValueError(f"unknown prompt {v!r} (known: {', '.join(list_prompts())})")
        return v

    @model_validator(mode="after")
    def _check(self) -> RAGConfig:
        if self.rerank_depth < self.k and self.rerank != "none":
            raise ValueError(f"rerank_depth ({self.rerank_depth}) must be >= k ({self.k})")
        if self.n_candidates < self.k:
            raise ValueError(f"n_candidates ({self.n_candidates}) must be >= k ({self.k})")
        return self

    # ---- identity -----------------------------------------------------------------------
    def canonical_json(self) -> str:
        """Sorted-key JSON of every field, except optional fields added after configs were
        first hashed (`HASH_OPTIONAL`) while they are None: their old hashes stay valid."""
        d = {k: v for k, v in self.model_dump(mode="json").items()
             if not (k in HASH_OPTIONAL and v is None)}
        return json.dumps(d, sort_keys=True, separators=(",", ":"))

    @property
    def config_hash(self) -> str:
        """12 hex chars of sha256 over the canonical JSON: the variant id."""
        return hashlib.sha256(self.canonical_json().encode()).hexdigest()[:12]

    def replace(self, **changes: Any) -> RAGConfig:
        """A validated copy with `changes` applied (typed errors like `from_dict`)."""
        return RAGConfig.from_dict({**self.model_dump(), **changes})

    # ---- (de)serialisation --------------------------------------------------------------
    @classmethod
    def from_dict(cls, data: dict[str, Any], where: str = "rag") -> RAGConfig:
        """`from_mapping` under its historical name (errors name `<where>.<key>`)."""
        return cls.from_mapping(data, where)

    @classmethod
    def from_yaml(cls, path: str | os.PathLike[str] | Traversable) -> RAGConfig:
        """Load `rag: {...}` (or a bare mapping) from YAML; errors name the offending key, the
        file and the line."""
        return super().from_yaml(path)

    @classmethod
    def _section_of(cls, data: Any, name: str) -> tuple[Any, tuple[str, ...]]:
        # a config file may hold the index backends (`indexes:`) beside `rag:`; any other key
        # there is a typo or a misplaced RAG key, which would be silently ignored
        if isinstance(data, dict) and "rag" in data:
            extra = sorted(str(k) for k in data if k not in CONFIG_FILE_SECTIONS)
            if extra:
                raise ConfigError(extra[0], f"unknown top-level key beside `rag:` (a config "
                                            f"file holds {', '.join(CONFIG_FILE_SECTIONS)}); "
                                            "RAG settings go under `rag:`", source=name)
            return data["rag"], ("rag",)
        return data, ()

    def to_yaml(self) -> str:
        return yaml.safe_dump({"rag": self.model_dump(mode="json")}, sort_keys=False)
