"""The observation of a per-query config policy: one fixed float32 vector per question, from
signals available before the question is answered (no gold, no dataset labels).

`QueryFeaturizer(indexes, config).features(example)` -> `np.ndarray` of shape
(len(FEATURE_NAMES),), dtype float32, in the order of `FEATURE_NAMES`. It reads only
`example.question` and `example.history` (the earlier turns); answers, qrels, gold passages,
supporting facts, `category` and `metadata` are never touched, so a policy cannot learn from
what it would not see when serving (`tests/unit/test_policy_features.py` checks it).

Retrieval signals come from the retrievers the pipeline itself calls, with the same arguments,
on the retrieval query `config` forms from the question and its history
(`rag.query_formulation`): over a `rl.common.memo.MemoIndexSet` they are memoised lookups (the
tuner's rows computed them already), over a real `IndexSet` (serving) three retrievals.

Features (units in brackets; "top-n" lists are best first, missing entries count as 0):

  retrieval (on the retrieval query)
    bm25_s1..bm25_s5      BM25 scores of the top 5 [raw BM25]
    bm25_gap12, bm25_gap15  s1 − s2, s1 − s5 [raw BM25]
    bm25_ratio12          s2 / s1 [0, 1] (0 when s1 <= 0)
    dense_s1..dense_s5    cosine of the top 5 dense hits [-1, 1]
    dense_gap12, dense_gap15
    overlap10             |bm25 top-10 ∩ dense top-10| / 10 [0, 1]
    top1_agree            1 when BM25 and dense rank the same passage first
    rank_agreement        rank-biased overlap (p = 0.9) of the two top-10 lists [0, 1]
    graph_s1, graph_gap12 entity-graph (personalised PageRank) top scores [PPR mass]
    graph_overlap10       |graph top-10 ∩ (bm25 ∪ dense top-10)| / 10 [0, 1]
  question
    log_chars, n_words, n_content_words
    is_yesno              starts with an auxiliary verb (is, does, can, ...)
    has_or                an "X or Y" choice
    has_comparison        comparison cues (more, older, first, both, same, -er than, ...)
    wh_what .. wh_none    one-hot question word (what, which, who, where, when, how, why, none)
    n_entities            capitalised spans not at the sentence start
    n_numbers             digit groups
  conversation (all 0 for a single-turn question)
    turn_index            user turns before this one
    has_pronoun           a pronoun that needs the history (it, they, that, ...)
    is_elliptical         <= 4 words, or opens with "and" / "what about" / "how about"
    prev_user_overlap     Jaccard of content words with the previous user turn [0, 1]
    prev_agent_overlap    the same with the previous agent turn [0, 1]
  formulation views (only with `formulations`, e.g. `conversation_views(examples)`)
    <retrieval name>@<f>  the retrieval features again on the query formulation <f>
                          (`rag.query_formulation`) instead of the config's own
    d_<retrieval name>@<f>  the config's value minus the one on <f>

`QueryFeaturizer(indexes, config, formulations=("last_two_user", "all_user"))` appends the
formulation views (`feature_names(formulations)`; 42 -> 126 columns): how the same retrievers
fare on each other way of forming the turn's query, so a router can choose a formulation per
turn (with the formulation arms of `rl.routing.portfolio.with_formulations`). A saved
policy records its `feature_names`; `QueryFeaturizer.for_names` rebuilds the featurizer from
them at serving time.
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence

import numpy as np

from rag.config import RAGConfig
from rag.pipeline import MAX_QUESTION_CHARS, check_question
from rag.query_formulation import formulate_query, user_turns
from rag.types import Example, Hit
from rl.kernel.space import is_conversational
from rl.selection.features import content, words

TOP = 5
LIST = 10
RBO_P = 0.9
WH = ("what", "which", "who", "where", "when", "how", "why")


def _wordset(text: str) -> frozenset[str]:
    return frozenset(text.split())


_AUX = _wordset("is are was were do does did can could has have had will would should shall "
                "may might must am")
_COMPARE = _wordset("more less most least older younger earlier later first last both same "
                    "different difference larger smaller bigger higher lower longer shorter "
                    "than compared versus vs")
_PRONOUNS = _wordset("it its they them their theirs he him his she her this that these those "
                     "there one ones")
_ELLIPSIS_OPENERS = ("and ", "what about", "how about", "also ", "or ")
_ENTITY = re.compile(r"(?<![.?!]\s)(?<!^)\b[A-Z][\w'-]*(?:\s+(?:(?:of|the|de|von|van)\s+)*[A-Z][\w'-]*)*")
_NUMBER = re.compile(r"\d+(?:[.,]\d+)*")

RETRIEVAL_NAMES = (*(f"bm25_s{i}" for i in range(1, TOP + 1)), "bm25_gap12", "bm25_gap15",
                   "bm25_ratio12", *(f"dense_s{i}" for i in range(1, TOP + 1)), "dense_gap12",
                   "dense_gap15", "overlap10", "top1_agree", "rank_agreement", "graph_s1",
                   "graph_gap12", "graph_overlap10")
QUESTION_NAMES = ("log_chars", "n_words", "n_content_words", "is_yesno", "has_or",
                  "has_comparison", *(f"wh_{w}" for w in WH), "wh_none", "n_entities",
                  "n_numbers")
CONVERSATION_NAMES = ("turn_index", "has_pronoun", "is_elliptical", "prev_user_overlap",
                      "prev_agent_overlap")
FEATURE_NAMES: tuple[str, ...] = RETRIEVAL_NAMES + QUESTION_NAMES + CONVERSATION_NAMES
"""The observation's columns, in order (see the module docstring)."""
FEATURE_DTYPE = np.float32
N_FEATURES = len(FEATURE_NAMES)
CONVERSATION_VIEWS: tuple[str, ...] = ("last_two_user", "all_user")
"""The formulation views a conversational dataset's policies observe (`conversation_views`)."""


