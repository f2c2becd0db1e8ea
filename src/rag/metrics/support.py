"""Claims and claim support for the offline RAGAS-style metrics in `rag.metrics.quality`.

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

Embeddings are batch-invariant: texts are grouped by exact token length, so no text is ever
padded, and every encoder call has the same shape (`chunk` = 2 texts of one length; a lone text
is paired with itself). Row results of a fixed-shape call do not depend on the other rows, so a
text gets bit-identical vectors whatever else is in the batch (checked in tests/test_quality.py;
on CPU torch, batches of different sizes differ in the last bits for short texts, and larger
fixed chunks were no faster on 1-2 threads).
"""

from __future__ import annotations

import hashlib
import re
import threading
import time
from collections import OrderedDict, defaultdict
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from functools import lru_cache

import numpy as np

from rag.metrics.qa import normalize_answer
from rag.types import Context, Generation

_STOP_TEXT = """
a about above after again against all am an and any are aren't as at be because been before being
below between both but by can cannot could couldn't did didn't do does doesn't doing don't down
during each few for from further had hadn't has hasn't have haven't having he he'd he'll he's her
here here's hers herself him himself his how how's i i'd i'll i'm i've if in into is isn't it it's
its itself let's me more most mustn't my myself no nor not of off on once only or other ought our
ours ourselves out over own same shan't she she'd she'll she's should shouldn't so some such than
that that's the their theirs them themselves then there there's these they they'd they'll they're
they've this those through to too under until up very was wasn't we we'd we'll we're we've were
weren't what what's when when's where where's which while who who's whom why why's with won't
would wouldn't you you'd you'll you're you've your yours yourself yourselves also s t d ll m re ve
whose does did yes don doesn didn isn wasn aren weren hasn haven hadn couldn wouldn shouldn
"""
STOPWORDS = frozenset(_STOP_TEXT.split())

_WORD = re.compile(r"[^\W_]+", re.UNICODE)
_CITE = re.compile(r"\s*\[\d+(?:\s*[,;\-]\s*\d+)*\]")


def _words(text: str) -> frozenset[str]:
    return frozenset(text.split())


_AUX = _words("is are was were be been being am has have had do does did will would shall "
              "should can could may might must")
_PRONOUNS = _words("he she it they we i you there this these those")
_VERBS = _words("became become won wrote made took went began led ran grew gave held sold "
                "left met saw built moved lives live lived plays works worked")
_ABBREV = _words("mr mrs ms dr prof st jr sr vs etc inc ltd co corp no fig jan feb mar apr "
                 "jun jul aug sep sept oct nov dec mt ft gen col lt sgt rev hon gov sen rep "
                 "e.g i.e u.s u.k approx")
_SENT_END = re.compile(r"([.!?])([\"')\]]*)\s+(?=[\"'(\[]?[A-Z0-9])")
_COMMA_CONJ = re.compile(r",\s+(?:and|but|while|whereas|yet|although|though)\s+", re.I)
_BUT = re.compile(r"\s+(?:but|whereas)\s+", re.I)
_AND = re.compile(r"\s+and\s+", re.I)
_NONCOMMITTAL = re.compile(
    r"\b(?:i (?:do not|dont|don t|cannot|can not) (?:know|say|tell|answer)|"
    r"(?:not|no) (?:enough|sufficient) (?:information|context|evidence)|"
    r"insufficient (?:information|context|evidence)|"
    r"(?:cannot|can not|unable to) (?:be )?(?:determine|determined|answer|answered|find)|"
    r"(?:passages?|contexts?|documents?|text) (?:do|does) not (?:contain|say|mention|provide|"
    r"specify|state|include))\b")
_NONCOMMITTAL_EXACT = frozenset({"unknown", "unanswerable", "no answer", "noanswer", "n a",
                                 "none", "not known"})


