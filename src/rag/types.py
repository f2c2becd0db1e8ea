"""The records that flow through the pipeline.

Units: latency in milliseconds, token counts in tokens of the generator's tokenizer (or
whitespace tokens for backends without one), scores as returned by the producing stage.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any


@dataclass(frozen=True)
class Passage:
    """One retrievable unit of text. `id` is unique within a corpus."""

    id: str
    text: str
    title: str = ""
    metadata: dict[str, Any] = field(default_factory=dict, compare=False, hash=False)

    def to_dict(self) -> dict[str, Any]:
        return {"id": self.id, "title": self.title, "text": self.text, "metadata": self.metadata}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Passage:
        return cls(id=str(d["id"]), text=d["text"], title=d.get("title", "") or "",
                   metadata=dict(d.get("metadata") or {}))


@dataclass(frozen=True)
class Example:
    """One evaluation question with whatever gold the dataset has.

    `gold_passage_ids` are ids in the corpus the question is asked against (for HotpotQA the
    supporting paragraphs' ids; for BEIR the relevant docs with grade > 0). `qrels` keeps graded
    relevance where the dataset has it. `supporting_facts` is HotpotQA's [(title, sent_id)].
    `category` drives stratified splits and per-category routing (HotpotQA: bridge/comparison).
    """

    id: str
    question: str
    answers: tuple[str, ...] = ()
    gold_passage_ids: tuple[str, ...] = ()
    qrels: dict[str, int] = field(default_factory=dict, compare=False, hash=False)
    supporting_facts: tuple[tuple[str, int], ...] = ()
    gold_titles: tuple[str, ...] = ()
    category: str = "default"
    history: tuple[dict[str, str], ...] = ()
    metadata: dict[str, Any] = field(default_factory=dict, compare=False, hash=False)

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["supporting_facts"] = [list(x) for x in self.supporting_facts]
        return d

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Example:
        return cls(
            id=str(d["id"]),
            question=d["question"],
            answers=tuple(d.get("answers") or ()),
            gold_passage_ids=tuple(d.get("gold_passage_ids") or ()),
            qrels=dict(d.get("qrels") or {}),
            supporting_facts=tuple((str(t), int(s)) for t, s in d.get("supporting_facts") or ()),
            gold_titles=tuple(d.get("gold_titles") or ()),
            category=d.get("category") or "default",
            history=tuple(d.get("history") or ()),
            metadata=dict(d.get("metadata") or {}),
        )



CONVERSATION_SEPARATOR = "<::>"
"""MTRAG task ids are `<conversation id><::><turn>`."""


def conversation_of(example: Example) -> str:
    """The conversation `example` belongs to, the unit no split or fold may cut through.

    An explicit `metadata["conversation_id"]` (user data may carry one) wins; else the part of
    the id before `CONVERSATION_SEPARATOR` (MTRAG task ids); else the id itself, so a
    single-turn question is its own conversation. Returns a non-empty string for an example
    with a non-empty id."""
    explicit = (example.metadata or {}).get("conversation_id")
    if explicit is not None and str(explicit) != "":
        return str(explicit)
    return str(example.id).split(CONVERSATION_SEPARATOR)[0]

@dataclass(frozen=True, order=True)
class Hit:
    """A retrieval or rerank result: a passage id and the stage's score (higher is better)."""

    score: float
    id: str

    def to_dict(self) -> dict[str, Any]:
        return {"id": self.id, "score": self.score}


@dataclass(frozen=True)
class Context:
    """A passage as handed to the generator, with the score that put it there."""

    id: str
    title: str
    text: str
    score: float = 0.0

    def to_dict(self) -> dict[str, Any]:
        return {"id": self.id, "title": self.title, "text": self.text, "score": self.score}


@dataclass(frozen=True)
class Generation:
    """What a generator backend returns for one prompt.

    `citations` are 1-based indices into the contexts list the prompt showed.
    """

    text: str
    raw: str
    citations: tuple[int, ...] = ()
    tokens_in: int = 0
    tokens_out: int = 0
    cached: bool = False


@dataclass(frozen=True)
class Answer:
    """The record every metric reads: one question answered by one pipeline config."""

    query_id: str
    question: str
    text: str
    citations: tuple[int, ...]
    contexts: tuple[Context, ...]
    candidates: tuple[Hit, ...]
    latency_ms: dict[str, float]
    tokens_in: int
    tokens_out: int
    config_hash: str
    raw: str = ""

    @property
    def cited_ids(self) -> tuple[str, ...]:
        """Passage ids of the cited contexts (citations out of range are dropped)."""
        n = len(self.contexts)
        return tuple(self.contexts[i - 1].id for i in self.citations if 1 <= i <= n)

    @property
    def context_ids(self) -> tuple[str, ...]:
        return tuple(c.id for c in self.contexts)

    @property
    def total_latency_ms(self) -> float:
        return float(sum(self.latency_ms.values()))

    def to_dict(self) -> dict[str, Any]:
        return {
            "query_id": self.query_id,
            "question": self.question,
            "answer": self.text,
            "citations": list(self.citations),
            "cited_ids": list(self.cited_ids),
            "contexts": [c.to_dict() for c in self.contexts],
            "candidates": [h.to_dict() for h in self.candidates],
            "latency_ms": dict(self.latency_ms),
            "tokens_in": self.tokens_in,
            "tokens_out": self.tokens_out,
            "config_hash": self.config_hash,
            "raw": self.raw,
        }

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Answer:
        return cls(
            query_id=str(d["query_id"]),
            question=d["question"],
            text=d["answer"],
            citations=tuple(d.get("citations") or ()),
            contexts=tuple(Context(**c) for c in d.get("contexts") or ()),
            candidates=tuple(Hit(id=h["id"], score=h["score"]) for h in d.get("candidates") or ()),
            latency_ms=dict(d.get("latency_ms") or {}),
            tokens_in=int(d.get("tokens_in", 0)),
            tokens_out=int(d.get("tokens_out", 0)),
            config_hash=d.get("config_hash", ""),
            raw=d.get("raw", ""),
        )
