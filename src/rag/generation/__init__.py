"""Generation: prompt templates, backends (extractive reader, local transformers model,
OpenAI-compatible endpoint), output parsing and an on-disk cache."""

from rag.generation.base import Generator

__all__ = ["Generator"]
