"""Claim support for the offline RAGAS-style metrics in `rag.metrics.quality`.

A *claim* is a short statement taken from an answer (or a reference answer). A claim's support by
a set of contexts is the maximum, over the contexts' sentences, of

    sentence claim:  gate * (w_lex * lexical + (1 - w_lex) * cosine)
    factoid claim:   w_span * answer_in_context + (1 - w_span) * (w_lex * lexical
                                                                   + (1 - w_lex) * cosine)

lexical          share of the claim's content tokens (lower-cased, stop words removed, Snowball
                 stems) found in the sentence or its passage title
cosine           MiniLM cosine of claim and "title: sentence", clipped to [0, 1]
answer_in_context  1 when the normalised answer span occurs verbatim in the passage (title +
                 text), else the share of its content tokens found there
gate             missing_entity_penalty (0.5) ** the number of the claim's entity/number stems
                 found nowhere in the contexts (one invented name or number -> score <= 0.5),
                 times negation_penalty (0.5) on a sentence without a negation cue when the
                 claim has one ("was not", "never", "cannot", ...: a negated fact scores
                 <= 0.5 against the positive sentence it was taken from)

A sentence claim found verbatim (normalised) in a passage scores 1 there. The claim is
*supported* when its score is >= `SupportConfig.threshold` (0.6). Sentences
whose score cannot reach the threshold even at cosine 1 are not embedded (exact pruning: the
supported / not-supported decision is the same as without it; only the reported maximum of an
unsupported claim may be a lower bound).

Optional, off by default: QA-consistency with the generator (`SupportConfig(qa=QAConsistency(
generator))`). For a claim of an answer to a question, the generator answers the question from
the claim's best-supporting sentence alone, and the agreement of that answer with the claim
(`qa_agreement`) is mixed in: score = (1 - weight) * support + weight * agreement, at that
sentence. It targets the limitation above: a wrong entity that occurs in the right passage.

Claims come from `rag.metrics.claims`; the embeddings from `rag.metrics.embedding.Embedder`
(`SupportJob.texts()` lists what to embed, `SupportJob.finish(vector)` scores with them).
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import lru_cache

import numpy as np

from rag.metrics.claims import (
    Claim,
    content_tokens,
    has_negation,
    is_noncommittal,
    split_sentences,
    strip_citations,
)
from rag.metrics.qa import normalize_answer
from rag.types import Context, Generation


class QAConsistency:
    """QA-consistency with the generator, an optional support signal (off by default).

    For a claim made in answer to `question`, let s be its best-supporting context sentence.
    The generator (any `rag.generation.base.Generator`) answers the question from s alone
    (prompt `prompt_id`, greedy, `max_new_tokens`), and `qa_agreement(answer, claim)` in [0, 1]
    enters the claim's score at s: (1 - weight) * support + weight * agreement. With the default
    weight 0.5 and threshold 0.6 a claim the generator contradicts (agreement 0) is never
    supported, and one it confirms needs support >= 0.2.

    Not applicable (score unchanged): no question; a sentence claim when the generator abstains
    (s does not answer the question: the claim is about something else). A factoid claim
    (the answer to the question) whose sentence makes the generator abstain gets agreement 0.
    Claims that cannot reach the threshold even at agreement 1 are not asked about (their
    verdict is "not supported" either way). Answers are cached in memory by (question, title,
    sentence); `calls` counts the generator's answers."""

    def __init__(self, generator, weight: float = 0.5, prompt_id: str = "plain",
                 max_new_tokens: int = 16):
        if not 0.0 < weight <= 1.0:
            raise ValueError(f"QAConsistency weight must lie in (0, 1], got {weight!r}")
        self.generator, self.weight = generator, float(weight)
        self.prompt_id, self.max_new_tokens = prompt_id, int(max_new_tokens)
        self._cache: dict[tuple[str, str, str], str] = {}
        self._lock = threading.Lock()
        self.calls = 0

    def __repr__(self) -> str:  # part of the scorers' cache keys: name the model and settings
        g = self.generator
        name = getattr(g, "fingerprint", "") or getattr(g, "name", "") or type(g).__name__
        return (f"QAConsistency(generator={name!r}, weight={self.weight}, "
                f"prompt_id={self.prompt_id!r}, max_new_tokens={self.max_new_tokens})")

    def answers(self, requests: Sequence[tuple[str, str, str]]) -> list[str]:
        """(question, title, sentence) -> the generator's answer from that sentence alone."""
        with self._lock:
            todo = list(dict.fromkeys(r for r in requests if r not in self._cache))
            if todo:
                gens: list[Generation] = self.generator.generate_batch(
                    [q for q, _, _ in todo], [[Context("qa-sentence", t, x)] for _, t, x in todo],
                    self.prompt_id, max_new_tokens=self.max_new_tokens)
                for r, g in zip(todo, gens, strict=True):
                    self._cache[r] = g.text
                self.calls += len(todo)
            return [self._cache[r] for r in requests]


