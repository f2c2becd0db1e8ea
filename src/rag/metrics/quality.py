"""RAGAS-compatible answer and context quality, computed offline with the local MiniLM encoder and
deterministic rules instead of an LLM judge.

`QualityScorer().score(answer, example)` returns (keys that cannot be computed are left out):

  faithfulness       supported answer claims / answer claims, against the cited contexts (all
                     contexts when the answer cites none); left out for an abstention
                     (rag.generation.prompts.INSUFFICIENT, "I don't know", ...) and a bare yes/no
  answer_relevancy   mean cosine(question, generated question) with a `question_generator`, else
                     cosine(question, answer statement); 0 for an abstention; left out
                     without a question
  context_precision  ragas' mean of precision@k over the ranks k holding a relevant context;
                     relevance = gold passage ids when the example has them, else "supports a
                     claim of the reference answer" (of the answer when there is no reference)
  context_recall     gold passages among the contexts / gold passages; without gold ids, reference
                     claims supported by the contexts / reference claims

All values lie in [0, 1]. Claims and support: `rag.metrics.support`. Definitions and every
difference from ragas: docs/quality.md.
"""

from __future__ import annotations

import hashlib
import json
import re
import threading
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Literal

import numpy as np

from rag.metrics.claims import (
    extract_claims,
    is_factoid,
    is_noncommittal,
    is_yes_no,
    strip_citations,
)
from rag.metrics.embedding import Embedder
from rag.metrics.support import SupportConfig, SupportJob, SupportResult
from rag.types import Answer, Context, Example

__all__ = ["METRICS", "QualityScorer", "context_precision_from_relevance",
           "context_recall_from_ids", "SupportConfig"]

METRICS = ("faithfulness", "answer_relevancy", "context_precision", "context_recall")
QuestionGenerator = Callable[[str], Sequence[str]]
_POLAR = re.compile(r"^\s*(is|are|was|were|do|does|did|can|could|has|have|had|will|would|"
                    r"should|am)\b", re.I)


def context_precision_from_relevance(relevant: Sequence[bool | int]) -> float:
    """ragas context precision of one ranked list: sum_k precision@k * v_k / (relevant in top K).
    [1, 0, 1] -> (1/1 + 2/3) / 2; no relevant context -> 0."""
    hits, total = 0, 0.0
    for k, v in enumerate(relevant, 1):
        if v:
            hits += 1
            total += hits / k
    return total / hits if hits else 0.0


def context_recall_from_ids(context_ids: Iterable[str], gold_ids: Iterable[str]) -> float:
    """Share of the gold passages that are among the contexts (0 when there is no gold)."""
    gold = set(gold_ids)
    return len(gold & set(context_ids)) / len(gold) if gold else 0.0


def _gold_ids(example: Example | None) -> set[str]:
    if example is None:
        return set()
    if example.qrels:
        return {d for d, g in example.qrels.items() if g > 0}
    return set(example.gold_passage_ids)


@dataclass
class _Plan:
    """One answer's work: values known without embeddings, and the jobs that need them."""

    key: str
    row: dict[str, float] = field(default_factory=dict)
    faith: SupportJob | None = None
    ctx_job: SupportJob | None = None
    ctx_metrics: tuple[str, ...] = ()
    question: str = ""
    statements: tuple[str, ...] = ()

    def requests(self) -> dict[str, list[str]]:
        req: dict[str, list[str]] = {m: [] for m in METRICS}
        if self.faith is not None:
            req["faithfulness"] += self.faith.texts()
        if self.statements:
            req["answer_relevancy"] += [self.question, *self.statements]
        if self.ctx_job is not None:
            req[self.ctx_metrics[0]] += self.ctx_job.texts()
        return req


