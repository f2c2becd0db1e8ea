"""Cost accounting for quality judges: counting what a run spent, and projecting what a run will
spend before it starts (`ragpilot eval --dry-run`).

Two kinds of judge, two units:

* the local `QualityScorer` spends **encoder forward passes** (MiniLM, 2 texts per pass) on
  **texts** (claims, context sentences, questions) of some **tokens** (word pieces);
* an LLM judge (`ragas` behind `rag.metrics.ragas_adapter`) spends **calls** to an
  OpenAI-compatible endpoint with **prompt_tokens** and **completion_tokens**.

`UsageMeter` counts the second kind per metric while a run happens (the first kind is counted by
`QualityScorer.usage`). `project_local` predicts the local scorer's bill exactly by running the
scorer's own planning and batching with a tokenizer-only stand-in encoder (no forward pass);
`project_ragas` predicts ragas' calls exactly from its per-metric call pattern and its tokens by
rendering the prompts ragas would send. Token counts of LLM prompts use `count_tokens` (words and
punctuation marks, a stand-in for the endpoint's BPE that needs no download: tiktoken fetches its
files from the network on first use); an endpoint's own `usage` numbers win when it returns them.
"""

from __future__ import annotations

import json
import re
import threading
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Any

import numpy as np

from rag.types import Answer, Example

__all__ = ["METRICS", "UsageMeter", "count_tokens", "project_local", "project_ragas",
           "ragas_calls_per_sample", "judge_inputs", "stand_in_answers", "project_eval",
           "format_projection"]

METRICS = ("faithfulness", "answer_relevancy", "context_precision", "context_recall")
_TOKEN = re.compile(r"\w+|[^\w\s]", re.UNICODE)
_COUNTERS = ("requests", "calls", "cache_hits", "failures", "prompt_tokens",
             "completion_tokens", "embedded_texts")


def count_tokens(text: str) -> int:
    """Approximate LLM tokens: words plus punctuation marks (~1.1x OpenAI's BPE count on English
    prose, more on JSON). Deterministic and offline; the rule-based server counts the same way."""
    return len(_TOKEN.findall(text or ""))


# ---- counting during a run -----------------------------------------------------------------
@dataclass
class UsageMeter:
    """Thread-safe per-metric counters of an LLM judge.

    `requests`: completions the metric asked for; `calls`: HTTP requests actually sent (fewer
    when a cached or in-flight identical prompt answered it: `cache_hits`); `failures`: replies
    that could not be parsed into the expected schema; tokens as reported by the endpoint
    (`count_tokens` when it reports none); `embedded_texts`: texts sent to the local encoder
    (answer relevancy); `seconds`: wall time spent waiting on the endpoint.
    """

    _data: dict[str, dict[str, float]] = field(default_factory=dict)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def add(self, metric: str, **counts: float) -> None:
        with self._lock:
            row = self._data.setdefault(metric, {k: 0 for k in (*_COUNTERS, "seconds")})
            for k, v in counts.items():
                if k not in row:
                    raise KeyError(f"unknown usage counter {k!r}")
                row[k] += v

    def snapshot(self) -> dict[str, dict[str, float]]:
        """Per metric counters plus `total` (sums over metrics)."""
        with self._lock:
            per = {m: dict(r) for m, r in self._data.items()}
        total = {k: sum(r[k] for r in per.values()) for k in (*_COUNTERS, "seconds")}
        total["seconds"] = round(total["seconds"], 6)
        return {**per, "total": total}

    def reset(self) -> None:
        with self._lock:
            self._data.clear()


# ---- what a judge reads ------------------------------------------------------------------
@dataclass(frozen=True)
class JudgeInputs:
    """The strings an LLM judge sees for one answer (ragas' single-turn sample)."""

    user_input: str
    response: str
    retrieved_contexts: tuple[str, ...]
    reference: str | None


def _context_text(title: str, text: str) -> str:
    return f"{title}: {text}" if title and not text.startswith(title) else text


def judge_inputs(answer: Answer, example: Example | None = None,
                 contexts: str = "all") -> JudgeInputs:
    """Answer + example -> ragas inputs: citations stripped from the response, contexts as
    "title: text" (all retrieved ones, or only the cited ones with `contexts="cited"`), the
    first gold answer as the reference."""
    from rag.metrics.claims import strip_citations

    ctx = answer.contexts
    if contexts == "cited":
        n = len(ctx)
        cited = sorted({i for i in answer.citations if 1 <= i <= n})
        ctx = tuple(ctx[i - 1] for i in cited) if cited else ctx
    question = answer.question or (example.question if example else "")
    ref = example.answers[0] if example and example.answers else None
    return JudgeInputs(question, strip_citations(answer.text).strip(),
                       tuple(_context_text(c.title, c.text) for c in ctx), ref)


