"""A chat LM (Qwen2.5-Coder-1.5B on llama.cpp, or any chat callable) as the slot backend of
`rag.metrics.judge.PairwiseJudge`, and the statistics that say whether a judge is worth using.
`LogprobJudgeBackend` is the same judge read from the next-token distribution over "A"/"B"
(transformers, e.g. bf16 on a lent GPU) instead of from a decoded reply.

`ChatLMJudgeBackend(chat, fingerprint)` asks "which answer is correct, A or B?" with a short
prompt (question first, then the two answers; the passages only when `with_contexts`) and reads
the first letter of a <= 3-token reply. The prompt is short because on a CPU its length is the
judge's cost (docs/design-notes.md), and the question comes before the answers so that llama.cpp
reuses the KV cache of the shared prefix for the swapped order. Replies are
cached in `JudgeCache` under sha256(fingerprint, messages, max_tokens), so a re-run replays.
Both backends take a reference answer as a fifth item element (`PairwiseJudge.compare(...,
reference=)`): the prompt then shows it after the question and asks which answer agrees with
it (reference-guided grading, for labelling training pairs where gold exists).

`PointwiseJudgeBackend` grades each answer on its own (log p("Yes") - log p("No") after "does
the answer give the same answer as the reference?", `grade_prompt`) and prefers the higher
grade: no slot is ever shown, so it has no position bias by construction, and an answer's
grade is computed once however many pairs it is in (cheaper than a pairwise judge when a
question has several sampled answers, as DPO pair labelling does).

`judge_stats(results, f1_a, f1_b)` -> the judge's reliability metrics:
  position_bias  share of pairs where the same *slot* won in both orders (first/first or
                 second/second): the verdict followed the position, not the answer.
  tie_rate       share of pairs whose order-swapped verdict is a tie (the orders disagreed,
                 or the judge said tie).
  agreement_with_f1_preference  on pairs whose gold answer-F1 differ, the share where the
                 judge's winner is the higher-F1 answer; a tie counts as *not* agreeing.
  agreement_decisive  the same over the F1-differing pairs the judge decided (no tie).
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable, Sequence
from typing import Any

from rag.generation.prompts import MAX_CONTEXT_CHARS
from rag.metrics.judge import JudgeResult, SlotResult, SlotVerdict
from rag.metrics.judge_cache import JudgeCache, content_key
from rag.types import Context

__all__ = ["ChatFn", "ChatLMJudgeBackend", "ChoiceFn", "LogprobJudgeBackend",
           "PointwiseJudgeBackend", "grade_prompt", "reference_text", "short_judge_prompt",
           "parse_letter", "llama_chat", "judge_stats"]

ChatFn = Callable[[list[dict[str, str]], int], tuple[str, int, int]]
"""(messages, max_tokens) -> (reply text, prompt tokens, completion tokens); temperature 0."""

SYSTEM = "You grade answers to questions. Reply with one letter."
_LETTER = re.compile(r"\b(A|B)\b")


def short_judge_prompt(question: str, contexts: Sequence[Context], first: str, second: str,
                       with_contexts: bool = False, context_chars: int = 400,
                       reference: str | None = None) -> list[dict[str, str]]:
    """Chat messages: question (and optionally passages, `context_chars` each), answer A =
    `first`, answer B = `second`, "Which answer is correct? Reply A or B." With a `reference`
    (a gold answer) it comes after the question and the ask is "Which answer agrees with the
    reference answer?" (reference-guided grading)."""
    parts = [f"Question: {question}"]
    if with_contexts and contexts:
        chars = min(context_chars, MAX_CONTEXT_CHARS)
        parts.append("Passages:\n" + "\n".join(f"[{i}] {c.title}: {c.text[:chars]}"
                                               for i, c in enumerate(contexts, 1)))
    if reference is not None:
        parts.append(f"Reference answer: {reference}")
    parts += [f"Answer A: {first or '(empty)'}", f"Answer B: {second or '(empty)'}",
              "Which answer agrees with the reference answer? Reply A or B."
              if reference is not None else "Which answer is correct? Reply A or B."]
    return [{"role": "system", "content": SYSTEM}, {"role": "user", "content": "\n".join(parts)}]


def parse_letter(raw: str) -> SlotVerdict | None:
    """first/second from the first standalone A or B of the reply ("B", "Answer A."); "tie"
    when the reply says tie/both/neither first; None when nothing can be read."""
    text = (raw or "").strip()
    low = text.lower()
    m = _LETTER.search(text)
    for word in ("tie", "both", "neither"):
        k = low.find(word)
        if k >= 0 and (m is None or k < m.start()):
            return "tie"
    if m is None:
        return None
    return "first" if m.group(1) == "A" else "second"


