"""The interface every generator backend implements.

`abstain_threshold` (`RAGConfig.abstain_threshold`, [0, 1] or None) is a keyword every backend
accepts: the extractive reader's coverage threshold for `*_abstain` prompts; model backends
ignore it (their prompt asks them to abstain)."""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Sequence

from rag.types import Context, Generation


class Generator(ABC):
    """question + numbered contexts -> Generation (answer text, 1-based citations, tokens)."""

    name: str = "generator"
    fingerprint: str = ""

    @abstractmethod
    def generate(self, question: str, contexts: Sequence[Context], prompt_id: str,
                 max_new_tokens: int = 48, temperature: float = 0.0,
                 abstain_threshold: float | None = None) -> Generation:
        """One answer."""

    def generate_batch(self, questions: Sequence[str], contexts_list: Sequence[Sequence[Context]],
                       prompt_id: str, max_new_tokens: int = 48, temperature: float = 0.0,
                       abstain_threshold: float | None = None) -> list[Generation]:
        """Many answers; backends that can batch for real override this."""
        kw = {} if abstain_threshold is None else {"abstain_threshold": abstain_threshold}
        return [self.generate(q, c, prompt_id, max_new_tokens, temperature, **kw)
                for q, c in zip(questions, contexts_list, strict=True)]