def qa_agreement(answer: str, claim: Claim) -> float | None:
    """Agreement of the generator's `answer` with `claim`: for a factoid claim, the share of
    its span's content stems found in the answer (an abstention: 0); for a sentence claim, the
    share of the answer's content stems found in the claim (an abstention: None, not
    applicable)."""
    text = strip_citations(answer or "")
    abstain = is_noncommittal(text)
    if claim.span is not None:
        want = set(content_tokens(claim.span)) or {normalize_answer(claim.span)}
        have = set(content_tokens(text)) | {normalize_answer(text)}
        return 0.0 if abstain else sum(_covered(t, frozenset(have)) for t in want) / len(want)
    if abstain:
        return None
    got = set(content_tokens(text))
    if not got:
        return None
    pool = frozenset(content_tokens(claim.text))
    return sum(_covered(t, pool) for t in got) / len(got)


_BASE_FIELDS = ("threshold", "lexical_weight", "span_weight", "missing_entity_penalty",
                "negation_penalty")


@dataclass(frozen=True, repr=False)
class SupportConfig:
    """Weights and threshold of the support score (module docstring). Tuned on HotpotQA dev
    examples outside the test sample (docs/quality.md). `qa`: the optional QA-consistency
    signal (None = off, the default; its repr is left out then, so cache keys of the default
    scorer are what they were before it existed)."""

    threshold: float = 0.6
    lexical_weight: float = 0.5
    span_weight: float = 0.5
    missing_entity_penalty: float = 0.5  # gate = penalty ** (entity/number stems not found)
    negation_penalty: float = 0.5  # claim negated, sentence not
    qa: QAConsistency | None = None

    def __repr__(self) -> str:
        parts = [f"{k}={getattr(self, k)!r}" for k in _BASE_FIELDS]
        if self.qa is not None:
            parts.append(f"qa={self.qa!r}")
        return f"SupportConfig({', '.join(parts)})"


@dataclass(frozen=True)
class _Passage:
    units: tuple[str, ...]            # "title: sentence" (embedded)
    unit_tokens: tuple[frozenset, ...]  # sentence + title content stems
    unit_negated: tuple[bool, ...]      # sentence has a negation cue
    norm: str                         # normalised title + text (for verbatim spans)
    tokens: frozenset                 # all content stems of title + text
    sentences: tuple[str, ...] = ()   # the sentences of the units (without the title)


@lru_cache(maxsize=50_000)
def _passage(title: str, text: str) -> _Passage:
    sents = split_sentences(text) or [text.strip() or title]
    ttoks = frozenset(content_tokens(title))
    units = tuple(f"{title}: {s}" if title else s for s in sents)
    utoks = tuple(frozenset(content_tokens(s)) | ttoks for s in sents)
    return _Passage(units, utoks, tuple(has_negation(s) for s in sents),
                    f" {normalize_answer(f'{title} {text}')} ",
                    frozenset().union(*utoks) if utoks else ttoks, tuple(sents))


def _covered(tok: str, pool: frozenset) -> bool:
    if tok in pool:
        return True
    if len(tok) < 4:
        return False
    return any(len(p) >= 4 and (p.startswith(tok) or tok.startswith(p)) for p in pool)


def _span_coverage(span: str, p: _Passage) -> float:
    norm = normalize_answer(span)
    if norm and f" {norm} " in p.norm:
        return 1.0
    toks = set(content_tokens(span))
    return sum(t in p.tokens for t in toks) / len(toks) if toks else 0.0


@dataclass(frozen=True)
class SupportResult:
    claims: tuple[Claim, ...]
    scores: tuple[float, ...]           # per claim: max over sentences (a lower bound if pruned)
    supported: tuple[bool, ...]
    context_support: tuple[bool, ...]   # per context: supports at least one claim
    qa_agreement: tuple[float | None, ...] = ()  # per claim, when QAConsistency is on

    @property
    def fraction(self) -> float | None:
        return sum(self.supported) / len(self.supported) if self.supported else None


