"""Reference-free answer signals that separate right answers from wrong ones: whether the answer
addresses the question (relevancy), whether its content is said by a context sentence that is
itself about the question (faithfulness), and a calibrated combination of both.

`AnswerSignals().score_batch(answers)` returns one row per `rag.types.Answer`, each value in
[0, 1] (names are what the tuner and the benchmark call them):

  sig_relevancy     the answer's type fits the question's (rag.generation.answer_check: no date
                    for a what-question, no text for a how-many; answers of at most 8 words,
                    the option of an either-or question always fits), it is not a passage title or
                    metadata span, not the question echoed back, times the mean of
                    cos(question, answer) and cos(question, its evidence sentence), clipped at
                    0 (MiniLM unit vectors)
  sig_faithfulness  per answer sentence, the share of its content words found in one context
                    sentence's text (titles do not count), times that sentence's relevance to the
                    question (cos(question, sentence) / the best cos over all sentences);
                    averaged over the answer's sentences
  features only     verbatim (the answer's words are a run of a context text's words), title
                    (the answer is exactly a context's title), off_option (an either-or
                    question answered with neither option)
  sig_combined      0 when the answer fails a rule (`passes_rules`: wrong type, a title or
                    metadata span, the question echoed), else P(answer is right) from a
                    logistic regression over FEATURES, trained on the train splits' gold labels
                    of HotpotQA and MTRAG (bench/quality_signals.py) and shipped as
                    `rag/bundled/answer_signals/combined.json`
An abstention scores 0 on all three (it answers nothing). `GATE` is the combined score below
which an answer counts as not answering the question. Contexts are the cited ones (all when
the answer cites none). `features(...)` exposes the per-answer feature vector for training.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from rag.generation.answer_check import (
    answer_type,
    expected_type,
    fits,
    metadata_span,
    type_checked,
)
from rag.metrics.claims import split_sentences, strip_citations
from rag.metrics.embedding import Embedder
from rag.types import Answer, Context

__all__ = ["AnswerSignals", "FEATURES", "SIGNALS", "GATE", "Combiner", "load_combiner",
           "passes_rules"]

SIGNALS = ("sig_relevancy", "sig_faithfulness", "sig_combined")
GATE = 0.5
FEATURES = ("type_fit", "metadata", "echo", "qa_cos", "ev_cos", "best_cos", "ev_gap", "cover",
            "ev_q_overlap", "partial", "log_words", "is_yesno", "verbatim", "title", "off_option",
            "relevancy", "faithfulness")
MAX_SENTENCES = 16
"""Sentences read per context (the first ones): bounds the encoder work per answer."""

_WORD = re.compile(r"[^\W_]+(?:[-'][^\W_]+)*", re.UNICODE)
_STOP = frozenset(re.findall(r"\S+",
    "a an the of in on at to for from by with and or is are was were be been being do does "
    "did what which who whom whose when where why how that this these those it its as into "
    "than then there their they he she his her i you we my your our me us can could would "
    "should will has have had not no yes so if about also"))


def _words(text: str) -> list[str]:
    return [w.lower() for w in _WORD.findall(text)]


def _content(text: str) -> list[str]:
    return [w for w in _words(text) if w not in _STOP]


def passes_rules(f: np.ndarray) -> bool:
    """The hard part of relevancy: the answer's type fits the question's, it is not a title or
    metadata span, and at most 3/4 of its content words restate the question."""
    return bool(f[FEATURES.index("type_fit")] == 1.0 and f[FEATURES.index("metadata")] == 0.0
                and f[FEATURES.index("echo")] < 0.75)


class Combiner:
    """A logistic regression over FEATURES: standardise with `mean`/`scale`, then
    sigmoid(coef · x + intercept). Loaded from / saved to JSON."""

    def __init__(self, coef, intercept: float, mean, scale, features=FEATURES, meta=None):
        self.coef = np.asarray(coef, dtype=np.float64)
        self.intercept = float(intercept)
        self.mean = np.asarray(mean, dtype=np.float64)
        self.scale = np.asarray(scale, dtype=np.float64)
        self.features = tuple(features)
        self.meta = dict(meta or {})
        if self.features != FEATURES:
            raise ValueError(f"combiner features {self.features} differ from FEATURES {FEATURES}")
        if not (len(self.coef) == len(self.mean) == len(self.scale) == len(FEATURES)):
            raise ValueError("combiner: coef, mean and scale need one value per feature")

    def predict(self, x: np.ndarray) -> np.ndarray:
        z = (np.atleast_2d(x) - self.mean) / self.scale @ self.coef + self.intercept
        return 1.0 / (1.0 + np.exp(-z))

    def to_json(self, path: str | Path) -> None:
        Path(path).write_text(json.dumps({
            "features": list(self.features), "coef": self.coef.round(6).tolist(),
            "intercept": round(self.intercept, 6), "mean": self.mean.round(6).tolist(),
            "scale": self.scale.round(6).tolist(), "meta": self.meta}, indent=1) + "\n")

    @classmethod
    def from_json(cls, path: str | Path) -> Combiner:
        d = json.loads(Path(path).read_text())
        return cls(d["coef"], d["intercept"], d["mean"], d["scale"], d["features"],
                   d.get("meta"))


def load_combiner(path: str | Path | None = None) -> Combiner | None:
    """The shipped combiner (or the one at `path`); None when the bundled file is absent."""
    if path is None:
        from rag.resources import bundled

        path = bundled("answer_signals/combined.json")
        if not Path(path).is_file():
            return None
    return Combiner.from_json(path)


class AnswerSignals:
    """Scores answers with SIGNALS (module docstring). `encoder`: a loaded
    `rag.encoders.Encoder` (default: the registry's `encoder_name`, loaded on first use).
    `combiner`: a `Combiner` (default: the bundled one; without it `sig_combined` is the mean
    of relevancy and faithfulness)."""

    def __init__(self, encoder=None, *, encoder_name: str = "minilm",
                 combiner: Combiner | None | str = "bundled", chunk: int = 16):
        self.embedder = Embedder(encoder, encoder_name=encoder_name, chunk=chunk)
        self.combiner = load_combiner() if combiner == "bundled" else combiner

    # ---- public API ----------------------------------------------------------------------
    def score(self, answer: Answer) -> dict[str, float]:
        return self.score_batch([answer])[0]

    def score_batch(self, answers: Sequence[Answer]) -> list[dict[str, float]]:
        feats = self.features(answers)
        out = []
        for f in feats:
            if f is None:
                out.append(dict.fromkeys(SIGNALS, 0.0))
                continue
            rel, faith = f[FEATURES.index("relevancy")], f[FEATURES.index("faithfulness")]
            if not passes_rules(f):
                comb = 0.0
            elif self.combiner is not None:
                comb = float(self.combiner.predict(f)[0])
            else:
                comb = 0.5 * (rel + faith)
            out.append({"sig_relevancy": float(rel), "sig_faithfulness": float(faith),
                        "sig_combined": comb})
        return out

    def features(self, answers: Sequence[Answer]) -> list[np.ndarray | None]:
        """FEATURES per answer (None for an abstention or an empty answer)."""
        plans = [self._plan(a) for a in answers]
        texts = []
        for p in plans:
            if p is not None:
                texts += [p["question"], p["answer"], *p["sentences"]]
        self.embedder.ensure({"signals": texts})
        return [None if p is None else self._finish(p) for p in plans]

    # ---- internals -----------------------------------------------------------------------
    @staticmethod
    def _contexts(answer: Answer) -> tuple[Context, ...]:
        n = len(answer.contexts)
        cited = sorted({i for i in answer.citations if 1 <= i <= n})
        return tuple(answer.contexts[i - 1] for i in cited) if cited else answer.contexts

    def _plan(self, answer: Answer) -> dict | None:
        text = strip_citations(answer.text).strip()
        kind = answer_type(text) if text else "abstain"
        if kind == "abstain":
            return None
        ctx = self._contexts(answer)
        sentences = []
        for c in ctx:
            sentences += [s for s in split_sentences(c.text) if s.strip()][:MAX_SENTENCES]
        return {"question": answer.question, "answer": text, "kind": kind,
                "expected": expected_type(answer.question), "sentences": sentences,
                "titles": [c.title for c in ctx], "texts": [c.text for c in ctx]}

    def _finish(self, p: dict) -> np.ndarray:
        vec = self.embedder.get
        q = vec(p["question"]).astype(np.float64)
        qa_cos = float(vec(p["answer"]) @ q)
        sents = p["sentences"]
        s_cos = np.array([float(vec(s) @ q) for s in sents]) if sents else np.zeros(0)
        best_cos = float(s_cos.max()) if len(s_cos) else 0.0
        qwords = set(_content(p["question"]))
        aw = _content(p["answer"])
        choice = p["expected"] == "choice"  # the answer is one of the question's options
        is_yesno = p["kind"] == "yesno"  # a judgement restates nothing
        echo = 0.0 if is_yesno else self._echo(p["question"], aw, qwords, choice)
        type_fit = (1.0 if choice or not type_checked(p["answer"])
                    else float(fits(p["expected"], p["kind"])))
        meta = float(metadata_span(p["answer"], p["titles"], p["texts"])
                     and p["expected"] != "date")
        sent_words = [set(_words(s)) for s in sents]
        # evidence: for each answer sentence, the context sentence holding most of its
        # content words (ties: the one closest to the question)
        claims = split_sentences(p["answer"]) or [p["answer"]]
        covers, rels, ev = [], [], []
        for claim in claims:
            cw = [w for w in _content(claim) if w not in qwords] or _content(claim)
            if is_yesno or not cw or not sents:
                continue
            cov = np.array([sum(w in sw for w in cw) / len(cw) for sw in sent_words])
            top = np.flatnonzero(cov >= cov.max() - 1e-9)
            j = int(top[np.argmax(s_cos[top])])
            covers.append(float(cov[j]))
            rels.append(max(0.0, float(s_cos[j])) / best_cos if best_cos > 0 else 0.0)
            ev.append(j)
        if is_yesno and len(s_cos):  # a judgement: its evidence is the most relevant sentence
            j = int(np.argmax(s_cos))
            ev, covers, rels = [j], [1.0], [1.0]
        ev_cos = float(np.mean([s_cos[j] for j in ev])) if ev else 0.0
        cover = float(np.mean(covers)) if covers else 0.0
        faith = float(np.mean([c * min(1.0, r) for c, r in zip(covers, rels, strict=True)])
                      ) if covers else 0.0
        ev_q = (float(np.mean([len(qwords & sent_words[j]) / max(len(qwords), 1) for j in ev]))
                if ev else 0.0)
        partial = float(self._partial(p["answer"], [sents[j] for j in ev]))
        rel = (type_fit * (1.0 - meta) * (1.0 - echo if echo >= 0.75 else 1.0)
               * max(0.0, 0.5 * qa_cos + 0.5 * ev_cos))
        n_words = len(_words(p["answer"]))
        norm = " ".join(_words(p["answer"]))
        verbatim = float(bool(norm) and any(norm in " ".join(_words(t)) for t in p["texts"]))
        title = float(bool(norm) and any(norm == " ".join(_words(t)) for t in p["titles"]))
        off_option = float(choice and not self._names_option(p["question"], aw))
        return np.array([type_fit, meta, echo, qa_cos, ev_cos, best_cos, ev_cos - best_cos,
                         cover, ev_q, partial, math.log1p(n_words), float(is_yesno), verbatim,
                         title, off_option, min(1.0, rel), faith], dtype=np.float64)

    @staticmethod
    def _echo(question: str, aw: list[str], qwords: set[str], choice: bool) -> float:
        """Share of the answer's content words that restate the question. For an either-or
        question the options' own words do not count, unless the answer names both options."""
        if not aw:
            return 1.0
        if not choice:
            return sum(w in qwords for w in aw) / len(aw)
        from rag.generation.extractive import _options

        opts = [set(_content(o)) for o in _options(question)]
        if len(opts) == 2 and all((o - other) & set(aw)
                                  for o, other in zip(opts, opts[::-1], strict=True)):
            return 1.0
        rest = qwords - set().union(*opts) if opts else qwords
        return sum(w in rest for w in aw) / len(aw)

    @staticmethod
    def _names_option(question: str, aw: list[str]) -> bool:
        """The answer (content words `aw`) names an option of an either-or question by a word
        only that option has (True when the options cannot be read)."""
        from rag.generation.extractive import _options

        opts = [set(_content(o)) for o in _options(question)]
        if len(opts) != 2:
            return True
        return any((o - other) & set(aw) for o, other in zip(opts, opts[::-1], strict=True))

    @staticmethod
    def _partial(answer: str, evidence: Sequence[str]) -> bool:
        """The answer cuts a name or phrase short: in its evidence sentence it is directly
        followed or preceded by another capitalised word, or it ends on a function word."""
        words = answer.split()
        if not words:
            return False
        if words[-1].lower().strip(".,") in _STOP:
            return True
        for s in evidence:
            i = s.find(answer)
            if i < 0:
                continue
            after = s[i + len(answer):].split()[:1]
            before = s[:i].split()[-1:]
            if after and after[0][:1].isupper() and after[0].lower() not in _STOP:
                return True
            if (before and before[0][:1].isupper() and before[0].lower() not in _STOP
                    and i > 0 and not s[:i].rstrip().endswith((".", ":", ","))):
                return True
        return False
