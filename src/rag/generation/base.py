"""The interface every generator backend implements."""

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
                 max_new_tokens: int = 48, temperature: float = 0.0) -> Generation:
        """One answer."""

    def generate_batch(self, questions: Sequence[str], contexts_list: Sequence[Sequence[Context]],
                       prompt_id: str, max_new_tokens: int = 48, temperature: float = 0.0
                       ) -> list[Generation]:
        """Many answers; backends that can batch for real override this."""
        return [self.generate(q, c, prompt_id, max_new_tokens, temperature)
                for q, c in zip(questions, contexts_list, strict=True)]
