"""Prompt-template registry. Contexts are shown numbered `[1] Title: text`; citation prompts ask
for `<answer> [1][3]`; the `*_abstain` variants ask for exactly INSUFFICIENT when the passages do
not hold the answer."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from rag.errors import ConfigError
from rag.types import Context

INSUFFICIENT = "insufficient context"
MAX_CONTEXT_CHARS = 1200  # per passage; keeps prompts inside a small model's window


@dataclass(frozen=True)
class PromptTemplate:
    id: str
    system: str
    instruction: str
    cites: bool = True
    concise: bool = True

    def render_contexts(self, contexts: Sequence[Context]) -> str:
        return "\n".join(f"[{i}] {c.title}: {c.text[:MAX_CONTEXT_CHARS]}"
                         for i, c in enumerate(contexts, 1))

    def messages(self, question: str, contexts: Sequence[Context]) -> list[dict[str, str]]:
        """Chat messages (system + user) for chat models and endpoints."""
        user = (f"Passages:\n{self.render_contexts(contexts)}\n\nQuestion: {question}\n"
                f"{self.instruction}")
        return [{"role": "system", "content": self.system}, {"role": "user", "content": user}]

    def text(self, question: str, contexts: Sequence[Context]) -> str:
        """Plain-text rendering for base models and completion endpoints."""
        return (f"{self.system}\n\nPassages:\n{self.render_contexts(contexts)}\n\n"
                f"Question: {question}\n{self.instruction}\nAnswer:")


_SYS = "You answer questions using only the numbered passages."
_REGISTRY: dict[str, PromptTemplate] = {t.id: t for t in [
    PromptTemplate("cite_concise", _SYS,
                   "Reply with only the answer (a few words: a name, number, date, or yes/no) "
                   "and then the numbers of the passages that support it in brackets."),
    PromptTemplate("cite_verbose", _SYS,
                   "Reply with one sentence that answers the question and cite the passages "
                   "you used by their numbers in brackets.", concise=False),
    PromptTemplate("cite_long", _SYS,
                   "Reply with two or three sentences that answer the question, and end each "
                   "sentence with the number of the passage that supports it in brackets, like "
                   "[2].", concise=False),
    PromptTemplate("cite_concise_abstain", _SYS,
                   "Reply with only the answer (a few words: a name, number, date, or yes/no) "
                   "and then the numbers of the passages that support it in brackets. If the "
                   "passages do "
                   f"not contain the answer, reply exactly: {INSUFFICIENT}"),
    PromptTemplate("plain", "Answer the question using the passages.",
                   "Answer in a few words.", cites=False),
    PromptTemplate("plain_verbose", "Answer the question using the passages.",
                   "Answer in one sentence.", cites=False, concise=False),
]}


def get_prompt(prompt_id: str) -> PromptTemplate:
    try:
        return _REGISTRY[prompt_id]
    except KeyError:
        raise ConfigError("prompt_id", f"unknown prompt {prompt_id!r} (known: "
                                       f"{', '.join(sorted(_REGISTRY))})") from None


def list_prompts() -> list[str]:
    return sorted(_REGISTRY)
