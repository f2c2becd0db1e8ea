"""`make_generator(name)`: "extractive" or a registry generator (gguf/hf -> local transformers,
or llama.cpp when the entry says `options.runtime: llama_cpp`; openai -> an OpenAI-compatible
endpoint). `device="cuda"` runs every local entry on transformers in bf16 (the llama.cpp
runtime is built for the CPU here), a GGUF dequantised at load."""

from __future__ import annotations

from rag.errors import ConfigError
from rag.generation.base import Generator
from rag.models import ModelRegistry, default_registry


def check_generator(name: str, registry: ModelRegistry | None = None) -> None:
    """`name` is a generator `make_generator` can build: "extractive", or a registry entry of
    kind generator (ModelNotFoundError when the registry lacks it, ConfigError `generator` when
    it is another kind). Loads nothing: callers check before a run or a deployment starts."""
    if name != "extractive":
        _generator_spec(name, registry or default_registry())


def _generator_spec(name: str, reg: ModelRegistry):
    spec = reg.get(name)
    if spec.kind != "generator":
        raise ConfigError("generator", f"{name!r} is a {spec.kind}, not a generator")
    return spec


def make_generator(name: str, registry: ModelRegistry | None = None, device: str = "cpu",
                   cache: bool = True) -> Generator:
    if name == "extractive":
        from rag.generation.extractive import ExtractiveReader

        return ExtractiveReader()
    reg = registry or default_registry()
    spec = _generator_spec(name, reg)
    if spec.format == "gguf" and spec.options.get("runtime") == "llama_cpp" and device == "cpu":
        from rag.llama_runtime import LlamaCppGenerator

        return LlamaCppGenerator(name, spec.resolve(), threads=spec.options.get("threads"),
                                 n_ctx=int(spec.options.get("n_ctx", 4096)), cache=cache)
    if spec.format in ("gguf", "hf"):
        from rag.generation.local import TransformersGenerator

        return TransformersGenerator(spec, device=device, cache=cache, registry=reg)
    if spec.format == "openai":
        from rag.generation.openai_compat import OpenAIChatGenerator

        if not spec.url or "model" not in spec.options:
            raise ConfigError(f"models.{name}", "openai format needs url and options.model")
        return OpenAIChatGenerator(spec.url, spec.options["model"],
                                   api_key=spec.options.get("api_key"), cache=cache, name=name)
    raise ConfigError("generator", f"{name!r}: unsupported format {spec.format!r}")