# ---- tokens --------------------------------------------------------------------------------
@lru_cache(maxsize=1)
def _stemmer():
    try:
        import Stemmer  # PyStemmer (a project dependency); Snowball English

        return Stemmer.Stemmer("english")
    except ImportError:  # pragma: no cover - fallback when PyStemmer is missing
        return None


@lru_cache(maxsize=200_000)
def stem(word: str) -> str:
    """Snowball English stem of a lower-case word (a crude suffix stripper without PyStemmer)."""
    s = _stemmer()
    if s is not None:
        return s.stemWord(word)
    for suf in ("ing", "edly", "ed", "ies", "es", "s", "ly"):  # pragma: no cover
        if word.endswith(suf) and len(word) - len(suf) >= 3:
            return word[: -len(suf)]
    return word  # pragma: no cover


def content_tokens(text: str) -> list[str]:
    """Lower-cased word tokens without stop words, stemmed, in order (duplicates kept)."""
    return [stem(w) for w in (m.lower() for m in _WORD.findall(text)) if w not in STOPWORDS]


_OPENERS = _words("additionally also although another as because but by currently during each "
                  "even finally first firstly for from furthermore generally here however if "
                  "in instead it many moreover most no note on once one other overall please "
                  "second since so some still such that the then there therefore these this "
                  "though thus to today typically unfortunately unlike usually when while with "
                  "yes yet you according based both either for many several")
_NEGATION = re.compile(r"\b(?:not|never|cannot|neither|nor|no longer|no|none|nobody|nothing)\b"
                       r"(?![.\s]*\d)|n't\b", re.I)


def has_negation(text: str) -> bool:
    """A negation cue: not, n't, never, cannot, neither/nor, no (not "No. 5"), none, ..."""
    return bool(_NEGATION.search(text))


def key_tokens(text: str) -> frozenset[str]:
    """Stems of the words that name things: tokens with a digit, and capitalised words that are
    not stop words. The first word counts too unless it is a common sentence opener
    ("However", "Yes", "The", an -ly adverb): an invented subject ("Minsk is a cocktail") is
    the commonest swapped entity."""
    out = set()
    for i, w in enumerate(_WORD.findall(text)):
        low = w.lower()
        digit = any(ch.isdigit() for ch in w)
        name = w[0].isupper() and low not in STOPWORDS and (
            i > 0 or (low not in _OPENERS and not low.endswith("ly") and len(low) > 2))
        if digit or name:
            out.add(stem(low))
    return frozenset(out)


def strip_citations(text: str) -> str:
    return " ".join(_CITE.sub("", text).split())


# ---- sentences and claims ------------------------------------------------------------------
def split_sentences(text: str) -> list[str]:
    """Sentences at . ! ? followed by a capital or digit, not after abbreviations or initials."""
    text = " ".join(text.split())
    out, start = [], 0
    for m in _SENT_END.finditer(text):
        before = text[start:m.start(1)].rsplit(" ", 1)[-1]
        word = before.lower().strip("\"'([")
        if m.group(1) == "." and (word in _ABBREV or re.fullmatch(r"[A-Za-z]", word)
                                  or re.fullmatch(r"(?:[a-z]\.)+[a-z]", word)):
            continue
        out.append(text[start:m.end(2)].strip())
        start = m.end()
    out.append(text[start:].strip())
    return [s for s in out if s]


def _verbish(word: str) -> bool:
    w = word.lower().strip(",.;:\"'()")
    return w in _AUX or w in _VERBS or (len(w) > 4 and w.endswith("ed"))


def _subject(clause: str) -> str:
    """The words before the clause's first verb-like word (at most 6 words), else ''."""
    words = clause.split()
    for j, w in enumerate(words[:7]):
        if _verbish(w):
            return " ".join(words[:j]) if j else ""
    return ""


def _has_object(clause: str) -> bool:
    """Words follow the clause's first verb ("designed" in "X designed and built Y" has none,
    so the verbs share an object and are not split)."""
    words = clause.split()
    return any(_verbish(w) and j < len(words) - 1 for j, w in enumerate(words[:7]))


