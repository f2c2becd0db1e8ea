"""Raw model output -> (answer text, 1-based citations)."""

from __future__ import annotations

import re
from collections.abc import Sequence

from rag.generation.prompts import INSUFFICIENT
from rag.types import Context

_CITE = re.compile(r"\[(\d+(?:\s*[,;]\s*\d+)*)\]")
_PAREN_CITE = re.compile(r"\((\d+(?:\s*[,;]\s*\d+)*)\)")
# the concise prompts' "(a few words: a name, number, date, or yes/no)" repeated after an answer
# (Qwen2.5-Coder does: "Kashmir (a name, number, date, or yes/no) [1, 3]")
_TYPE_ECHO = re.compile(r"\s*\((?=[^()]*(?:\byes/no\b|\ba name,\s*(?:a\s+)?number\b))[^()]*\)?",
                        re.I)
_PREFIX = re.compile(r"^\s*(?:final answer|short answer|answer|a)\s*[:\-]\s*", re.I)
_LEAD = re.compile(r"^\s*(?:the (?:short |final )?answer is|it is|it was|answer is)\s*:?\s*",
                   re.I)


def bracket_paren_citations(raw: str, n_contexts: int) -> str:
    """`Audioslave (2, 3)` -> `Audioslave [2, 3]`: a parenthesised number list is a citation
    when every number is a passage index (1..n_contexts); `Arthur (1925)` is left alone."""
    def swap(m: re.Match) -> str:
        nums = [int(t) for t in re.split(r"[,;]", m.group(1))]
        return f"[{m.group(1)}]" if all(1 <= i <= n_contexts for i in nums) else m.group(0)

    return _PAREN_CITE.sub(swap, raw)


def parse_citations(raw: str, n_contexts: int) -> tuple[int, ...]:
    """Every [n], [n, m] or [n][m] in order of first appearance, limited to 1..n_contexts."""
    seen: list[int] = []
    for group in _CITE.findall(raw):
        for tok in re.split(r"[,;]", group):
            i = int(tok.strip())
            if 1 <= i <= n_contexts and i not in seen:
                seen.append(i)
    return tuple(seen)


_FUNCTION = {"was", "is", "were", "are", "in", "by", "the", "a", "an", "of", "to", "at", "on",
             "their", "its", "his", "her", "as", "for", "which", "that", "who", "be", "been"}


def _bare(word: str) -> str:
    return word.lower().strip(".,;:!?\"'()")


def _starts_with_option(words: list[str], question: str) -> bool:
    """Whether the answer's first words are one of the options a comparison question offers
    ("..., Arthur's Magazine or First for Women?"): a leading phrase that stands right before
    or right after an " or " of the question. Such an answer repeats question words by design."""
    q = " ".join(_bare(w) for w in question.split())
    phrase = ""
    for w in words:
        phrase = f"{phrase} {_bare(w)}".strip()
        if f"{phrase} or " in q or q.endswith(f" or {phrase}") or f" or {phrase} " in q:
            return True
    return False


def strip_question_echo(answer: str, question: str) -> str:
    """Small models restate the question before answering ("The band who released X had their
    first performance in Tulsa"): drop the longest leading run of words that mostly repeat the
    question, then leading function words. Returns the answer unchanged when nothing is left,
    and when it begins with one of the options a comparison question offers."""
    qwords = {_bare(w) for w in question.split()}
    words = answer.split()
    cut, seen = 0, 0
    for i, w in enumerate(words, 1):
        echoed = _bare(w) in qwords
        seen += echoed
        if echoed and i >= 3 and seen / i >= 0.7:
            cut = i
    if cut and _starts_with_option(words[:cut], question):
        return answer  # "First for Women (...)" answers "..., X or First for Women?": keep it
    rest = words[cut:]
    while rest and rest[0].lower() in _FUNCTION:
        rest = rest[1:]
    return " ".join(rest) if rest else answer


def clean_answer(raw: str, concise: bool = True, question: str | None = None) -> str:
    """Drop citations and boilerplate; for concise prompts keep the first line/clause (and drop
    a restated question when `question` is given)."""
    text = raw.strip()
    if INSUFFICIENT in text.lower():
        return INSUFFICIENT
    text = _CITE.sub("", text)
    text = re.sub(r"\[\d*$", "", text)  # a citation cut off by max_new_tokens
    text = _TYPE_ECHO.sub("", text)
    if concise:
        text = next((ln for ln in text.splitlines() if ln.strip()), "")
    text = _PREFIX.sub("", text)
    text = _LEAD.sub("", text)
    if concise:
        # "Paris, because passage 1 says ..." -> "Paris"; keep "1,000" and decimals intact
        text = re.split(r"(?<!\d)[,;](?!\d)|\s+(?:because|since|as stated|according to)\s+",
                        text, maxsplit=1)[0]
    text = text.strip().strip("\"'“”‘’*").strip()
    if concise and question:
        text = strip_question_echo(text, question)
    return text.rstrip(".").strip()


def parse_output(raw: str, n_contexts: int, concise: bool = True, question: str | None = None,
                 contexts: Sequence[Context] | None = None) -> tuple[str, tuple[int, ...]]:
    """(answer text, 1-based citations); `[n]` and in-range `(n)` lists both count as cites.
    With the `contexts` and the `question`, an answer that is a passage's title or metadata
    the passages' texts never say (e.g. a session timestamp answered to a what-question;
    `rag.generation.answer_check.check_answer`) is replaced by INSUFFICIENT, citing nothing."""
    raw = bracket_paren_citations(raw, n_contexts)
    text, cites = clean_answer(raw, concise, question), parse_citations(raw, n_contexts)
    if contexts and question:
        from rag.generation.answer_check import check_answer

        verdict = check_answer(question, text, [c.title for c in contexts],
                               [c.text for c in contexts])
        if verdict.reason == "metadata":
            return INSUFFICIENT, ()
    return text, cites