# ---- projection: ragas ---------------------------------------------------------------------
def ragas_calls_per_sample(n_contexts: int, has_reference: bool, strictness: int = 3,
                           dedupe: bool = True) -> dict[str, int]:
    """HTTP calls ragas' collections metrics make for one sample: faithfulness 2 (statements,
    then one NLI verdict call), answer relevancy `strictness` question generations (1 when
    identical prompts are deduplicated, as the adapter does at temperature 0), context precision
    one verdict per context (with the reference, else against the response), context recall 1
    (only with a reference). An abstention makes no statements: faithfulness stops at 1."""
    return {"faithfulness": 2 if n_contexts else 0,
            "answer_relevancy": 1 if dedupe else strictness,
            "context_precision": n_contexts,
            "context_recall": 1 if (has_reference and n_contexts) else 0}


_REASON = " ".join(["word"] * 12)  # a typical judge's reason: ~12 tokens


@lru_cache(maxsize=1)
def _ragas_prompts() -> dict[str, Any] | None:
    try:
        from rag.env import configure_runtime_env

        configure_runtime_env()
        from ragas.metrics.collections.answer_relevancy.util import (
            AnswerRelevanceInput,
            AnswerRelevancePrompt,
        )
        from ragas.metrics.collections.context_precision.util import (
            ContextPrecisionInput,
            ContextPrecisionPrompt,
        )
        from ragas.metrics.collections.context_recall.util import (
            ContextRecallInput,
            ContextRecallPrompt,
        )
        from ragas.metrics.collections.faithfulness.util import (
            NLIStatementInput,
            NLIStatementPrompt,
            StatementGeneratorInput,
            StatementGeneratorPrompt,
        )
    except ImportError:
        return None
    return {
        "statements": lambda q, a: StatementGeneratorPrompt().to_string(
            StatementGeneratorInput(question=q, answer=a)),
        "nli": lambda c, s: NLIStatementPrompt().to_string(
            NLIStatementInput(context=c, statements=list(s))),
        "relevance": lambda r: AnswerRelevancePrompt().to_string(AnswerRelevanceInput(response=r)),
        "precision": lambda q, c, a: ContextPrecisionPrompt().to_string(
            ContextPrecisionInput(question=q, context=c, answer=a)),
        "recall": lambda q, c, a: ContextRecallPrompt().to_string(
            ContextRecallInput(question=q, context=c, answer=a)),
    }


# Prompt templates' own size (rendered with empty inputs) when ragas is not installed.
_TEMPLATE_TOKENS = {"statements": 205, "nli": 330, "relevance": 190, "precision": 560,
                    "recall": 470}


def _prompt_tokens(kind: str, *args: Any) -> int:
    prompts = _ragas_prompts()
    if prompts is not None:
        return count_tokens(prompts[kind](*args))
    flat = [a for x in args for a in ([x] if isinstance(x, str) else x)]
    return _TEMPLATE_TOKENS[kind] + sum(count_tokens(a) + 3 for a in flat)


def project_ragas(samples: Iterable[JudgeInputs], strictness: int = 3,
                  dedupe: bool = True) -> dict[str, dict[str, float]]:
    """Projected calls and tokens per metric of scoring `samples` with ragas through the adapter
    (cold cache). Calls are exact for ragas 0.4.3's collections metrics (a statement-less answer
    makes one faithfulness call fewer; an abstention is assumed to make none). Prompt tokens render ragas' own prompts; the NLI prompt
    assumes the judge returns one statement per answer sentence. Completion tokens assume one
    ~12-token reason per verdict: an estimate; real judges often write longer reasons."""
    from rag.metrics.claims import is_noncommittal, split_sentences

    out = {m: {"calls": 0.0, "prompt_tokens": 0.0, "completion_tokens": 0.0, "samples": 0.0}
           for m in METRICS}
    n_calls_ar = 1 if dedupe else strictness

    def add(m: str, calls: int, prompt: int, completion: int) -> None:
        out[m]["calls"] += calls
        out[m]["prompt_tokens"] += prompt
        out[m]["completion_tokens"] += completion

    for s in samples:
        if not (s.user_input and s.response):
            continue
        ctx = list(s.retrieved_contexts)
        joined = "\n".join(ctx)
        sents: list[str] = []
        if ctx:
            out["faithfulness"]["samples"] += 1
            sents = [] if is_noncommittal(s.response) else (split_sentences(s.response)
                                                             or [s.response])
            add("faithfulness", 1, _prompt_tokens("statements", s.user_input, s.response),
                count_tokens(json.dumps({"statements": sents})))
        if ctx and sents:  # no statements (an abstention): ragas stops after the first call
            add("faithfulness", 1, _prompt_tokens("nli", joined, sents),
                count_tokens(json.dumps({"statements": [
                    {"statement": x, "reason": _REASON, "verdict": 1} for x in sents]})))
        out["answer_relevancy"]["samples"] += 1
        add("answer_relevancy", n_calls_ar, n_calls_ar * _prompt_tokens("relevance", s.response),
            n_calls_ar * count_tokens(json.dumps({"question": s.user_input,
                                                  "noncommittal": 0})))
        if ctx:
            out["context_precision"]["samples"] += 1
            against = s.reference or s.response
            for c in ctx:
                add("context_precision", 1, _prompt_tokens("precision", s.user_input, c, against),
                    count_tokens(json.dumps({"reason": _REASON, "verdict": 1})))
        if ctx and s.reference:
            out["context_recall"]["samples"] += 1
            ref_sents = split_sentences(s.reference) or [s.reference]
            add("context_recall", 1, _prompt_tokens("recall", s.user_input, joined, s.reference),
                count_tokens(json.dumps({"classifications": [
                    {"statement": x, "reason": _REASON, "attributed": 1} for x in ref_sents]})))
    return _with_total(out, ("calls", "prompt_tokens", "completion_tokens"))


