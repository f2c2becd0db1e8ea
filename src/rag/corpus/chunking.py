"""Token-based chunking: long passages become overlapping windows of ~150-250 tokens, each
prefixed with the title; short passages stay whole. Tokens are word tokens by default, or a
Hugging Face tokenizer's tokens when one is given (then counts match the model's window)."""

from __future__ import annotations

import re
from collections.abc import Iterable

from rag.errors import ConfigError
from rag.types import Passage

_TOKEN = re.compile(r"\S+")


def chunk_passages(passages: Iterable[Passage], max_tokens: int = 200, overlap: int = 40,
                   min_tokens: int = 150, tokenizer=None) -> list[Passage]:
    """Chunk ids are `<passage id>#<n>`; metadata has `parent`, `chunk`, `start_token`.
    A passage of at most `max_tokens` tokens is kept as it is (same id)."""
    if not 1 <= max_tokens <= 4096:
        raise ConfigError("max_tokens", "must be in [1, 4096]")
    if not 0 <= overlap < max_tokens:
        raise ConfigError("overlap", f"must be in [0, max_tokens={max_tokens})")
    if not 0 < min_tokens <= max_tokens:
        raise ConfigError("min_tokens", "must be in (0, max_tokens]")
    out: list[Passage] = []
    for p in passages:
        if tokenizer is not None:
            pieces = tokenizer(p.text, add_special_tokens=False)["input_ids"]
            join = tokenizer.decode
        else:
            pieces = _TOKEN.findall(p.text)
            join = " ".join
        if len(pieces) <= max_tokens:
            out.append(p)
            continue
        step = max_tokens - overlap
        starts = list(range(0, len(pieces), step))
        # fold a short tail into the previous window instead of emitting a scrap
        if len(starts) > 1 and len(pieces) - starts[-1] < min_tokens - overlap:
            starts.pop()
        for n, s in enumerate(starts):
            end = len(pieces) if n == len(starts) - 1 else s + max_tokens
            body = join(pieces[s:end]).strip()
            text = f"{p.title}: {body}" if p.title else body
            out.append(Passage(f"{p.id}#{n}", text, p.title,
                               {**p.metadata, "parent": p.id, "chunk": n, "start_token": s}))
    return out
