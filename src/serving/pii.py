"""PII detection, redaction and a leak count: pure functions of text, standard library only.

    find_pii("mail bob@x.org or call +1 415-555-0100")   # [PIIMatch('email', ...), ...]
    redact("SSN 123-45-6789")                             # 'SSN [SSN]'
    leak_count(answer, question, contexts)                # PII in the answer not in the inputs

Kinds: `email`, `phone` (9-15 digits with separators or a leading +), `ssn` (US, area not
000/666/9xx), `credit_card` (13-19 digits passing the Luhn check), `iban` (ISO 13616 length
and mod-97 check). The checksums are what keep IDs from firing on ordinary numbers (years,
counts, page ranges): a random 16-digit string passes Luhn one time in ten.

Why a *leak* count and not just "any PII": a RAG answer may legitimately repeat an address the
user typed or that the retrieved passage holds; what the tuner must penalise is PII that the
answer invents or pulls from outside its inputs. `leak_count(..., mode="any")` counts every hit
(stricter deployments). Leak counts feed the reward penalty P (`rl.kernel.reward`: `StepMetrics.pii_leaks`
for a batch, `feedback_reward` for one logged interaction; see docs/serving.md, "PII").

No project imports on purpose: `rl` may not import `serving` (tests/unit/test_layering.py), so this
module can be moved to `rag/` verbatim if the reward computation needs it.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Iterable
from dataclasses import dataclass

KINDS = ("email", "iban", "credit_card", "ssn", "phone")
"""Detection order = priority when spans overlap (an IBAN's digits are not also a phone)."""

_EMAIL = re.compile(r"(?<![\w.+-])[A-Za-z0-9._%+-]{1,64}@(?:[A-Za-z0-9-]{1,63}\.)+[A-Za-z]{2,24}"
                    r"(?![\w-])")
_IBAN = re.compile(r"\b[A-Z]{2}\d{2}(?:[ ]?[A-Z0-9]{4}){2,7}(?:[ ]?[A-Z0-9]{1,4})?\b")
_CARD = re.compile(r"(?<![\d-])(?:\d[ -]?){12,18}\d(?![\d-])")
_SSN = re.compile(r"(?<![\d-])(?!000|666|9\d\d)\d{3}-(?!00)\d{2}-(?!0000)\d{4}(?![\d-])")
_PHONE = re.compile(r"(?<![\w+])(?:\+\d{1,3}[ .-]?)?(?:\(\d{1,4}\)[ .-]?)?\d{2,4}(?:[ .-]\d{2,4}){1,4}"
                    r"(?![\w])")

IBAN_LENGTHS = {"AD": 24, "AT": 20, "BE": 16, "CH": 21, "CZ": 24, "DE": 22, "DK": 18, "ES": 24,
                "FI": 18, "FR": 27, "GB": 22, "GR": 27, "IE": 22, "IT": 27, "LU": 20, "NL": 18,
                "NO": 15, "PL": 28, "PT": 25, "SE": 24, "SK": 24}


@dataclass(frozen=True)
class PIIMatch:
    kind: str
    start: int
    end: int
    value: str

    @property
    def key(self) -> str:
        """Normalised value (digits / lower-case): the same number written with other
        separators is the same PII."""
        if self.kind == "email":
            return self.value.lower()
        return re.sub(r"[^0-9A-Za-z]", "", self.value).upper()


def luhn_ok(digits: str) -> bool:
    """The Luhn checksum of a digit string (payment card numbers)."""
    if not digits.isdigit():
        return False
    total = 0
    for i, ch in enumerate(reversed(digits)):
        d = int(ch)
        if i % 2:
            d = d * 2 - 9 if d > 4 else d * 2
        total += d
    return total % 10 == 0


def iban_ok(value: str) -> bool:
    """ISO 13616: known country length (when listed) and mod-97 == 1."""
    s = value.replace(" ", "").upper()
    if not (15 <= len(s) <= 34) or not s[:2].isalpha() or not s[2:4].isdigit():
        return False
    if s[:2] in IBAN_LENGTHS and len(s) != IBAN_LENGTHS[s[:2]]:
        return False
    moved = s[4:] + s[:4]
    num = "".join(str(int(c, 36)) for c in moved)
    return int(num) % 97 == 1


def _valid(kind: str, value: str) -> bool:
    digits = re.sub(r"\D", "", value)
    if kind == "credit_card":
        return 13 <= len(digits) <= 19 and luhn_ok(digits)
    if kind == "iban":
        return iban_ok(value)
    if kind == "phone":
        if not 9 <= len(digits) <= 15:
            return False
        # a date (2024-01-31) is not a phone number, nor is an invalid SSN's 3-2-4 shape
        v = value.strip()
        return not (re.fullmatch(r"\d{4}[-./]\d{1,2}[-./]\d{1,2}", v)
                    or re.fullmatch(r"\d{3}-\d{2}-\d{4}", v))
    return True


_PATTERNS = {"email": _EMAIL, "iban": _IBAN, "credit_card": _CARD, "ssn": _SSN,
             "phone": _PHONE}


def find_pii(text: str, kinds: Iterable[str] = KINDS) -> list[PIIMatch]:
    """Non-overlapping PII matches in `text`, ordered by position."""
    wanted = [k for k in KINDS if k in set(kinds)]
    taken: list[tuple[int, int]] = []
    out: list[PIIMatch] = []
    for kind in wanted:
        for m in _PATTERNS[kind].finditer(text):
            s, e = m.span()
            if any(s < te and ts < e for ts, te in taken) or not _valid(kind, m.group()):
                continue
            taken.append((s, e))
            out.append(PIIMatch(kind, s, e, m.group()))
    return sorted(out, key=lambda x: x.start)


def redact(text: str, kinds: Iterable[str] = KINDS) -> str:
    """`text` with every match replaced by `[KIND]` (e.g. `[EMAIL]`)."""
    out, pos = [], 0
    for m in find_pii(text, kinds):
        out += [text[pos:m.start], f"[{m.kind.upper()}]"]
        pos = m.end
    out.append(text[pos:])
    return "".join(out)


def pii_leaks(answer: str, question: str = "", contexts: Iterable[str] = (),
              kinds: Iterable[str] = KINDS) -> list[PIIMatch]:
    """PII in `answer` whose normalised value appears in neither the question nor a context."""
    kinds = tuple(kinds)
    seen = {m.key for src in (question, *contexts) for m in find_pii(src, kinds)}
    return [m for m in find_pii(answer, kinds) if m.key not in seen]


def leak_count(answer: str, question: str = "", contexts: Iterable[str] = (),
               mode: str = "leak", kinds: Iterable[str] = KINDS) -> int:
    """Hits for the reward penalty: `leak` = PII not present in the inputs (default),
    `any` = every PII match in the answer."""
    if mode == "any":
        return len(find_pii(answer, kinds))
    if mode != "leak":
        raise ValueError(f"mode must be 'leak' or 'any', got {mode!r}")
    return len(pii_leaks(answer, question, contexts, kinds))


def mean_leaks(answers: Iterable[str], questions: Iterable[str],
               contexts: Iterable[Iterable[str]] | None = None, mode: str = "leak") -> float:
    """Mean leak count per query over a batch (what a reward penalty term would use)."""
    qs = list(questions)
    ans = list(answers)
    if len(ans) != len(qs):
        raise ValueError(f"{len(ans)} answers but {len(qs)} questions")
    ctxs = list(contexts) if contexts is not None else [()] * len(ans)
    if not ans:
        return 0.0
    return sum(leak_count(a, q, c, mode) for a, q, c in zip(ans, qs, ctxs, strict=True)) / len(ans)


class RedactingFilter(logging.Filter):
    """A logging filter that redacts PII from a record's message (args are formatted first,
    so `log.info("q=%s", question)` is covered) and from its exception text."""

    def __init__(self, kinds: Iterable[str] = KINDS):
        super().__init__()
        self.kinds = tuple(kinds)

    def filter(self, record: logging.LogRecord) -> bool:
        try:
            msg = record.getMessage()
        except Exception:  # a malformed format string: leave the record as it is
            return True
        record.msg, record.args = redact(msg, self.kinds), None
        if record.exc_info and not record.exc_text:
            record.exc_text = logging.Formatter().formatException(record.exc_info)
        if record.exc_text:
            record.exc_text = redact(record.exc_text, self.kinds)
        return True
