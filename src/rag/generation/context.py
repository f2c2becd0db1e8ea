"""Context compression: hand the generator only the sentences of each passage that matter for
the question, so it reads (and a priced LLM bills) fewer tokens.

`compress(question, text, budget)` splits a passage into sentences as the extractive reader
does (`rag.generation.extractive`), scores each by how many distinct content words of the
question it holds (lower-cased words outside a stop list; ties go to the earlier sentence),
and keeps the best ones while their whitespace tokens fit `budget`.
The best sentence is always kept, even when it alone is longer than `budget`, so no passage
becomes empty. Kept sentences stay in their original order, joined by one space.

The score is lexical on purpose: it costs microseconds per passage (no model call the latency
model would have to price) and needs nothing beyond the question and the passage. What it can
lose: a sentence that answers the question without repeating its words (a pronoun-led second
sentence, say). Only a metric that reads the handed-over text sees that loss: an answer
metric (F1 of the answer, its support in the cited passages), not doc-level recall or nDCG.
"""

from __future__ import annotations

from rag.generation.extractive import _SENT, _content


def compress(question: str, text: str, budget: int) -> str:
    """The sentences of `text` that best cover `question`'s content words, up to `budget`
    whitespace tokens (module docstring). `budget` >= 1, else ValueError. A passage that
    already fits is returned unchanged."""
    if isinstance(budget, bool) or not isinstance(budget, int) or budget < 1:
        raise ValueError(f"budget must be a whole number of tokens >= 1, got {budget!r}")
    if len(text.split()) <= budget:
        return text
    sents = [s.strip() for s in _SENT.split(text) if s.strip()]  # the reader's sentences
    qw = set(_content(question))
    ranked = sorted(range(len(sents)), key=lambda i: (-len(qw & set(_content(sents[i]))), i))
    keep, used = [], 0
    for i in ranked:
        n = len(sents[i].split())
        if keep and used + n > budget:
            continue
        keep.append(i)
        used += n
    return " ".join(sents[i] for i in sorted(keep))
