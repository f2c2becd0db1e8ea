"""The real `ragas` (0.4.3) behind the same interface as `rag.metrics.quality.QualityScorer`.

When an OpenAI-compatible endpoint is configured, `RagasScorer.score_batch(answers, examples)`
scores each answer with ragas' own collections metrics — `Faithfulness`, `AnswerRelevancy`,
`ContextPrecisionWithReference` (`...WithoutReference` when the example has no reference answer)
and `ContextRecall` — and returns rows with the same keys, ranges and "left out when it cannot
be computed" rule as the local scorer, so either can feed the tuner or a benchmark.

What makes it run offline and reproducibly:
* the judge is a small `InstructorBaseRagasLLM` that POSTs ragas' prompts to
  `<base_url>/v1/chat/completions` through the shared endpoint client
  (`rag.generation.endpoint`: timeouts, retries with backoff on 429/5xx honouring
  Retry-After, `max_concurrency` requests in flight; temperature 0, fixed seed, JSON mode) and
  validates the reply with ragas' own pydantic output model; no `instructor`, no tiktoken (whose BPE files are downloaded on first use: ragas needs them only for testset
  generation, langchain's ChatOpenAI for token counting — neither path is used here);
* the embeddings (answer relevancy) are the packaged MiniLM (`rag.encoders.Encoder`), not an
  embedding API;
* `RAGAS_DO_NOT_TRACK=true` is set before ragas is imported (its analytics call home);
* replies are cached on disk by content hash (`rag.metrics.judge_cache`) and identical
  in-flight prompts share one call, so a re-run replays the same verdicts with zero calls;
* every request, HTTP call, cache hit, parse failure and token is counted per metric
  (`usage`, `rag.metrics.cost.UsageMeter`).

Configuration: a mapping (`ragas:` in YAML) and/or the environment — `RAGPILOT_RAGAS_BASE_URL`,
`RAGPILOT_RAGAS_MODEL`, `RAGPILOT_RAGAS_API_KEY`; a missing or bad key raises `ConfigError`
naming it, an unreachable endpoint `EndpointError`. A local endpoint for tests and air-gapped
use: `python -m tests.support.llm_server` (rule-based judge). Differences from ragas' own `evaluate()`:
docs/quality.md.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextvars
import json
import math
import os
import threading
import time
from collections.abc import Mapping, Sequence
from typing import Any, Literal

from pydantic import BaseModel, Field, ValidationError

from rag.errors import ConfigError, RagError
from rag.generation.endpoint import AsyncChat, ChatEndpoint, EndpointError
from rag.metrics.cost import METRICS, JudgeInputs, UsageMeter, count_tokens, judge_inputs
from rag.metrics.judge_cache import JudgeCache, content_key
from rag.settings_base import StrictSettings
from rag.types import Answer, Example

__all__ = ["RagasConfig", "RagasScorer", "RagasNotInstalled", "JudgeOutputError",
           "EndpointError", "ENV_PREFIX"]

ENV_PREFIX = "RAGPILOT_RAGAS_"
_ENV_KEYS = ("base_url", "model", "api_key")
_METRIC: contextvars.ContextVar[str] = contextvars.ContextVar("ragas_metric", default="other")
_RETRY_SUFFIX = ("\n\nYour previous reply was not a JSON object matching the schema above. "
                 "Reply with that JSON object only.")


class RagasNotInstalled(RagError):
    """`ragas` (or its pinned langchain-community) is not importable."""


class JudgeOutputError(RagError):
    """The endpoint's reply did not parse into ragas' output schema, after retries."""


class RagasConfig(StrictSettings):
    """Where the judge is and how to call it. `base_url` and `model` are required."""

    SECTION = "ragas"

    base_url: str
    """OpenAI-compatible endpoint, e.g. http://127.0.0.1:8011/v1 (the /v1 is optional)."""
    model: str = Field(min_length=1)
    api_key: str | None = None
    timeout_s: float = Field(60.0, gt=0, le=3600)
    strictness: int = Field(3, ge=1, le=10)
    """Questions ragas generates per answer for answer relevancy."""
    max_concurrency: int = Field(4, ge=1, le=64)
    max_retries: int = Field(1, ge=0, le=5)
    """Extra calls when a reply does not parse; then the metric is left out for that answer."""
    http_retries: int = Field(4, ge=0, le=10)
    """Extra attempts on 429/5xx/timeouts/connection errors (backoff, Retry-After honoured)."""
    max_tokens: int = Field(1024, ge=16, le=32768)
    temperature: float = Field(0.0, ge=0.0, le=2.0)
    seed: int = 0
    json_mode: bool = True
    """Send response_format={"type": "json_object"} (vLLM, llama.cpp, Ollama, OpenAI)."""
    cache: bool = True
    cache_path: str | None = None
    """SQLite file of cached replies (default <ragpilot cache>/judge.sqlite; ":memory:")."""
    contexts: Literal["all", "cited"] = "all"
    """Contexts shown to the judge: all retrieved (ragas) or only the cited ones (ours)."""
    encoder: str = "minilm"

    @classmethod
    def load(cls, data: Mapping[str, Any] | None = None,
             env: Mapping[str, str] | None = None, where: str = "ragas") -> RagasConfig:
        """`data` (e.g. the `ragas:` mapping of a YAML file) over RAGPILOT_RAGAS_* variables.
        Errors name the key: `ragas.base_url: missing ...`."""
        env = os.environ if env is None else env
        if data is not None and not isinstance(data, Mapping):
            raise ConfigError(where, "must be a mapping")
        merged: dict[str, Any] = {k: env[ENV_PREFIX + k.upper()] for k in _ENV_KEYS
                                  if env.get(ENV_PREFIX + k.upper())}
        merged.update(dict(data or {}))
        for key in ("base_url", "model"):
            if not merged.get(key):
                raise ConfigError(f"{where}.{key}", f"missing: set it in the config or "
                                                    f"{ENV_PREFIX}{key.upper()}")
        url = str(merged["base_url"])
        if not url.startswith(("http://", "https://")):
            raise ConfigError(f"{where}.base_url", f"must be an http(s) URL, got {url!r}")
        return cls.from_mapping(merged, where)

    @staticmethod
    def configured(env: Mapping[str, str] | None = None) -> bool:
        """True when the environment names an endpoint and a model."""
        env = os.environ if env is None else env
        return bool(env.get(ENV_PREFIX + "BASE_URL") and env.get(ENV_PREFIX + "MODEL"))

    @property
    def chat_url(self) -> str:
        base = self.base_url.rstrip("/")
        return f"{base}/chat/completions" if base.endswith("/v1") else f"{base}/v1/chat/completions"


