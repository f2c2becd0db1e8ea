"""Corpora, datasets and their manifests."""

from rag.corpus.store import Corpus

__all__ = ["Corpus"]
