"""Pairwise answer judge with order swap.

`PairwiseJudge(backend).compare(question, contexts, answer_a, answer_b)` asks the backend twice,
once with A shown first and once with B shown first. The verdict is the winner both orders agree
on; when they disagree (or either says tie) the result is a tie. Why: LLM judges prefer the first
(or second) slot, and a verdict that flips with the order carries no information about the
answers. `judge.usage["position_bias_rate"]` = pairs whose verdict flipped with the order / pairs.

Backends (all answer "which of these two is better", in slot terms `first`/`second`/`tie`):

  MetricJudgeBackend   QualityScorer reward = w * faithfulness + (1 - w) * answer_relevancy,
                       the higher wins when the gap is >= `tie_margin`. Order-free by
                       construction (bias rate 0), deterministic, no LLM: the default teacher
                       for the distilled reward model (rag.metrics.reward_model).
  LocalLMJudgeBackend  a local causal LM (SmolLM2 via rag.generation.local): one forward pass,
                       verdict = the larger next-token log-likelihood of "A" vs "B" after a
                       judging prompt. Cheap (no decoding) and deterministic.
  OpenAIJudgeBackend   any OpenAI-compatible chat endpoint (the shared client,
                       rag.generation.endpoint); the prompt asks for a JSON verdict
                       {"winner": "A" | "B" | "tie", "reason": "..."}.

Calls and tokens are counted per backend and summed in `PairwiseJudge.usage`.

Reference-guided judging: `compare(..., reference="gold answer")` (or a 5-tuple item in
`compare_batch`) shows the backend a reference answer as well, for labelling preference pairs
where gold exists (training questions). Only a backend with `accepts_reference = True` takes
one (`rag.metrics.pairwise_judge`'s chat and log-prob backends); any other raises ConfigError
instead of judging without it.
"""

from __future__ import annotations

import json
import math
import re
import threading
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Literal, Protocol

from rag.errors import ConfigError
from rag.generation.prompts import MAX_CONTEXT_CHARS
from rag.types import Answer, Context

__all__ = ["Verdict", "SlotVerdict", "JudgeResult", "JudgeBackend", "PairwiseJudge",
           "MetricJudgeBackend", "LocalLMJudgeBackend", "OpenAIJudgeBackend", "judge_prompt",
           "parse_verdict", "metric_reward"]

Verdict = Literal["A", "B", "tie"]
SlotVerdict = Literal["first", "second", "tie"]

JUDGE_SYSTEM = ("You compare two answers to a question. The better answer is correct, "
                "supported by the passages, and answers what was asked.")


@dataclass(frozen=True)
class SlotResult:
    """One backend call: which slot won, a signed confidence (> 0 favours the first slot) and
    its cost."""

    verdict: SlotVerdict
    margin: float = 0.0
    calls: int = 1
    tokens_in: int = 0
    tokens_out: int = 0


class JudgeBackend(Protocol):
    name: str

    def judge_batch(self, items: Sequence[tuple[str, Sequence[Context], str, str]]
                    ) -> list[SlotResult]:
        """(question, contexts, first answer, second answer[, reference answer]) -> slot
        verdicts; the fifth element only for a backend with `accepts_reference = True`."""
        ...


@dataclass(frozen=True)
class JudgeResult:
    winner: Verdict          # after the order swap; "tie" when the two orders disagree
    forward: Verdict         # A shown first
    backward: Verdict        # B shown first (mapped back to A/B)
    flipped: bool            # forward != backward
    margin: float            # mean signed margin in favour of A over both orders

    def to_dict(self) -> dict:
        return {"winner": self.winner, "forward": self.forward, "backward": self.backward,
                "flipped": self.flipped, "margin": self.margin}


def _to_ab(v: SlotVerdict, a_first: bool) -> Verdict:
    if v == "tie":
        return "tie"
    return "A" if (v == "first") == a_first else "B"