def _import_ragas() -> dict[str, Any]:
    from rag.env import configure_runtime_env

    configure_runtime_env()
    os.environ.setdefault("RAGAS_DO_NOT_TRACK", "true")
    try:
        from ragas.embeddings import base as emb_base
        from ragas.llms import base as llm_base
        from ragas.metrics import collections as col
    except ImportError as exc:
        raise RagasNotInstalled(
            f"ragas is not importable ({exc}); install the extra: pip install "
            "'ragpilot[ragas]' (ragas==0.4.3 with langchain-community==0.4.1)") from None
    return {"BaseRagasEmbedding": emb_base.BaseRagasEmbedding,
            "InstructorBaseRagasLLM": llm_base.InstructorBaseRagasLLM,
            **{n: getattr(col, n) for n in ("Faithfulness", "AnswerRelevancy", "ContextRecall",
                                            "ContextPrecisionWithReference",
                                            "ContextPrecisionWithoutReference")}}


def _parse_json(text: str) -> Any:
    """The first JSON object in `text` (tolerates ``` fences and chatter around it)."""
    start = text.find("{")
    if start < 0:
        raise ValueError("no JSON object in the reply")
    obj, _ = json.JSONDecoder().raw_decode(text[start:])
    return obj


class _Judge:
    """HTTP side of the judge: cache, single-flight, retries, accounting. One per scorer."""

    def __init__(self, cfg: RagasConfig, meter: UsageMeter, cache: JudgeCache | None):
        self.cfg, self.meter, self.cache = cfg, meter, cache
        self.endpoint = ChatEndpoint(cfg.base_url, cfg.model, api_key=cfg.api_key,
                                     timeout_s=cfg.timeout_s, max_retries=cfg.http_retries,
                                     max_concurrency=cfg.max_concurrency,
                                     where="ragas.base_url")
        self.session: AsyncChat | None = None  # set for the duration of one scoring run
        self.inflight: dict[str, asyncio.Future] = {}

    def key(self, prompt: str, schema: str) -> str:
        c = self.cfg
        return content_key("ragas-judge/1", c.chat_url, c.model, c.temperature, c.seed,
                           c.max_tokens, c.json_mode, schema, prompt)

    async def complete(self, prompt: str, response_model: type[BaseModel]) -> BaseModel:
        metric = _METRIC.get()
        self.meter.add(metric, requests=1)
        key = self.key(prompt, response_model.__name__)
        if self.cache is not None and (hit := self.cache.get(key)) is not None:
            try:
                value = response_model.model_validate(hit)
            except ValidationError:  # stored by another ragas version: call again
                pass
            else:
                self.meter.add(metric, cache_hits=1)
                return value
        if self.cache is None:  # ragas' own behaviour: every request is a call
            return await self._call_with_retries(metric, prompt, response_model)
        # single flight: a duplicate that arrives while the first is under way waits for it,
        # so the number of calls is the number of distinct prompts whatever the timing
        if key in self.inflight:
            self.meter.add(metric, cache_hits=1)
            return response_model.model_validate(await asyncio.shield(self.inflight[key]))
        fut: asyncio.Future = asyncio.get_running_loop().create_future()
        self.inflight[key] = fut
        try:
            value = await self._call_with_retries(metric, prompt, response_model)
        except BaseException as exc:
            fut.set_exception(exc)
            fut.exception()  # mark retrieved: waiters re-raise it themselves
            raise
        finally:
            self.inflight.pop(key, None)
        dumped = value.model_dump(mode="json")
        self.cache.put(key, dumped)
        fut.set_result(dumped)
        return value

    async def _call_with_retries(self, metric: str, prompt: str,
                                 response_model: type[BaseModel]) -> BaseModel:
        last = ""
        for attempt in range(self.cfg.max_retries + 1):
            text = await self._post(metric, prompt + (_RETRY_SUFFIX if attempt else ""))
            try:
                return response_model.model_validate(_parse_json(text))
            except (ValueError, ValidationError) as exc:
                last = str(exc).splitlines()[0]
        self.meter.add(metric, failures=1)
        raise JudgeOutputError(f"{self.cfg.chat_url}: reply does not match "
                               f"{response_model.__name__} ({last})")

    async def _post(self, metric: str, prompt: str) -> str:
        c = self.cfg
        assert self.session is not None
        t0 = time.perf_counter()
        try:
            reply = await self.session.achat([{"role": "user", "content": prompt}],
                                             max_tokens=c.max_tokens, temperature=c.temperature,
                                             seed=c.seed, json_mode=c.json_mode)
        finally:
            self.meter.add(metric, seconds=time.perf_counter() - t0)
        text = reply.text
        self.meter.add(metric, calls=1,
                       prompt_tokens=reply.prompt_tokens or count_tokens(prompt),
                       completion_tokens=reply.completion_tokens or count_tokens(text))
        return text


