"""Answer text -> claims, and the text tools the quality metrics share (no model involved).

A *claim* is a short statement taken from an answer (or a reference answer) that the support
score in `rag.metrics.support` checks against the contexts:

tokens     `content_tokens` (lower-cased, stop words removed, Snowball stems), `key_tokens` (the
           stems of names and numbers), `has_negation` (a negation cue)
sentences  `split_sentences` (at . ! ? before a capital or digit, not after abbreviations or
           initials), `split_clauses` (at ";", ", and/but/...", "but", and "and" before a new
           clause)
answers    `is_noncommittal` (an abstention), `is_yes_no`, `is_factoid` (a short non-sentence
           answer), `strip_citations` ("[1]", "[1, 2]" removed)
claims     `extract_claims`: none for an abstention or a bare yes/no; one claim
           "<question> — <answer>" for a factoid; else one per clause of each sentence
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from functools import lru_cache

from rag.metrics.qa import normalize_answer

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

