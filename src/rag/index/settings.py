"""Index-backend settings: which engine serves the lexical and the dense candidates, where FAISS
runs, and how to reach OpenSearch.

These are *not* RAGConfig fields: a RAGConfig (and its hash, the variant id) says what a pipeline
computes; these settings say where its retrieval runs. They live in the `indexes:` section of a
config file (configs/rag/default.yaml documents every key), are stored in an IndexSet's
manifest.json when it is created, and are reused when it is reopened:

    indexes:
      lexical: null          # null (the rag config's bm25_backend) | tantivy | bm25s | opensearch
      dense: faiss           # faiss (dense_index flat | hnsw, on disk) | opensearch (kNN)
      faiss_device: null     # null ($RAGPILOT_FAISS_DEVICE, else the encoder device) | cpu | gpu
      opensearch: {url: null, index_prefix: ragpilot, timeout_s: 30, verify_tls: true}

Unknown keys and bad values are ConfigErrors naming the key (`indexes.opensearch.url: ...`).
Whether the environment can honour the settings (a GPU faiss build, a reachable OpenSearch) is
checked when an IndexSet is created or opened with them (`rag.indexset`), never by falling back.
"""

from __future__ import annotations

import os
import re
from importlib.resources.abc import Traversable
from typing import Any, Literal
from urllib.parse import urlsplit, urlunsplit

from pydantic import Field, field_validator, model_validator

from rag.errors import ConfigError
from rag.settings_base import StrictSettings, YamlSource

SECTION = "indexes"
OPENSEARCH_URL_ENV = "RAGPILOT_OPENSEARCH_URL"
FAISS_DEVICE_ENV = "RAGPILOT_FAISS_DEVICE"
INDEX_PREFIX_RE = re.compile(r"^[a-z0-9][a-z0-9_-]{0,59}$")


def public_url(url: str) -> str:
    """`url` without credentials, query or fragment (what manifests and errors show)."""
    p = urlsplit(url)
    try:
        port = p.port
    except ValueError:
        port = None
    host = p.hostname or ""
    netloc = f"{host}:{port}" if port else host
    return urlunsplit((p.scheme, netloc, p.path, "", ""))


def check_url(url: str) -> str:
    """`url` if it is an http(s)://host[:port] URL; ValueError (without its credentials)
    otherwise."""
    p = urlsplit(url)
    try:
        p.port  # noqa: B018 - raises on a non-numeric or out-of-range port
    except ValueError:
        raise ValueError(f"has a bad port: {public_url(url)!r}") from None
    if p.scheme not in ("http", "https") or not p.hostname:
        raise ValueError(f"must be an http(s)://host:port URL, got {public_url(url)!r}")
    return url


class OpenSearchSettings(StrictSettings):
    """How to reach the OpenSearch cluster (used when lexical or dense is `opensearch`)."""

    url: str | None = None
    """http(s)://host:port; credentials may sit in it (never stored). null: the URL in
    $RAGPILOT_OPENSEARCH_URL, else the one stored in the index directory's manifest."""
    index_prefix: str = "ragpilot"
    """The OpenSearch index is `<index_prefix>-<corpus fingerprint>` (lower-case, [a-z0-9_-])."""
    timeout_s: float = Field(30.0, gt=0.0, le=600.0)
    verify_tls: bool = True
    """false skips TLS certificate checks (test clusters only; also RAGPILOT_OPENSEARCH_VERIFY=0)."""

    @field_validator("url")
    @classmethod
    def _url(cls, v: str | None) -> str | None:
        return None if v is None else check_url(v)

    @field_validator("index_prefix")
    @classmethod
    def _prefix(cls, v: str) -> str:
        if not INDEX_PREFIX_RE.match(v):
            raise ValueError(f"must match {INDEX_PREFIX_RE.pattern} (an OpenSearch index name "
                             f"prefix), got {v!r}")
        return v

    def index_name(self, corpus_fingerprint: str) -> str:
        return f"{self.index_prefix}-{corpus_fingerprint[:16]}"