def _make_llm(base: type, judge: _Judge):
    class EndpointLLM(base):  # type: ignore[misc, valid-type]
        """ragas' structured-output LLM interface over `_Judge`."""

        def generate(self, prompt, response_model):
            return asyncio.run(self.agenerate(prompt, response_model))

        async def agenerate(self, prompt, response_model):
            return await judge.complete(prompt, response_model)

    return EndpointLLM()


def _make_embeddings(base: type, get_encoder, meter: UsageMeter, max_cache: int = 50_000):
    memo: dict[str, list[float]] = {}
    lock = threading.Lock()

    def vectors(texts: list[str]) -> list[list[float]]:
        with lock:  # one encoder user at a time; each text alone: batch-invariant vectors
            todo = [t for t in dict.fromkeys(texts) if t not in memo]
            meter.add(_METRIC.get(), embedded_texts=len(todo))
            for t in todo:
                if len(memo) >= max_cache:
                    memo.pop(next(iter(memo)))
                memo[t] = get_encoder().encode([t])[0].astype(float).tolist()
            return [memo[t] for t in texts]

    class EncoderEmbeddings(base):  # type: ignore[misc, valid-type]
        """ragas' embedding interface over the packaged bi-encoder (no embedding API). A text
        is encoded once (memo) and alone, so its vector never depends on what was encoded with
        it; the async methods encode in a worker thread so judge calls keep flowing."""

        def embed_text(self, text, **kw):
            return vectors([text])[0]

        async def aembed_text(self, text, **kw):
            return (await asyncio.to_thread(vectors, [text]))[0]  # copies the context

        def embed_texts(self, texts, **kw):
            return vectors(list(texts))

        async def aembed_texts(self, texts, **kw):
            return await asyncio.to_thread(vectors, list(texts))

    return EncoderEmbeddings(cache=None)