class QualityScorer:
    """Deterministic RAGAS-style scorer (module docstring). Thread-safe; results are cached in
    memory by a content hash of (question, answer text, citations, context ids/titles/texts,
    reference answers, gold ids), embeddings by a hash of the text.

    `encoder`: a loaded `rag.encoders.Encoder` (default: `Encoder.from_registry(encoder_name)`,
    loaded on first use). `question_generator`: answer text -> questions (ragas' LLM step), e.g.
    an LLM behind `rag.generation`; without it answer relevancy uses the embedding fallback.
    `relevancy_statement`: how a short factoid answer is embedded in that fallback: "answer"
    (default: the answer alone, the most discriminative on HotpotQA, see docs/quality.md) or
    "question+answer".
    `metrics`: compute only these of METRICS (default all; the others are left out of every
    row and cost nothing), e.g. to time one metric.
    `support=SupportConfig(qa=QAConsistency(generator))` adds the optional QA-consistency
    signal to faithfulness (rag.metrics.support.QAConsistency; off by default, the default
    scores and cache keys are unchanged); context precision/recall never use it.
    """

    def __init__(self, encoder=None, *, encoder_name: str = "minilm",
                 support: SupportConfig | None = None,
                 question_generator: QuestionGenerator | None = None,
                 relevancy_statement: Literal["answer", "question+answer"] = "answer",
                 cache_results: bool = True, max_results: int = 100_000,
                 metrics: Sequence[str] | None = None):
        if relevancy_statement not in ("answer", "question+answer"):
            raise ValueError(f"relevancy_statement must be 'answer' or 'question+answer', "
                             f"not {relevancy_statement!r}")
        unknown = [m for m in (metrics or ()) if m not in METRICS]
        if unknown:
            raise ValueError(f"metrics: unknown metric {unknown[0]!r} (known: "
                             f"{', '.join(METRICS)})")
        self.metrics = tuple(m for m in METRICS if metrics is None or m in metrics)
        self.support = support or SupportConfig()
        self.embedder = Embedder(encoder, encoder_name=encoder_name)
        self.question_generator = question_generator
        self.relevancy_statement = relevancy_statement
        self.cache_results = cache_results
        self.max_results = max_results
        self._results: dict[str, dict[str, float]] = {}
        self._lock = threading.RLock()
        self._counts = {"answers": 0, "result_cache_hits": 0, "question_generator_calls": 0}

    # ---- public API ----------------------------------------------------------------------
    def score(self, answer: Answer, example: Example | None = None) -> dict[str, float]:
        return self.score_batch([answer], [example])[0]

    def score_batch(self, answers: Sequence[Answer],
                    examples: Sequence[Example | None] | None = None) -> list[dict[str, float]]:
        """Scores of each answer (with its example, or None); all embeddings the batch needs
        are computed in one pass."""
        answers = list(answers)
        examples = list(examples) if examples is not None else [None] * len(answers)
        if len(examples) != len(answers):
            raise ValueError(f"{len(answers)} answers but {len(examples)} examples")
        with self._lock:
            keys = [self._key(a, e) for a, e in zip(answers, examples, strict=True)]
            plans: dict[str, _Plan] = {}
            for k, a, e in zip(keys, answers, examples, strict=True):
                self._counts["answers"] += 1
                if k in self._results or k in plans:
                    self._counts["result_cache_hits"] += 1
                    continue
                plans[k] = self._plan(k, a, e)
            requests: dict[str, list[str]] = {m: [] for m in METRICS}
            for p in plans.values():
                for m, texts in p.requests().items():
                    requests[m] += texts
            self.embedder.ensure(requests)
            fresh = {k: self._finish(p) for k, p in plans.items()}
            if self.cache_results:
                for k, row in fresh.items():
                    if len(self._results) >= self.max_results:
                        self._results.pop(next(iter(self._results)))
                    self._results[k] = row
            return [dict(fresh[k] if k in fresh else self._results[k]) for k in keys]

    def faithfulness_details(self, answer: Answer) -> SupportResult | None:
        """The claims of `answer`, their support scores and verdicts (None for no claims)."""
        claims = extract_claims(answer.text, answer.question)
        if not claims:
            return None
        job = SupportJob(claims, self._used_contexts(answer), self.support, answer.question)
        self.embedder.ensure({"faithfulness": job.texts()})
        return job.finish(self.embedder.get)

    @property
    def usage(self) -> dict[str, dict[str, float] | float]:
        """Cost accounting: per metric `encoder_calls`, `texts` and `tokens` encoded for it and
        `cache_hits`; `total` over metrics (with `seconds` spent encoding); and the counters
        `answers`, `result_cache_hits`, `question_generator_calls`."""
        per = {m: dict(self.embedder.usage[m]) for m in METRICS}
        if "unplanned" in self.embedder.usage:
            per["unplanned"] = dict(self.embedder.usage["unplanned"])
        total = {k: sum(u[k] for u in per.values())
                 for k in ("encoder_calls", "texts", "tokens", "cache_hits")}
        total["seconds"] = round(self.embedder.seconds, 6)
        extra = {"qa_consistency_calls": self.support.qa.calls} if self.support.qa else {}
        return {**per, "total": total, **self._counts, **extra}

    def clear_cache(self) -> None:
        with self._lock:
            self._results.clear()
            self.embedder.clear()

    # ---- internals -----------------------------------------------------------------------
    def _key(self, answer: Answer, example: Example | None) -> str:
        payload = [answer.question, answer.text, list(answer.citations),
                   [[c.id, c.title, c.text] for c in answer.contexts],
                   list(example.answers) if example else None,
                   sorted(_gold_ids(example)), self.relevancy_statement,
                   repr(self.support), self.embedder.encoder_name, list(self.metrics)]
        return hashlib.sha256(json.dumps(payload, ensure_ascii=False).encode()).hexdigest()

    @staticmethod
    def _used_contexts(answer: Answer) -> tuple[Context, ...]:
        n = len(answer.contexts)
        cited = sorted({i for i in answer.citations if 1 <= i <= n})
        return tuple(answer.contexts[i - 1] for i in cited) if cited else answer.contexts

    def _plan(self, key: str, answer: Answer, example: Example | None) -> _Plan:
        question = answer.question or (example.question if example else "")
        plan = _Plan(key, question=question)
        text = strip_citations(answer.text)
        noncommittal = is_noncommittal(text)
        claims = extract_claims(text, question)
        want = self.metrics
        if claims and "faithfulness" in want:
            plan.faith = SupportJob(claims, self._used_contexts(answer), self.support, question)
        # answer relevancy
        if "answer_relevancy" not in want:
            pass
        elif noncommittal:
            plan.row["answer_relevancy"] = 0.0
        elif not question.strip():
            pass  # nothing to be relevant to: left out
        elif self.question_generator is not None:
            self._counts["question_generator_calls"] += 1
            gen = tuple(q for q in (self.question_generator(text) or ()) if q and q.strip())
            if gen:
                plan.statements = gen
            else:
                plan.row["answer_relevancy"] = 0.0
        elif ((is_yes_no(text) and _POLAR.match(question))
              or (self.relevancy_statement == "question+answer" and is_factoid(text))):
            plan.statements = (f"{question} {text}",)
        else:
            plan.statements = (text,)
        # context precision / recall
        contexts = answer.contexts
        gold = _gold_ids(example)
        if "context_precision" not in want and "context_recall" not in want:
            return plan
        if gold:
            if contexts:
                plan.row["context_precision"] = context_precision_from_relevance(
                    [c.id in gold for c in contexts])
            plan.row["context_recall"] = context_recall_from_ids(answer.context_ids, gold)
            return plan
        ref = extract_claims(example.answers[0], question) if example and example.answers else []
        if ref:
            plan.ctx_job = SupportJob(ref, contexts, self.support)
            plan.ctx_metrics = (("context_precision",) if contexts else ()) + ("context_recall",)
        elif claims and contexts and not (example and example.answers):
            plan.ctx_job = SupportJob(claims, contexts, self.support)  # ragas "without reference"
            plan.ctx_metrics = ("context_precision",)
        return plan

    def _finish(self, plan: _Plan) -> dict[str, float]:
        row = dict(plan.row)
        vec = self.embedder.get
        if plan.faith is not None:
            row["faithfulness"] = float(plan.faith.finish(vec).fraction or 0.0)
        if plan.statements:
            q = vec(plan.question).astype(np.float64)
            cos = [float((vec(s).astype(np.float64) * q).sum()) for s in plan.statements]
            row["answer_relevancy"] = float(min(1.0, max(0.0, sum(cos) / len(cos))))
        if plan.ctx_job is not None:
            res = plan.ctx_job.finish(vec)
            if "context_precision" in plan.ctx_metrics:
                row["context_precision"] = context_precision_from_relevance(res.context_support)
            if "context_recall" in plan.ctx_metrics:
                row["context_recall"] = float(res.fraction or 0.0)
        return {m: row[m] for m in self.metrics if m in row}