class PairwiseJudge:
    """Order-swapped pairwise comparisons (module docstring). `swap=False` asks once (A first)
    and reports that verdict; only for measuring what the swap buys."""

    def __init__(self, backend: JudgeBackend, swap: bool = True):
        self.backend = backend
        self.swap = swap
        self._lock = threading.Lock()
        self._usage = {"pairs": 0, "calls": 0, "tokens_in": 0, "tokens_out": 0, "flips": 0,
                       "ties": 0, "first_slot_wins_both": 0, "second_slot_wins_both": 0}

    def compare(self, question: str, contexts: Sequence[Context], answer_a: str,
                answer_b: str, reference: str | None = None) -> JudgeResult:
        """`reference`: a gold answer shown to the judge (module docstring)."""
        item = (question, contexts, answer_a, answer_b)
        return self.compare_batch([item if reference is None else (*item, reference)])[0]

    def compare_answers(self, a: Answer, b: Answer) -> JudgeResult:
        """Two `Answer` records to the same question; the contexts shown are the union of
        both answers' contexts (A's first), so neither answer is judged on the other's
        evidence only."""
        if a.question != b.question:
            raise ConfigError("answer_b.question", "both answers must answer the same question")
        seen, ctx = set(), []
        for c in (*a.contexts, *b.contexts):
            if c.id not in seen:
                seen.add(c.id)
                ctx.append(c)
        return self.compare(a.question, ctx, a.text, b.text)

    def compare_batch(self, items: Sequence[tuple[str, Sequence[Context], str, str]]
                      ) -> list[JudgeResult]:
        items = list(items)
        for n, it in enumerate(items):
            if len(it) not in (4, 5) or not isinstance(it[0], str):
                raise ConfigError(f"items[{n}]", "expected (question, contexts, answer_a, "
                                                 "answer_b[, reference])")
            if len(it) == 5:
                if not isinstance(it[4], str) or not it[4].strip():
                    raise ConfigError(f"items[{n}].reference", "must be a non-empty string")
                if not getattr(self.backend, "accepts_reference", False):
                    raise ConfigError("reference", f"judge backend "
                                      f"{getattr(self.backend, 'name', '?')!r} cannot use a "
                                      "reference answer")
        fwd = self.backend.judge_batch(items)
        bwd = (self.backend.judge_batch([(q, c, b, a, *ref) for q, c, a, b, *ref in items])
               if self.swap else fwd)
        out = []
        with self._lock:
            for f, b in zip(fwd, bwd, strict=True):
                vf, vb = _to_ab(f.verdict, True), _to_ab(b.verdict, not self.swap)
                winner: Verdict = vf if vf == vb else "tie"
                flipped = vf != vb
                margin = (f.margin - b.margin) / 2 if self.swap else f.margin
                u = self._usage
                u["pairs"] += 1
                u["flips"] += flipped
                u["ties"] += winner == "tie"
                if self.swap and f.verdict == b.verdict == "first":
                    u["first_slot_wins_both"] += 1
                if self.swap and f.verdict == b.verdict == "second":
                    u["second_slot_wins_both"] += 1
                for r in ((f, b) if self.swap else (f,)):
                    u["calls"] += r.calls
                    u["tokens_in"] += r.tokens_in
                    u["tokens_out"] += r.tokens_out
                out.append(JudgeResult(winner, vf, vb, flipped, float(margin)))
        return out

    @property
    def usage(self) -> dict[str, float]:
        """pairs, backend calls, tokens in/out, flips (verdict changed with the order), ties,
        position_bias_rate = flips / pairs, and how often the same slot won in both orders."""
        with self._lock:
            u = dict(self._usage)
        u["position_bias_rate"] = u["flips"] / u["pairs"] if u["pairs"] else 0.0
        return u


# ---- metric backend ------------------------------------------------------------------------
def metric_reward(row: dict[str, float], faithfulness_weight: float = 0.5,
                  missing_faithfulness: float = 0.5) -> float:
    """Reward of one QualityScorer row: w * faithfulness + (1 - w) * answer_relevancy.
    Faithfulness is missing for an abstention or a bare yes/no (nothing checkable): it counts
    `missing_faithfulness` (0.5: neither supported nor fabricated); so an abstention (relevancy
    0 -> 0.25) beats a fabricated answer (faithfulness 0) of relevancy < 0.5 and loses to a
    supported on-topic one."""
    f = row.get("faithfulness", missing_faithfulness)
    r = row.get("answer_relevancy", 0.0)
    return faithfulness_weight * f + (1 - faithfulness_weight) * r