class SupportJob:
    """Claims against contexts. The lexical part is computed at construction; `texts()` lists
    what must be embedded (claims and sentences that could still reach the threshold) and
    `finish(vector)` completes the scores once those embeddings exist."""

    def __init__(self, claims: Sequence[Claim], contexts: Sequence[Context],
                 config: SupportConfig, question: str = ""):
        self.claims = tuple(claims)
        self.config = cfg = config
        self.question = question.strip()  # QA-consistency asks it (when config.qa is set)
        self.n_ctx = len(contexts)
        ps = [_passage(c.title or "", c.text or "") for c in contexts]
        self.units = [u for p in ps for u in p.units]
        self.unit_parts = [(c.title or "", x) for c, p in zip(contexts, ps, strict=True)
                           for x in p.sentences]
        self.unit_ctx = np.array([i for i, p in enumerate(ps) for _ in p.units], dtype=np.int64)
        pool = frozenset().union(*(p.tokens for p in ps)) if ps else frozenset()
        n_c, n_u = len(self.claims), len(self.units)
        self.base = np.zeros((n_c, n_u))   # score at cosine 0
        self.cos_w = np.zeros((n_c, n_u))  # weight of the cosine term
        wl, ws = cfg.lexical_weight, cfg.span_weight
        unit_toks = [t for p in ps for t in p.unit_tokens]
        unit_neg = np.array([g for p in ps for g in p.unit_negated], dtype=bool)
        self.lex = np.zeros((n_c, n_u))
        for i, cl in enumerate(self.claims):
            toks = set(content_tokens(cl.text))
            lex = np.array([len(toks & ut) / len(toks) if toks else 0.0 for ut in unit_toks])
            self.lex[i] = lex
            if cl.span is not None:
                cov = np.array([_span_coverage(cl.span, p) for p in ps])
                span = cov[self.unit_ctx] if n_u else np.zeros(0)
                self.base[i] = ws * span + (1 - ws) * wl * lex
                self.cos_w[i] = (1 - ws) * (1 - wl)
            else:
                missing = sum(not _covered(k, pool) for k in cl.key)
                gate = cfg.missing_entity_penalty ** missing
                if n_u and has_negation(cl.text):  # a negated claim needs a negated sentence
                    gate = gate * np.where(unit_neg, 1.0, cfg.negation_penalty)
                self.base[i] = gate * wl * lex
                self.cos_w[i] = gate * (1 - wl)
                norm = normalize_answer(cl.text)
                verbatim = np.array([bool(norm) and f" {norm} " in p.norm for p in ps])
                if n_u and verbatim.any():  # copied from a context: supported outright
                    hit = verbatim[self.unit_ctx]
                    self.base[i, hit], self.cos_w[i, hit] = 1.0, 0.0
        self.need = (self.base + self.cos_w) >= cfg.threshold - 1e-12

    def texts(self) -> list[str]:
        out = [self.claims[i].text for i in range(len(self.claims)) if self.need[i].any()]
        out += [self.units[j] for j in np.flatnonzero(self.need.any(axis=0))]
        return out

    def finish(self, vector: Callable[[str], np.ndarray]) -> SupportResult:
        thr = self.config.threshold
        scores = self.base.copy()
        for i in range(len(self.claims)):
            cols = np.flatnonzero(self.need[i])
            if cols.size:
                c = vector(self.claims[i].text)
                U = np.stack([vector(self.units[j]) for j in cols])
                cos = np.clip((U.astype(np.float64) * c).sum(axis=1), 0.0, 1.0)
                scores[i, cols] = self.base[i, cols] + self.cos_w[i, cols] * cos
        best = scores.max(axis=1) if scores.shape[1] else np.zeros(len(self.claims))
        ok = scores >= thr
        agree: tuple[float | None, ...] = ()
        qa = self.config.qa
        if qa is not None and self.question and scores.shape[1]:
            agree = self._qa(qa, scores, best, ok)
        ctx = [bool(ok[:, self.unit_ctx == k].any()) for k in range(self.n_ctx)]
        return SupportResult(self.claims, tuple(float(x) for x in best),
                             tuple(bool(x >= thr - 1e-12) if agree else bool(x >= thr)
                                   for x in best), tuple(ctx), agree)

    def _qa(self, qa: QAConsistency, scores: np.ndarray, best: np.ndarray,
            ok: np.ndarray) -> tuple[float | None, ...]:
        """Mix QA-consistency into `best` and `ok` in place (QAConsistency docstring)."""
        thr, w = self.config.threshold, qa.weight
        # the best-supporting sentence; ties (a claim copied verbatim scores 1 at every sentence
        # of its passage) go to the highest lexical overlap, then the first sentence
        arg = [int(np.flatnonzero(row >= row.max() - 1e-12)[np.argmax(
            self.lex[i, row >= row.max() - 1e-12])]) for i, row in enumerate(scores)]
        ask = [i for i in range(len(self.claims))
               if (1 - w) * best[i] + w >= thr - 1e-12]  # else unsupported whatever it says
        texts = qa.answers([(self.question, *self.unit_parts[arg[i]]) for i in ask])
        agree: list[float | None] = [None] * len(self.claims)
        for i, text in zip(ask, texts, strict=True):
            a = qa_agreement(text, self.claims[i])
            agree[i] = a
            if a is None:
                continue
            best[i] = (1 - w) * best[i] + w * a
            ok[i, :] = False
            ok[i, arg[i]] = best[i] >= thr - 1e-12
        return tuple(agree)
