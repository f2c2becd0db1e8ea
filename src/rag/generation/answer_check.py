"""What kind of answer a question asks for, what kind an answer is, and whether an answer is a
passage's title or metadata rather than something its text says.

Shared by the extractive reader (to pick spans), the generators' post-check (`check_answer`,
before an answer is returned) and the reference-free quality signals (`rag.metrics.signals`).

Types (plain strings):
  expected (from the question): yesno | choice | date | number | person | place | entity
  of an answer: abstain | yesno | time | date | number | text
`fits(expected, kind)` is the contract between them (for short answers: a statement of more
than SHORT_WORDS words can answer any question and is not type-checked, `type_checked`): a date/when question accepts a date or a
year (number), a number question a number, yes/no a yes/no; person/place/entity questions (who,
where, what, which) accept text and refuse dates, times and bare numbers; an abstention fits
nothing.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass

from rag.generation.prompts import INSUFFICIENT

__all__ = ["expected_type", "answer_type", "fits", "type_checked", "metadata_span", "check_answer",
           "AnswerCheck", "EXPECTED_TYPES", "ANSWER_TYPES"]

SHORT_WORDS = 8
EXPECTED_TYPES = ("yesno", "choice", "date", "number", "person", "place", "entity")
ANSWER_TYPES = ("abstain", "yesno", "time", "date", "number", "text")

_MONTH = (r"(?:January|February|March|April|May|June|July|August|September|October|November|"
          r"December|Jan|Feb|Mar|Apr|Jun|Jul|Aug|Sep|Sept|Oct|Nov|Dec)\.?")
DATE = re.compile(rf"\b(?:\d{{1,2}}(?:st|nd|rd|th)?\s+)?{_MONTH}(?:\s+\d{{1,2}}(?:st|nd|rd|th)?)?"
                  rf",?\s+\d{{4}}\b", re.I)
TIME = re.compile(r"\b\d{1,2}[:.]\d{2}\s*(?:[ap]\.?m\.?)?(?!\d)|\b\d{1,2}\s*[ap]\.?m\b", re.I)
ISO = re.compile(r"\b\d{4}-\d{2}-\d{2}(?:[T ]\d{2}:\d{2}(?::\d{2})?)?\b|"
                 r"\b\d{1,2}/\d{1,2}/\d{2,4}\b")
YEAR = re.compile(r"\b(1[0-9]{3}|20[0-9]{2})\b")
_NUMBER_WORDS = ("zero|one|two|three|four|five|six|seven|eight|nine|ten|eleven|twelve|"
                 "thirteen|fourteen|fifteen|sixteen|seventeen|eighteen|nineteen|twenty|thirty|"
                 "forty|fifty|sixty|seventy|eighty|ninety|hundred|thousand|million|billion")
_NUMERIC = re.compile(rf"^(?:about |around |over |nearly |approximately |the )?"
                      rf"(?:[$€£]?\d[\d,]*(?:\.\d+)?|{_NUMBER_WORDS})"
                      rf"(?:[\s-]+(?:{_NUMBER_WORDS}|percent|%|and))*"
                      rf"(?:\s+\S+){{0,2}}$", re.I)
_YESNO_Q = re.compile(r"^(is|are|was|were|do|does|did|can|could|has|have|had|will|would|should|"
                      r"am)\b", re.I)
_CHOICE_TAIL = re.compile(r",\s*[^,]+\s+or\s+[^,]+\?*$")
_COMPARE = re.compile(r"\b(first|last|earlier|later|older|younger|more|less|fewer|longer|shorter|"
                      r"larger|smaller|bigger|higher|lower|taller|greater|better|worse|most|"
                      r"least)\b")
_WORD = re.compile(r"[^\W_]+(?:[-'][^\W_]+)*", re.UNICODE)
_DISAMBIGUATED = re.compile(r"\S\s*\([^()]+\)$")
_ABSTAIN = re.compile(r"^(i don'?t know|unknown|not (?:stated|mentioned|given|known)|"
                      r"no answer|cannot (?:be )?(?:answer|determine)|"
                      r"the (?:passages|context|documents?) do(?:es)? not)", re.I)
_STOP = frozenset(["a", "an", "the", "of", "in", "on", "at", "to", "for", "from", "by", "with", "and", "or", "is", "are", "was", "were", "be"])


def _words(text: str) -> list[str]:
    return [w.lower() for w in _WORD.findall(text)]


def expected_type(question: str) -> str:
    """The answer type `question` asks for (one of EXPECTED_TYPES), from its wording:
    "Is/Were/Did ..." yes/no unless it ends in "..., X or Y?" or compares with "or" ("Was X or
    Y founded first?": choice); "when" leading or trailing, "what year/date" date (a "when"
    clause inside a what-question is not); "how many/much/long/old/tall/far", "what
    number/percentage", a population number; who/whom/whose person; where/"in which city"
    place; anything else (what, which, name ...) entity."""
    q = " ".join(question.split())
    ql = q.lower()
    either = bool(re.search(r"\bor\b", ql))
    if _YESNO_Q.match(q) and not _CHOICE_TAIL.search(q) and not (either and _COMPARE.search(ql)):
        return "yesno"
    if either and (_YESNO_Q.match(q) or re.match(r"^(which|who|what|whose)\b", ql)):
        return "choice"
    if re.search(r"\b(what|which) (year|date|day|month|time|century|decade)\b|^when\b|"
                 r"\bwhen\W*$|\bhow long ago\b", ql):
        return "date"
    if re.search(r"\bhow (many|much|long|old|tall|far|big|large|high|often)\b|"
                 r"\bwhat (number|percentage|percent|amount|age)\b|\bpopulation\b|"
                 r"\b(what|which) (is|was|are|were) the (number|total|size|length|height|area)"
                 r" of\b", ql):
        return "number"
    if re.match(r"^(who|whom|whose)\b", ql) or re.search(r"\b(which|what) (person|actor|actress|"
                                                         r"singer|player|author|writer)\b", ql):
        return "person"
    if re.match(r"^where\b", ql) or re.search(r"\b(which|what) (city|country|state|town|"
                                              r"county|place|region|continent)\b", ql):
        return "place"
    return "entity"


def answer_type(answer: str) -> str:
    """The type of an answer text (one of ANSWER_TYPES): an abstention (INSUFFICIENT, "I don't
    know", ...), a bare yes/no, a clock time or timestamp, a date (day/month + year, ISO, or a
    year alone), a number (digits with at most two unit words, or number words with at most
    one: "five months"), else text."""
    a = " ".join(answer.split()).strip(" .;:,\"'")
    if not a or a == INSUFFICIENT or _ABSTAIN.match(a):
        return "abstain"
    low = a.lower()
    if low in ("yes", "no") or re.match(r"^(yes|no)[,.]", low):
        return "yesno"
    words = _words(a)
    if TIME.search(a) and len(words) <= 8:
        return "time"
    for pat in (DATE, ISO):
        m = pat.search(a)
        if m and len(a) - len(m.group(0)) <= 6:
            return "date"
    if re.fullmatch(rf"(?:\d{{1,2}}(?:st|nd|rd|th)?\s+)?{_MONTH}(?:\s+\d{{1,2}}(?:st|nd|rd|th)?)?",
                    a, re.I):
        return "date"
    if re.search(r"\b(\d{1,2}(st|nd|rd|th)|[a-z]+(teenth|tieth))[\s-]century\b|\b(1[0-9]|20)\d0s\b",
                 low) and len(words) <= 6:
        return "date"
    if YEAR.fullmatch(a) or re.fullmatch(r"(?:in |the )?(?:1[0-9]{3}|20[0-9]{2})s?", low):
        return "date"
    named = any(w[:1].isupper() for w in a.split()[1:])  # "2000 Summer Olympics" is a name
    if not named and (_NUMERIC.match(a) and any(ch.isdigit() for ch in a) or re.fullmatch(
            rf"(?:{_NUMBER_WORDS})(?:[\s-]+(?:{_NUMBER_WORDS}))*(?:\s+(?!of\b)[a-z]+)?", low)):
        return "number"
    return "text"


def type_checked(answer: str) -> bool:
    """Whether `fits` applies to this answer: at most SHORT_WORDS words."""
    return len(_words(answer)) <= SHORT_WORDS


def fits(expected: str, kind: str) -> bool:
    """Whether an answer of type `kind` can answer a question expecting `expected` (module
    docstring). Unknown names raise ValueError."""
    if expected not in EXPECTED_TYPES:
        raise ValueError(f"expected: unknown type {expected!r} (known: {', '.join(EXPECTED_TYPES)})")
    if kind not in ANSWER_TYPES:
        raise ValueError(f"kind: unknown type {kind!r} (known: {', '.join(ANSWER_TYPES)})")
    if kind == "abstain":
        return False
    if expected == "yesno":
        return kind == "yesno"
    if expected == "date":
        return kind in ("date", "time", "number")
    if expected == "number":
        return kind == "number"
    if expected == "choice":
        return kind == "text" or kind == "yesno"
    return kind == "text"


def metadata_span(answer: str, titles: Sequence[str], texts: Sequence[str]) -> bool:
    """True when the answer is (most of) a passage title that the passages' texts never say:
    a title or metadata field (e.g. a session timestamp) rather than content, or exactly a
    title that ends in a parenthesised disambiguation ("Blue Hawaii (drink)") that no text
    says. `titles` and `texts` are the passages' fields, in any order."""
    aw = [w for w in _words(answer) if w not in _STOP]
    if not aw:
        return False
    norm = " ".join(_words(answer))
    if (_DISAMBIGUATED.search(answer.strip()) and any(norm == " ".join(_words(t)) for t in titles)
            and not any(norm in " ".join(_words(t)) for t in texts)):
        return True  # "Blue Hawaii (drink)": a title's disambiguation no text says
    body = set(w for t in texts for w in _words(t))
    in_text = sum(w in body for w in aw) / len(aw)
    for t in titles:
        tw = set(_words(t))
        if tw and sum(w in tw for w in aw) / len(aw) >= 0.6 and in_text < 0.5:
            return True
    return False


@dataclass(frozen=True)
class AnswerCheck:
    """The verdict of `check_answer`: `ok` is False when the answer does not answer the
    question asked; `reason` is "" when ok, else off_type (its type does not fit the question's,
    see `fits`) or metadata (a title/metadata span the passages' texts never say)."""

    ok: bool
    expected: str
    kind: str
    reason: str = ""


def check_answer(question: str, answer: str, titles: Sequence[str] = (),
                 texts: Sequence[str] = ()) -> AnswerCheck:
    """Checks a generated answer before it is returned. An abstention is ok (it answers
    nothing but claims nothing); a choice question's answer is not type-checked; a title is a
    fair answer to a date question (a session's timestamp title is when it happened) and to a
    question that asks for a title or name."""
    expected, kind = expected_type(question), answer_type(answer)
    if kind == "abstain":
        return AnswerCheck(True, expected, kind)
    if (titles and expected != "date" and metadata_span(answer, titles, texts)
            and not re.search(r"\b(title|titled|called|named)\b", question, re.I)):
        return AnswerCheck(False, expected, kind, "metadata")
    if expected != "choice" and type_checked(answer) and not fits(expected, kind):
        return AnswerCheck(False, expected, kind, "off_type")
    return AnswerCheck(True, expected, kind)