class MetricJudgeBackend:
    """The QualityScorer as a judge (module docstring). `scorer`: a QualityScorer (default: a
    new one with the packaged MiniLM). A call = one answer scored (result cache hits count)."""

    name = "metric"

    def __init__(self, scorer=None, faithfulness_weight: float = 0.5, tie_margin: float = 0.02):
        if not 0.0 <= faithfulness_weight <= 1.0:
            raise ConfigError("faithfulness_weight", "must lie in [0, 1]")
        if tie_margin < 0:
            raise ConfigError("tie_margin", "must be >= 0")
        if scorer is None:
            from rag.metrics.quality import QualityScorer

            scorer = QualityScorer()
        self.scorer = scorer
        self.w = faithfulness_weight
        self.tie_margin = tie_margin

    def rewards(self, items: Sequence[tuple[str, Sequence[Context], str]]) -> list[float]:
        """(question, contexts, answer) -> metric reward, one scorer batch."""
        answers = [Answer("judge", q, t, (), tuple(c), (), {}, 0, 0, "judge")
                   for q, c, t in items]
        rows = self.scorer.score_batch(answers)
        return [metric_reward(r, self.w) for r in rows]

    def judge_batch(self, items):
        flat = [(q, c, x) for q, c, a, b in items for x in (a, b)]
        r = self.rewards(flat)
        out = []
        for i in range(len(items)):
            d = r[2 * i] - r[2 * i + 1]
            v: SlotVerdict = "tie" if abs(d) < self.tie_margin else ("first" if d > 0
                                                                    else "second")
            out.append(SlotResult(v, d, calls=2))
        return out


# ---- prompt shared by the LLM backends -----------------------------------------------------
def judge_prompt(question: str, contexts: Sequence[Context], first: str, second: str,
                 json_verdict: bool) -> list[dict[str, str]]:
    """Chat messages asking which of two answers (shown as A, then B) is better."""
    passages = "\n".join(f"[{i}] {c.title}: {c.text[:MAX_CONTEXT_CHARS]}"
                         for i, c in enumerate(contexts, 1))
    ask = ('Reply with JSON only: {"winner": "A" or "B" or "tie", "reason": "<one sentence>"}.'
           if json_verdict else "Reply with the letter of the better answer, A or B.")
    user = (f"Passages:\n{passages}\n\nQuestion: {question}\n\nAnswer A: {first}\n\n"
            f"Answer B: {second}\n\nWhich answer is better? {ask}")
    return [{"role": "system", "content": JUDGE_SYSTEM}, {"role": "user", "content": user}]


_WINNER = re.compile(r'"?winner"?\s*[:=]\s*"?\s*(A|B|tie)\b', re.I)


def parse_verdict(raw: str) -> SlotVerdict | None:
    """The slot named by a JSON verdict ({"winner": "A"}), tolerating code fences and text
    around the object; None when no verdict can be read."""
    m = re.search(r"\{.*?\}", raw or "", re.S)
    if m:
        try:
            w = str(json.loads(m.group(0)).get("winner", "")).strip().lower()
        except (ValueError, AttributeError):
            w = ""
        if w in ("a", "b", "tie"):
            return {"a": "first", "b": "second", "tie": "tie"}[w]  # type: ignore[return-value]
    m = _WINNER.search(raw or "")
    if m:
        return {"a": "first", "b": "second", "tie": "tie"}[m.group(1).lower()]  # type: ignore
    return None