class IndexSettings(StrictSettings):
    """The `indexes:` section. Defaults reproduce the local stack (tantivy/bm25s + FAISS)."""

    SECTION = SECTION

    lexical: Literal["tantivy", "bm25s", "opensearch"] | None = None
    """null: the local backend the rag config's `bm25_backend` names. tantivy | bm25s: only that
    one (a config asking the other is an error). opensearch: BM25 on the OpenSearch index,
    whatever `bm25_backend` says."""
    dense: Literal["faiss", "opensearch"] = "faiss"
    """faiss: FAISS on disk (`dense_index` flat | hnsw). opensearch: kNN (Lucene HNSW) on the
    OpenSearch index over the same MiniLM vectors, whatever `dense_index` says."""
    faiss_device: Literal["cpu", "gpu"] | None = None
    """Where FAISS searches. null: $RAGPILOT_FAISS_DEVICE, else the index set's device. gpu needs
    the faiss GPU build (the `gpu` extra) and a visible GPU, else a ConfigError naming this key."""
    opensearch: OpenSearchSettings = OpenSearchSettings()

    @model_validator(mode="after")
    def _check(self) -> IndexSettings:
        if self.dense == "opensearch" and self.faiss_device is not None:
            raise ValueError("faiss_device is set but dense is opensearch (no FAISS index is "
                             "searched); drop faiss_device or use dense: faiss")
        return self

    @property
    def uses_opensearch(self) -> bool:
        return "opensearch" in (self.lexical, self.dense)

    # ---- (de)serialisation ------------------------------------------------------------------
    @classmethod
    def from_dict(cls, data: dict[str, Any] | None, where: str = SECTION) -> IndexSettings:
        """`from_mapping`, None reading as the defaults."""
        return cls() if data is None else cls.from_mapping(data, where)

    @classmethod
    def section_from_yaml(cls, path: str | os.PathLike[str] | Traversable
                          ) -> IndexSettings | None:
        """The `indexes:` section of a YAML file (e.g. next to `rag:`), validated; None when
        the file has no such section."""
        src = YamlSource.read(path)
        data = src.data
        if not isinstance(data, dict) or SECTION not in data:
            return None
        section = data[SECTION] if data[SECTION] is not None else {}
        return cls.from_mapping(section, SECTION, src.under(SECTION))

    @classmethod
    def from_yaml(cls, path: str | os.PathLike[str] | Traversable) -> IndexSettings:
        """The `indexes:` section of a YAML file; the defaults when it has none."""
        return cls.section_from_yaml(path) or cls()

    def to_manifest(self) -> dict[str, Any]:
        """What manifest.json stores: every key, the URL without credentials."""
        data = self.model_dump(mode="json")
        if self.opensearch.url:
            data["opensearch"]["url"] = public_url(self.opensearch.url)
        return data

    def overridden(self, overrides: IndexSettings | dict[str, Any] | None,
                   where: str = SECTION) -> IndexSettings:
        """These settings with the keys `overrides` sets explicitly replaced (nested: one
        `opensearch.url` replaces only the URL); validated again."""
        if overrides is None:
            return self
        if isinstance(overrides, IndexSettings):
            over = overrides.model_dump(mode="json", exclude_unset=True)
        elif isinstance(overrides, dict):
            over = IndexSettings.from_dict(overrides, where).model_dump(
                mode="json", exclude_unset=True)
        else:
            raise ConfigError(where, "must be a mapping")
        data = self.model_dump(mode="json")
        for k, v in over.items():
            if k == "opensearch" and isinstance(v, dict):
                data["opensearch"] = {**data["opensearch"], **v}
            else:
                data[k] = v
        return IndexSettings.from_dict(data, where)


def coerce(settings: IndexSettings | dict[str, Any] | None, where: str = SECTION
           ) -> IndexSettings:
    if isinstance(settings, IndexSettings):
        return settings
    return IndexSettings.from_dict(settings, where)