def conversation_views(examples: Sequence[Example]) -> tuple[str, ...]:
    """`CONVERSATION_VIEWS` when any example carries earlier turns, else () (on single-turn
    questions every formulation is the question alone: the views would be copies)."""
    return CONVERSATION_VIEWS if is_conversational(examples) else ()


def feature_names(formulations: Sequence[str] = ()) -> tuple[str, ...]:
    """The columns of a featurizer with these formulation views: `FEATURE_NAMES`, then per
    formulation the retrieval names suffixed `@<f>`, then their differences `d_<name>@<f>`."""
    views = tuple(f"{n}@{f}" for f in formulations for n in RETRIEVAL_NAMES)
    return FEATURE_NAMES + views + tuple(f"d_{v}" for v in views)


def formulations_of(names: Sequence[str]) -> tuple[str, ...]:
    """The formulation views of a feature-name list (`feature_names`' inverse); ValueError
    when `names` is no `feature_names(...)` output (a policy from another featurizer)."""
    names = tuple(names)
    forms = tuple(dict.fromkeys(n.split("@", 1)[1] for n in names[N_FEATURES:]
                                if "@" in n and not n.startswith("d_")))
    if names != feature_names(forms):
        raise ValueError(f"{len(names)} feature names are not this featurizer's columns "
                         f"(expected {FEATURE_NAMES[0]}..{FEATURE_NAMES[-1]} followed by "
                         "formulation views)")
    return forms


def _scores(hits: Sequence[Hit], n: int = TOP) -> np.ndarray:
    s = np.zeros(n)
    top = [float(h.score) for h in hits[:n]]
    s[:len(top)] = top
    return s


def rank_biased_overlap(a: Sequence[str], b: Sequence[str], p: float = RBO_P) -> float:
    """Rank-biased overlap of two best-first id lists, truncated at their shorter length and
    normalised so that identical lists score 1 ([0, 1]; 0 when either is empty)."""
    depth = min(len(a), len(b))
    if depth == 0:
        return 0.0
    num = sum(p ** (d - 1) * len(set(a[:d]) & set(b[:d])) / d for d in range(1, depth + 1))
    return float(num / sum(p ** (d - 1) for d in range(1, depth + 1)))


def retrieval_features(bm25: Sequence[Hit], dense: Sequence[Hit], graph: Sequence[Hit]
                       ) -> list[float]:
    """`RETRIEVAL_NAMES` from the three best-first hit lists (at least top-10 each)."""
    b, d, g = _scores(bm25), _scores(dense), _scores(graph, 2)
    bi, di, gi = ([h.id for h in x[:LIST]] for x in (bm25, dense, graph))
    union = set(bi) | set(di)
    return [*b, b[0] - b[1], b[0] - b[-1], b[1] / b[0] if b[0] > 0 else 0.0,
            *d, d[0] - d[1], d[0] - d[-1],
            len(set(bi) & set(di)) / LIST,
            float(bool(bi) and bool(di) and bi[0] == di[0]),
            rank_biased_overlap(bi, di),
            g[0], g[0] - g[1], len(set(gi) & union) / LIST]