# ---- OpenAI-compatible endpoint ------------------------------------------------------------
class OpenAIJudgeBackend:
    """A chat endpoint as judge; temperature 0. An unreadable reply counts as a tie and is
    counted in `parse_failures`. Requests go through `rag.generation.endpoint.ChatEndpoint`
    (validated URL, auth header, timeout, retries with backoff on 429/5xx honouring
    Retry-After, a concurrency limit)."""

    name = "openai"

    def __init__(self, base_url: str, model: str, api_key: str | None = None,
                 timeout: float = 60.0, max_tokens: int = 96, max_retries: int = 4,
                 max_concurrency: int = 4):
        from rag.generation.endpoint import ChatEndpoint

        self.endpoint = ChatEndpoint(base_url, model, api_key=api_key, timeout_s=timeout,
                                     max_retries=max_retries, max_concurrency=max_concurrency,
                                     where="judge endpoint")
        self.model = model
        self.max_tokens = max_tokens
        self.parse_failures = 0
        self.url = self.endpoint.chat_url

    def _chat(self, messages: list[dict[str, str]]) -> tuple[str, int, int]:
        r = self.endpoint.chat(messages, max_tokens=self.max_tokens, temperature=0.0)
        return r.text, r.prompt_tokens, r.completion_tokens or len(r.text.split())

    def judge_batch(self, items):
        out = []
        for q, c, a, b in items:
            raw, t_in, t_out = self._chat(judge_prompt(q, c, a, b, json_verdict=True))
            v = parse_verdict(raw)
            if v is None:
                self.parse_failures += 1
                v = "tie"
            out.append(SlotResult(v, {"first": 1.0, "second": -1.0, "tie": 0.0}[v], 1,
                                  t_in, t_out))
        return out


# ---- local causal LM -----------------------------------------------------------------------
@dataclass
class LocalLMJudgeBackend:
    """Verdict from one forward pass of a local causal LM: after the judging prompt and the
    assistant prefix "The better answer is", compare log p(" A") and log p(" B"); a gap below
    `tie_margin` nats is a tie. `generator`: a loaded `TransformersGenerator` (or a registry
    name, loaded here). No decoding, so it is deterministic and ~1 forward pass per call."""

    generator: object = "smollm2-135m-instruct"
    tie_margin: float = 0.0
    batch_size: int = 4
    name: str = field(default="local-lm", init=False)

    def __post_init__(self):
        if isinstance(self.generator, str):
            from rag.generation.factory import make_generator

            self.generator = make_generator(self.generator)
        tok = getattr(self.generator, "tokenizer", None)
        if tok is None or not hasattr(self.generator, "model"):
            raise ConfigError("generator", "the local judge needs a transformers generator "
                                           "(tokenizer + model), e.g. smollm2-135m-instruct")
        self._ids = []
        for letter in ("A", "B"):
            ids = tok(f" {letter}", add_special_tokens=False)["input_ids"]
            self._ids.append(ids[-1])
        if self._ids[0] == self._ids[1]:
            raise ConfigError("generator", "tokenizer maps A and B to the same token")

    def _prompt(self, q, c, a, b) -> str:
        tok = self.generator.tokenizer
        msgs = judge_prompt(q, c, a, b, json_verdict=False)
        if getattr(tok, "chat_template", None):
            text = tok.apply_chat_template(msgs, tokenize=False, add_generation_prompt=True)
        else:
            text = "\n\n".join(m["content"] for m in msgs) + "\n"
        return text + "The better answer is"

    def judge_batch(self, items):
        import torch

        gen = self.generator
        tok, model = gen.tokenizer, gen.model
        prompts = [self._prompt(*it) for it in items]
        out: list[SlotResult] = []
        for s in range(0, len(prompts), self.batch_size):
            part = prompts[s:s + self.batch_size]
            enc = tok(part, return_tensors="pt", padding=True, add_special_tokens=False,
                      return_token_type_ids=False).to(model.device)
            with torch.inference_mode():
                logits = model(**enc).logits[:, -1, :].float()  # left padding: last = next
            logp = torch.log_softmax(logits, dim=-1)
            for j in range(len(part)):
                d = float(logp[j, self._ids[0]] - logp[j, self._ids[1]])
                if not math.isfinite(d):
                    d = 0.0
                v: SlotVerdict = "tie" if abs(d) <= self.tie_margin else (
                    "first" if d > 0 else "second")
                out.append(SlotResult(v, d, 1, int(enc["attention_mask"][j].sum()), 0))
        return out