class RagasScorer:
    """ragas' four metrics through an OpenAI-compatible endpoint; the `QualityScorer`
    interface (`score`, `score_batch`, `usage`). Construct with a `RagasConfig` or a mapping
    (validated like a config file); `encoder`: a loaded `rag.encoders.Encoder` to share."""

    backend = "ragas"

    def __init__(self, config: RagasConfig | Mapping[str, Any] | None = None, *,
                 encoder=None, cache: JudgeCache | None = None):
        self.config = config if isinstance(config, RagasConfig) else RagasConfig.load(config)
        self._ragas = _import_ragas()
        self.meter = UsageMeter()
        if cache is None and self.config.cache:
            cache = JudgeCache(self.config.cache_path)
        self.cache = cache
        self._encoder = encoder
        self._judge = _Judge(self.config, self.meter, cache)
        r = self._ragas
        llm = _make_llm(r["InstructorBaseRagasLLM"], self._judge)
        emb = _make_embeddings(r["BaseRagasEmbedding"], self._get_encoder, self.meter)
        self.metrics = {
            "faithfulness": r["Faithfulness"](llm=llm),
            "answer_relevancy": r["AnswerRelevancy"](llm=llm, embeddings=emb,
                                                     strictness=self.config.strictness),
            "context_precision": r["ContextPrecisionWithReference"](llm=llm),
            "context_precision_noref": r["ContextPrecisionWithoutReference"](llm=llm),
            "context_recall": r["ContextRecall"](llm=llm),
        }
        self._answers = 0

    def _get_encoder(self):
        if self._encoder is None:
            from rag.encoders import Encoder

            self._encoder = Encoder.from_registry(self.config.encoder)
        return self._encoder

    # ---- public API ----------------------------------------------------------------------
    def score(self, answer: Answer, example: Example | None = None) -> dict[str, float]:
        return self.score_batch([answer], [example])[0]

    def score_batch(self, answers: Sequence[Answer],
                    examples: Sequence[Example | None] | None = None) -> list[dict[str, float]]:
        answers = list(answers)
        examples = list(examples) if examples is not None else [None] * len(answers)
        if len(examples) != len(answers):
            raise ValueError(f"{len(answers)} answers but {len(examples)} examples")
        samples = [judge_inputs(a, e, self.config.contexts)
                   for a, e in zip(answers, examples, strict=True)]
        return self.score_samples(samples)

    def score_samples(self, samples: Sequence[JudgeInputs]) -> list[dict[str, float]]:
        """Rows for ragas-style samples (question, response, contexts, reference)."""
        self._answers += len(samples)
        try:
            asyncio.get_running_loop()
        except RuntimeError:
            return asyncio.run(self._score_all(samples))
        with concurrent.futures.ThreadPoolExecutor(1) as pool:  # called from async code
            return pool.submit(asyncio.run, self._score_all(samples)).result()

    @property
    def usage(self) -> dict[str, Any]:
        """Per metric: `requests` ragas made, `calls` sent, `cache_hits`, `failures`,
        `prompt_tokens`, `completion_tokens`, `embedded_texts`, `seconds`; `total`; `answers`."""
        return {**self.meter.snapshot(), "answers": self._answers}

    # ---- internals -----------------------------------------------------------------------
    async def _score_all(self, samples: Sequence[JudgeInputs]) -> list[dict[str, float]]:
        if any(s.user_input and s.response for s in samples):
            self._get_encoder()  # load before the event loop is busy (loading blocks it)
        self._judge.inflight = {}
        async with self._judge.endpoint.session() as session:
            self._judge.session = session
            try:
                return list(await asyncio.gather(*(self._score_one(s) for s in samples)))
            finally:
                self._judge.session = None

    async def _score_one(self, s: JudgeInputs) -> dict[str, float]:
        jobs: dict[str, tuple[str, dict[str, Any]]] = {}
        ctx = list(s.retrieved_contexts)
        if s.user_input and s.response:
            if ctx:
                jobs["faithfulness"] = ("faithfulness", dict(
                    user_input=s.user_input, response=s.response, retrieved_contexts=ctx))
            jobs["answer_relevancy"] = ("answer_relevancy", dict(
                user_input=s.user_input, response=s.response))
            if ctx and s.reference:
                jobs["context_precision"] = ("context_precision", dict(
                    user_input=s.user_input, reference=s.reference, retrieved_contexts=ctx))
            elif ctx:
                jobs["context_precision"] = ("context_precision_noref", dict(
                    user_input=s.user_input, response=s.response, retrieved_contexts=ctx))
        if s.user_input and s.reference and ctx:
            jobs["context_recall"] = ("context_recall", dict(
                user_input=s.user_input, reference=s.reference, retrieved_contexts=ctx))

        async def run(name: str, impl: str, kwargs: dict[str, Any]) -> float | None:
            _METRIC.set(name)  # this task's own context: books calls to the metric
            try:
                res = await self.metrics[impl].ascore(**kwargs)
            except JudgeOutputError:
                return None
            v = float(res.value)
            return None if math.isnan(v) else min(1.0, max(0.0, v))

        names = list(jobs)
        vals = await asyncio.gather(*(run(n, *jobs[n]) for n in names))
        row = {n: v for n, v in zip(names, vals, strict=True) if v is not None}
        return {m: row[m] for m in METRICS if m in row}