# ---- projection: the local scorer ----------------------------------------------------------
class _TokenizerOnlyEncoder:
    """Stands in for `rag.encoders.Encoder` in a projection: the real tokenizer (so texts are
    grouped and counted exactly as the scorer's `Embedder` does), zero vectors, no model."""

    def __init__(self, tokenizer, max_seq_length: int = 256, dim: int = 384,
                 name: str = "minilm"):
        self.name = name
        self.dim = dim
        self.calls = 0  # texts, as Encoder.calls
        self.invocations = 0  # encode() calls = forward passes
        self.model = type("_Model", (), {"tokenizer": tokenizer,
                                         "max_seq_length": max_seq_length})()

    def encode(self, texts: Sequence[str], batch_size: int = 64, **_: Any) -> np.ndarray:
        self.calls += len(texts)
        self.invocations += 1
        return np.zeros((len(texts), self.dim), dtype=np.float32)


@lru_cache(maxsize=4)
def _encoder_tokenizer(name: str = "minilm"):
    from transformers import AutoTokenizer

    from rag.models import default_registry

    path = default_registry().get(name).resolve()
    max_len = 256
    cfg = path / "sentence_bert_config.json"
    if cfg.exists():
        max_len = int(json.loads(cfg.read_text()).get("max_seq_length", max_len))
    return AutoTokenizer.from_pretrained(str(path)), max_len


def project_local(answers: Sequence[Answer], examples: Sequence[Example | None] | None = None,
                  encoder_name: str = "minilm", tokenizer=None,
                  **scorer_kwargs: Any) -> dict[str, dict[str, float]]:
    """Encoder forward passes, texts and tokens per metric that `QualityScorer` will spend on
    these answers (one cold `score_batch`). Exact: it runs the scorer's own claim extraction,
    pruning, de-duplication and fixed-shape batching with the encoder's tokenizer and no model;
    only a `question_generator`'s calls are not included. Loads the tokenizer (< 1 s), never
    the weights."""
    from rag.metrics.quality import QualityScorer

    if tokenizer is None:
        tokenizer, max_len = _encoder_tokenizer(encoder_name)
    else:
        max_len = 256
    enc = _TokenizerOnlyEncoder(tokenizer, max_len, name=encoder_name)
    scorer = QualityScorer(enc, encoder_name=encoder_name, cache_results=False, **scorer_kwargs)
    scorer.score_batch(answers, examples)
    usage = scorer.usage
    out: dict[str, dict[str, float]] = {}
    for m in METRICS:
        u = usage.get(m, {})
        out[m] = {"forward_passes": float(u.get("encoder_calls", 0)),
                  "texts": float(u.get("texts", 0)), "tokens": float(u.get("tokens", 0))}
    res = _with_total(out, ("forward_passes", "texts", "tokens"))
    # a pass carrying texts of two metrics counts for both above; the total counts it once
    res["total"]["forward_passes"] = float(enc.invocations)
    return res


def _with_total(per: Mapping[str, dict[str, float]],
                keys: Sequence[str]) -> dict[str, dict[str, float]]:
    total = {k: float(sum(r.get(k, 0.0) for r in per.values())) for k in keys}
    return {**{m: dict(r) for m, r in per.items()}, "total": total}