def question_features(question: str) -> list[float]:
    """`QUESTION_NAMES` of the question text alone."""
    q = question.strip()
    toks = [w.lower() for w in re.findall(r"[^\W_]+", q)]
    first = toks[0] if toks else ""
    wh = next((w for w in toks[:3] if w in WH), None) or next(
        (w for w in toks if w in WH), None)
    compare = any(t in _COMPARE for t in toks) or bool(re.search(r"\b\w+er than\b", q.lower()))
    return [math.log1p(len(q)), float(len(toks)), float(len(content(q))),
            float(first in _AUX), float(bool(re.search(r"\w\s+or\s+\w", q))),
            float(compare), *(float(wh == w) for w in WH), float(wh is None),
            float(len(_ENTITY.findall(q))), float(len(_NUMBER.findall(q)))]


def conversation_features(question: str, history: Sequence[dict[str, str]] | None
                          ) -> list[float]:
    """`CONVERSATION_NAMES` of the question after `history` (zeros without one)."""
    if not history:
        return [0.0] * len(CONVERSATION_NAMES)
    users = user_turns(history)
    agents = [str(t.get("text") or "") for t in history
              if str(t.get("role", "user")).lower() != "user"]
    q = question.strip().lower()
    toks = words(q)
    qc = content(q)

    def jaccard(other: str) -> float:
        oc = content(other)
        return len(qc & oc) / len(qc | oc) if qc | oc else 0.0

    n_words = len(re.findall(r"[^\W_]+", q))
    return [float(len(users)), float(bool(toks & _PRONOUNS)),
            float(n_words <= 4 or q.startswith(_ELLIPSIS_OPENERS)),
            jaccard(users[-1]) if users else 0.0, jaccard(agents[-1]) if agents else 0.0]


class QueryFeaturizer:
    """Features of questions over `indexes` (a `rag.index.provider.IndexProvider`: a
    `MemoIndexSet` offline, an `IndexSet` when serving) with the retrievers and retrieval
    query of `config` (the policy's base config), plus the retrieval features on each of
    `formulations` (module docstring). Results are cached per (question, history)."""

    def __init__(self, indexes, config: RAGConfig, formulations: Sequence[str] = ()):
        self.indexes = indexes
        self.config = config
        for f in formulations:  # the pipeline's own check: an unknown name is a ValueError
            formulate_query("q", (), f)
        self.formulations = tuple(formulations)
        self.names = feature_names(self.formulations)
        self._cache: dict[tuple[str, str], np.ndarray] = {}

    @classmethod
    def for_names(cls, indexes, config: RAGConfig, names: Sequence[str]) -> QueryFeaturizer:
        """The featurizer whose columns are `names` (a saved policy's `feature_names`; empty:
        the base columns, as policies saved before the formulation views)."""
        return cls(indexes, config, formulations_of(names) if names else ())

    def retrieval_query(self, question: str, history, formulation: str | None = None) -> str:
        """What the pipeline of `config` (with `formulation` instead of its own, when given)
        retrieves with (`Pipeline.retrieval_query`'s rule), so the memo keys are the ones the
        tuner's rows stored."""
        return formulate_query(check_question(question), history,
                               formulation or self.config.query_formulation,
                               max_chars=MAX_QUESTION_CHARS)

    def _retrieval(self, q: str) -> list[float]:
        """`RETRIEVAL_NAMES` of the retrieval query `q`."""
        c = self.config
        n = max(LIST, c.n_candidates)  # the pipeline's own call: a memo hit offline
        bm25 = self.indexes.bm25(c.bm25_backend).search(q, n)
        dense = self.indexes.dense(c.dense_index).search(q, n)
        graph = self.indexes.graph(c.bm25_backend, c.dense_index).search(
            q, n, damping=c.graph_damping, n_seeds=c.graph_seeds)
        return retrieval_features(bm25, dense, graph)

    def features(self, example: Example) -> np.ndarray:
        """The observation of `example` (`self.names`, float32); reads only its question
        and history."""
        hist = tuple(example.history or ())
        key = (example.question, repr(hist))
        got = self._cache.get(key)
        if got is None:
            queries = [self.retrieval_query(example.question, hist, f)
                       for f in (None, *self.formulations)]
            # formulations that give the same query (a first turn: all of them) retrieve once
            by_query = {q: self._retrieval(q) for q in dict.fromkeys(queries)}
            base, *views = (by_query[q] for q in queries)
            got = np.asarray(base + question_features(example.question)
                             + conversation_features(example.question, hist)
                             + [x for v in views for x in v]
                             + [b - x for v in views for b, x in zip(base, v, strict=True)],
                             dtype=FEATURE_DTYPE)
            self._cache[key] = got
        return got.copy()

    def matrix(self, examples: Sequence[Example]) -> np.ndarray:
        """(len(examples), len(self.names)) float32, one row per example."""
        if not examples:
            return np.zeros((0, len(self.names)), dtype=FEATURE_DTYPE)
        return np.stack([self.features(e) for e in examples])