class ChatLMJudgeBackend:
    """Slot judge over a chat function (module docstring). `seconds` lists the wall time of
    every uncached call (s); `parse_failures` counts replies without a readable letter (those
    count as a tie); `replayed_seconds` what cached replies cost when they were generated."""

    accepts_reference = True  # items may carry a fifth element, a reference answer

    def __init__(self, chat: ChatFn, fingerprint: str, *, with_contexts: bool = False,
                 max_tokens: int = 3, cache: JudgeCache | None = None, name: str = "chat-lm"):
        self.chat, self.fingerprint, self.name = chat, fingerprint, name
        self.with_contexts, self.max_tokens = with_contexts, max_tokens
        self.cache = cache if cache is not None else JudgeCache()
        self.seconds: list[float] = []
        self.replayed_seconds: list[float] = []  # what cached replies cost when generated
        self.parse_failures = 0
        self.cache_hits = 0

    def _reply(self, messages: list[dict[str, str]]) -> tuple[str, int, int]:
        key = content_key("pairwise-judge", self.fingerprint, messages, self.max_tokens)
        hit = self.cache.get(key)
        if hit is not None:
            self.cache_hits += 1
            if "seconds" in hit:
                self.replayed_seconds.append(float(hit["seconds"]))
            return hit["text"], 0, 0  # a replayed verdict costs no tokens
        t0 = time.perf_counter()
        text, t_in, t_out = self.chat(messages, self.max_tokens)
        self.seconds.append(time.perf_counter() - t0)
        self.cache.put(key, {"text": text, "tokens_in": t_in, "tokens_out": t_out,
                             "seconds": self.seconds[-1]})
        return text, t_in, t_out

    def judge_batch(self, items: Sequence[tuple[str, Sequence[Context], str, str]]
                    ) -> list[SlotResult]:
        out = []
        for q, c, a, b, *ref in items:
            raw, t_in, t_out = self._reply(short_judge_prompt(
                q, c, a, b, self.with_contexts, reference=ref[0] if ref else None))
            v = parse_letter(raw)
            if v is None:
                self.parse_failures += 1
                v = "tie"
            out.append(SlotResult(v, {"first": 1.0, "second": -1.0, "tie": 0.0}[v], 1,
                                  t_in, t_out))
        return out


ChoiceFn = Callable[[list[list[dict[str, str]]], Sequence[str]], list[list[float]]]
"""(chats, choices) -> per chat, the next-token log-probability of each choice's first token
(`rag.generation.local.TransformersGenerator.choice_logprobs`)."""


class LogprobJudgeBackend:
    """Slot judge that reads the verdict from the model's next-token distribution over "A"
    and "B" (one forward pass, no decoding, no parse failure): the slot with the higher
    log-probability wins; its signed margin is log p(A) - log p(B), so `PairwiseJudge`'s
    order-averaged `margin` is the judge's position-debiased log-odds for answer A. Same
    prompt as `ChatLMJudgeBackend` (`short_judge_prompt`). `tie_margin` (nats): a slot
    margin smaller than this is a tie."""

    accepts_reference = True  # items may carry a fifth element, a reference answer

    def __init__(self, choice_logprobs: ChoiceFn, fingerprint: str, *,
                 with_contexts: bool = False, context_chars: int = 400,
                 tie_margin: float = 0.0, name: str = "logprob-lm"):
        self.choice_logprobs, self.fingerprint, self.name = choice_logprobs, fingerprint, name
        self.with_contexts, self.context_chars = with_contexts, context_chars
        self.tie_margin = tie_margin
        self.seconds: list[float] = []

    def judge_batch(self, items: Sequence[tuple[str, Sequence[Context], str, str]]
                    ) -> list[SlotResult]:
        chats = [short_judge_prompt(q, c, a, b, self.with_contexts, self.context_chars,
                                    ref[0] if ref else None)
                 for q, c, a, b, *ref in items]
        t0 = time.perf_counter()
        lps = self.choice_logprobs(chats, ("A", "B"))
        self.seconds.append(time.perf_counter() - t0)
        out = []
        for lp_a, lp_b in lps:
            d = float(lp_a - lp_b)
            v: SlotVerdict = "tie" if abs(d) <= self.tie_margin else (
                "first" if d > 0 else "second")
            out.append(SlotResult(v, d, 1))
        return out


GRADE_SYSTEM = "You grade answers to questions. Reply Yes or No."


def reference_text(answers: Sequence[str]) -> str:
    """Gold answer(s) as a judge reads them: the non-blank ones, stripped, joined by " / "."""
    return " / ".join(a.strip() for a in answers if a.strip())


def grade_prompt(question: str, answer: str, reference: str | None = None
                 ) -> list[dict[str, str]]:
    """Chat messages grading one `answer`: against `reference` ("Does the answer give the same
    answer as the reference?") or, without one, "Is the answer correct?"."""
    parts = [f"Question: {question}"]
    if reference is not None:
        parts.append(f"Reference answer: {reference}")
    parts += [f"Answer: {answer or '(empty)'}",
              "Does the answer give the same answer as the reference? Reply Yes or No."
              if reference is not None else "Is the answer correct? Reply Yes or No."]
    return [{"role": "system", "content": GRADE_SYSTEM},
            {"role": "user", "content": "\n".join(parts)}]


