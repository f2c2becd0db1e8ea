"""Raw model output -> (answer text, 1-based citations)."""

from __future__ import annotations

import re

from rag.generation.prompts import INSUFFICIENT

_CITE = re.compile(r"\[(\d+(?:\s*[,;]\s*\d+)*)\]")
_PREFIX = re.compile(r"^\s*(?:final answer|short answer|answer|a)\s*[:\-]\s*", re.I)
_LEAD = re.compile(r"^\s*(?:the (?:short |final )?answer is|it is|it was|answer is)\s*:?\s*",
                   re.I)


def parse_citations(raw: str, n_contexts: int) -> tuple[int, ...]:
    """Every [n], [n, m] or [n][m] in order of first appearance, limited to 1..n_contexts."""
    seen: list[int] = []
    for group in _CITE.findall(raw):
        for tok in re.split(r"[,;]", group):
            i = int(tok.strip())
            if 1 <= i <= n_contexts and i not in seen:
                seen.append(i)
    return tuple(seen)


def clean_answer(raw: str, concise: bool = True) -> str:
    """Drop citations and boilerplate; for concise prompts keep the first line/clause."""
    text = raw.strip()
    if INSUFFICIENT in text.lower():
        return INSUFFICIENT
    text = _CITE.sub("", text)
    text = re.sub(r"\[\d*$", "", text)  # a citation cut off by max_new_tokens
    if concise:
        text = next((ln for ln in text.splitlines() if ln.strip()), "")
    text = _PREFIX.sub("", text)
    text = _LEAD.sub("", text)
    if concise:
        # "Paris, because passage 1 says ..." -> "Paris"; keep "1,000" and decimals intact
        text = re.split(r"(?<!\d)[,;](?!\d)|\s+(?:because|since|as stated|according to)\s+",
                        text, maxsplit=1)[0]
    text = text.strip().strip("\"'“”‘’*").strip()
    return text.rstrip(".").strip()


def parse_output(raw: str, n_contexts: int, concise: bool = True) -> tuple[str, tuple[int, ...]]:
    return clean_answer(raw, concise), parse_citations(raw, n_contexts)