def _split_and(clause: str, subject: str) -> list[str]:
    """Split "A and B" when B is a clause: it starts with a pronoun subject (3+ words) or with a
    verb (2+ words) after a complete A (then A's subject is prepended)."""
    for m in _AND.finditer(clause):
        left, right = clause[:m.start()].strip(), clause[m.end():].strip()
        rw = right.split()
        if len(left.split()) < 3 or not rw:
            continue
        first = rw[0].lower()
        if first in _PRONOUNS and len(rw) >= 3:
            return [left, *_split_and(right, _subject(right) or subject)]
        if _verbish(rw[0]) and len(rw) >= 2 and subject and _has_object(left):
            return [left, *_split_and(f"{subject} {right}", subject)]
    return [clause]


def split_clauses(sentence: str) -> list[str]:
    """A sentence -> atomic-ish clauses: split at semicolons, at ", and/but/while/...", at bare
    "but/whereas", and at "and" before a new clause. Fragments with fewer than two content
    tokens are merged back into their neighbour."""
    pieces: list[str] = []
    for part in re.split(r"\s*;\s*", sentence):
        for a in _COMMA_CONJ.split(part):
            for b in _BUT.split(a):
                b = b.strip(" ,")
                if b:
                    pieces.extend(_split_and(b, _subject(b) or _subject(sentence)))
    merged: list[str] = []
    for p in pieces:
        if merged and min(len(set(content_tokens(x))) for x in (p, merged[-1])) < 2:
            merged[-1] = f"{merged[-1]} {p}"
        else:
            merged.append(p)
    return [m.strip() for m in merged if m.strip()]


def is_noncommittal(text: str) -> bool:
    """An abstention: rag.generation.prompts.INSUFFICIENT, "I don't know", "the passages do not
    say", "cannot be determined", "unknown", ... (a fixed pattern list, not a model), found at
    the start of the answer or anywhere in an answer of at most 15 words."""
    from rag.generation.prompts import INSUFFICIENT

    norm = normalize_answer(strip_citations(text))
    if not norm:
        return True
    if norm.startswith(normalize_answer(INSUFFICIENT)) or norm in _NONCOMMITTAL_EXACT:
        return True
    m = _NONCOMMITTAL.search(norm)
    # a long answer that says what it cannot answer but answers the rest is not an abstention
    return bool(m) and (m.start() == 0 or len(norm.split()) <= 15)


def is_yes_no(text: str) -> bool:
    return normalize_answer(strip_citations(text)) in ("yes", "no")


def is_factoid(text: str) -> bool:
    """A short answer that is not a sentence: at most 6 words, no auxiliary verb, and not a
    3+-word text ending with a full stop ("1931", "Paris", "Tulsa, Oklahoma")."""
    t = strip_citations(text).strip()
    words = t.split()
    if not words or len(words) > 6:
        return False
    if any(w.lower().strip(",.;:!?\"'()") in _AUX for w in words):
        return False
    return not (len(words) >= 3 and t.endswith("."))


@dataclass(frozen=True)
class Claim:
    """One statement to verify. `text` is what is embedded and matched lexically; `span` is the
    answer span of a factoid claim (checked verbatim against the contexts); `key` are the entity
    and number stems of a sentence claim that must occur in the contexts (the gate)."""

    text: str
    span: str | None = None
    key: frozenset[str] = frozenset()


def extract_claims(answer: str, question: str = "") -> list[Claim]:
    """Answer -> claims. Noncommittal answers and bare yes/no make none (nothing verifiable);
    a factoid answer is one claim "<question> — <answer>"; otherwise sentences split into
    clauses."""
    text = strip_citations(answer)
    if is_noncommittal(text) or is_yes_no(text):
        return []
    if is_factoid(text):
        span = text.strip(" .;:,")
        return [Claim(f"{question.strip()} — {span}" if question.strip() else span, span=span)]
    return [Claim(c, key=key_tokens(c)) for s in split_sentences(text) for c in split_clauses(s)]