# ---- projection of a whole `ragpilot eval` run ---------------------------------------------
def stand_in_answers(examples: Sequence[Example], corpus, k: int, seed: int = 0,
                     config_hash: str = "dry-run") -> list[Answer]:
    """What the judges will read, guessed without retrieval or generation: each example's gold
    passages first, then passages drawn at random (seeded) from the corpus up to `k`; the
    answer is the first gold answer (the first sentence of the first context when there is
    none), citing the gold passages."""
    from rag.metrics.claims import split_sentences
    from rag.types import Context

    ids = list(corpus.ids)
    rng = np.random.default_rng(seed)
    out = []
    for e in examples:
        gold = [d for d, g in e.qrels.items() if g > 0] if e.qrels else list(e.gold_passage_ids)
        chosen = [d for d in dict.fromkeys(gold) if d in corpus][:k]
        while len(chosen) < min(k, len(ids)):
            d = ids[int(rng.integers(len(ids)))]
            if d not in chosen:
                chosen.append(d)
        ctx = tuple(Context(d, corpus[d].title, corpus[d].text) for d in chosen)
        n_gold = sum(d in set(gold) for d in chosen)
        text = e.answers[0] if e.answers else (
            (split_sentences(ctx[0].text) or [ctx[0].text])[0] if ctx else "")
        out.append(Answer(e.id, e.question, text, tuple(range(1, n_gold + 1)), ctx, (), {},
                          0, 0, config_hash))
    return out


def project_eval(config, examples: Sequence[Example], corpus, *, strictness: int = 3,
                 dedupe: bool = True, seed: int = 0, local: bool = True) -> dict[str, Any]:
    """The bill of a `ragpilot eval` run before it starts: generator calls and tokens (prompt
    rendered with the stand-in contexts; completion at most `max_new_tokens`), the local
    scorer's encoder work per metric, and ragas' calls and tokens per metric through the
    adapter. Nothing is retrieved, generated or scored."""
    from rag.generation.prompts import get_prompt

    answers = stand_in_answers(examples, corpus, config.k, seed, config.config_hash)
    n = len(answers)
    llm_gen = config.generator != "extractive"
    tpl = get_prompt(config.prompt_id)
    gen_prompt = sum(count_tokens(" ".join(m["content"] for m in tpl.messages(a.question,
                                                                              a.contexts)))
                     for a in answers)
    out: dict[str, Any] = {
        "examples": n, "k": config.k, "config_hash": config.config_hash,
        "generator": {"name": config.generator, "calls": n if llm_gen else 0,
                      "prompt_tokens": gen_prompt if llm_gen else 0,
                      "completion_tokens_max": n * config.max_new_tokens if llm_gen else 0},
    }
    if local:
        out["local"] = project_local(answers, examples)
    ragas = project_ragas([judge_inputs(a, e) for a, e in zip(answers, examples, strict=True)],
                          strictness=strictness, dedupe=dedupe)
    for m in METRICS:
        r = ragas[m]
        r["calls_per_sample"] = r["calls"] / r["samples"] if r["samples"] else 0.0
    ragas["total"]["calls_per_sample"] = ragas["total"]["calls"] / n if n else 0.0
    out["ragas"] = ragas
    out["ragas_settings"] = {"strictness": strictness, "dedupe": dedupe}
    return out


def format_projection(p: Mapping[str, Any]) -> str:
    """The dry-run table printed by `ragpilot eval --dry-run`."""
    g = p["generator"]
    lines = [f"generator {g['name']}: {g['calls']} calls, {g['prompt_tokens']} prompt tokens, "
             f"<= {g['completion_tokens_max']} completion tokens"]
    if "local" in p:
        lines += ["", "judge local (QualityScorer, MiniLM; 2 texts per forward pass):",
                  f"  {'metric':<20}{'forward_passes':>16}{'texts':>10}{'tokens':>10}"]
        for m, r in p["local"].items():
            lines.append(f"  {m:<20}{r['forward_passes']:>16.0f}{r['texts']:>10.0f}"
                         f"{r['tokens']:>10.0f}")
    rs = p.get("ragas_settings", {})
    how = ("identical prompts answered once" if rs.get("dedupe", True)
           else f"{rs.get('strictness', 3)} questions per answer")
    lines += ["", f"judge ragas (OpenAI-compatible endpoint via rag.metrics.ragas_adapter; "
                  f"answer relevancy: {how}):",
              f"  {'metric':<20}{'calls':>8}{'calls/sample':>14}{'prompt_tokens':>15}"
              f"{'completion_tokens':>19}"]
    for m, r in p["ragas"].items():
        lines.append(f"  {m:<20}{r['calls']:>8.0f}{r['calls_per_sample']:>14.2f}"
                     f"{r['prompt_tokens']:>15.0f}{r['completion_tokens']:>19.0f}")
    return "\n".join(lines)
