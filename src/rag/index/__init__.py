"""Candidate retrievers behind one interface."""

from rag.index.base import Retriever

__all__ = ["Retriever"]