# ---- embeddings ----------------------------------------------------------------------------
def text_key(text: str) -> str:
    return hashlib.sha1(text.encode("utf-8")).hexdigest()


class Embedder:
    """Cached, batch-invariant unit vectors of texts (see the module docstring).

    `ensure({metric: texts})` encodes every text not cached yet in one pass and books the work
    against the first metric that asked for it; `usage` holds, per metric, `encoder_calls`
    (Encoder.encode invocations that carried its texts), `texts` and `tokens` (word pieces,
    special tokens included) encoded for it, and `cache_hits`.
    """

    def __init__(self, encoder=None, encoder_name: str = "minilm", chunk: int = 2,
                 max_cache: int = 200_000):
        self._encoder = encoder
        self.encoder_name = encoder_name
        self.chunk = max(2, int(chunk))
        self.max_cache = max_cache
        self._cache: OrderedDict[str, np.ndarray] = OrderedDict()
        self._lock = threading.RLock()
        self.usage: dict[str, dict[str, float]] = defaultdict(
            lambda: {"encoder_calls": 0, "texts": 0, "tokens": 0, "cache_hits": 0})
        self.seconds = 0.0

    @property
    def encoder(self):
        if self._encoder is None:
            from rag.encoders import Encoder

            self._encoder = Encoder.from_registry(self.encoder_name)
        return self._encoder

    def _lengths(self, texts: list[str]) -> list[int]:
        model = getattr(self.encoder, "model", None)
        tok = getattr(model, "tokenizer", None)
        if tok is None:  # a stand-in encoder without a tokenizer: whitespace tokens
            return [len(t.split()) + 2 for t in texts]
        ids = tok(texts, truncation=True, max_length=int(model.max_seq_length))["input_ids"]
        return [len(x) for x in ids]

    def ensure(self, requests: Mapping[str, Sequence[str]]) -> None:
        with self._lock:
            owner: dict[str, str] = {}
            for metric, texts in requests.items():
                u = self.usage[metric]
                for t in dict.fromkeys(texts):
                    k = text_key(t)
                    if k in self._cache or k in owner:
                        u["cache_hits"] += 1
                        if k in self._cache:
                            self._cache.move_to_end(k)
                    else:
                        owner[k] = metric
            if not owner:
                return
            todo = {}
            for metric, texts in requests.items():
                for t in texts:
                    k = text_key(t)
                    if owner.get(k) == metric:
                        todo.setdefault(k, t)
            keys, texts = list(todo), [t.strip() or "." for t in todo.values()]
            t0 = time.perf_counter()
            lengths = self._lengths(texts)
            groups: dict[int, list[int]] = defaultdict(list)
            for i, n in enumerate(lengths):
                groups[n].append(i)
            for n in sorted(groups):
                idx = groups[n]
                for j in range(0, len(idx), self.chunk):
                    part = idx[j:j + self.chunk]
                    batch = [texts[i] for i in part]
                    batch += [batch[0]] * (self.chunk - len(batch))  # every call is (chunk, n)
                    vecs = self.encoder.encode(batch, batch_size=self.chunk)
                    for metric in {owner[keys[i]] for i in part}:
                        self.usage[metric]["encoder_calls"] += 1
                    for r, i in enumerate(part):
                        self._cache[keys[i]] = np.asarray(vecs[r], dtype=np.float32)
                        u = self.usage[owner[keys[i]]]
                        u["texts"] += 1
                        u["tokens"] += lengths[i]
            self.seconds += time.perf_counter() - t0
            while len(self._cache) > self.max_cache:
                self._cache.popitem(last=False)

    def get(self, text: str) -> np.ndarray:
        k = text_key(text)
        v = self._cache.get(k)
        if v is None:  # not planned for (or evicted): encode now
            self.ensure({"unplanned": [text]})
            v = self._cache[k]
        return v

    def clear(self) -> None:
        with self._lock:
            self._cache.clear()


# ---- support -------------------------------------------------------------------------------
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