class PointwiseJudgeBackend:
    """Slot judge from two independent grades (module docstring): grade = log p("Yes") -
    log p("No") of `grade_prompt`; the slot with the higher grade wins, by more than
    `tie_margin` (nats), else a tie; the signed margin is the grade difference. Grades are kept
    per (question, answer, reference) for the backend's life, so the order swap and every
    other pair with the same answer cost nothing; `calls` counts the grades computed."""

    accepts_reference = True

    def __init__(self, choice_logprobs: ChoiceFn, fingerprint: str, *,
                 tie_margin: float = 0.0, name: str = "pointwise-lm"):
        self.choice_logprobs, self.fingerprint, self.name = choice_logprobs, fingerprint, name
        self.tie_margin = tie_margin
        self.grades: dict[tuple[str, str, str | None], float] = {}
        self.calls = 0
        self.seconds: list[float] = []

    def grade(self, items: Sequence[tuple[str, str, str | None]]) -> list[float]:
        """(question, answer, reference or None) -> grade, one forward pass for the new ones."""
        new = list(dict.fromkeys(k for k in map(tuple, items) if k not in self.grades))
        if new:
            t0 = time.perf_counter()
            lps = self.choice_logprobs([grade_prompt(*k) for k in new], ("Yes", "No"))
            self.seconds.append(time.perf_counter() - t0)
            self.calls += len(new)
            for k, (lp_yes, lp_no) in zip(new, lps, strict=True):
                self.grades[k] = float(lp_yes - lp_no)
        return [self.grades[tuple(k)] for k in items]

    def judge_batch(self, items: Sequence[tuple[str, Sequence[Context], str, str]]
                    ) -> list[SlotResult]:
        keys = [(q, a, ref[0] if ref else None) for q, _, a, _, *ref in items]
        keys += [(q, b, ref[0] if ref else None) for q, _, _, b, *ref in items]
        before = set(self.grades)
        g = self.grade(keys)
        n = len(items)
        out = []
        for i, (first, second) in enumerate(zip(g[:n], g[n:], strict=True)):
            d = first - second
            v: SlotVerdict = "tie" if abs(d) <= self.tie_margin else (
                "first" if d > 0 else "second")
            fresh = sum(keys[j] not in before for j in (i, n + i))
            before.update((keys[i], keys[n + i]))
            out.append(SlotResult(v, d, fresh))
        return out


def llama_chat(generator: Any) -> ChatFn:
    """A ChatFn over a loaded `rag.llama_runtime.LlamaCppGenerator` (greedy, its own chat
    template, serialised by the generator's lock: one llama.cpp context is not thread-safe)."""
    def chat(messages: list[dict[str, str]], max_tokens: int) -> tuple[str, int, int]:
        with generator._lock:
            out = generator.llm.create_chat_completion(
                messages=messages, max_tokens=max_tokens, temperature=0.0, top_k=1,
                repeat_penalty=1.0, seed=generator.seed)
        usage = out.get("usage") or {}
        return (out["choices"][0]["message"]["content"] or "",
                int(usage.get("prompt_tokens", 0)), int(usage.get("completion_tokens", 0)))
    return chat


def judge_stats(results: Sequence[JudgeResult], f1_a: Sequence[float],
                f1_b: Sequence[float], f1_tol: float = 1e-9) -> dict[str, float]:
    """position_bias, tie_rate, agreement_with_f1_preference, agreement_decisive (module
    docstring) and the counts behind them (n_pairs, n_f1_differ, n_decisive). Slot-level
    verdicts come from each result's forward/backward (A/B after mapping back): the same slot
    won in both orders exactly when forward != backward and neither is a tie."""
    n = len(results)
    if not n == len(f1_a) == len(f1_b):
        raise ValueError("results, f1_a and f1_b must have the same length")
    same_slot = sum(r.forward != r.backward and "tie" not in (r.forward, r.backward)
                    for r in results)
    ties = sum(r.winner == "tie" for r in results)
    differ = [(r, fa, fb) for r, fa, fb in zip(results, f1_a, f1_b, strict=True)
              if abs(fa - fb) > f1_tol]
    agree = sum(r.winner == ("A" if fa > fb else "B") for r, fa, fb in differ)
    decisive = [t for t in differ if t[0].winner != "tie"]
    return {"n_pairs": float(n), "position_bias": same_slot / n if n else 0.0,
            "tie_rate": ties / n if n else 0.0, "n_f1_differ": float(len(differ)),
            "agreement_with_f1_preference": agree / len(differ) if differ else 0.0,
            "n_decisive": float(len(decisive)),
            "agreement_decisive": agree / len(decisive) if decisive else 0.0}
