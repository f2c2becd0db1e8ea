"""One client for every OpenAI-compatible chat endpoint the project calls (the generator, the
pairwise judge, the ragas judge), built on the `openai` SDK so that real providers do not
abort a run on their first 429 or 503.

What the SDK gives (its own, well-tested retry loop; not re-implemented here): a timeout per
request; up to `max_retries` retries on connection errors, timeouts, 408, 409, 429 and 5xx,
with exponential backoff (0.5 s doubling, capped at 8 s, jittered) or the server's
`Retry-After` / `retry-after-ms` when it asks for 60 s or less. What this module adds: a limit
on concurrent requests per endpoint (`max_concurrency`, shared by sync and async callers of one
`ChatEndpoint`), `/v1` normalisation of the base URL, token usage, and one error type
(`EndpointError`) whose message names the config key, the URL and the HTTP status.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass
from typing import Any

from rag.errors import ConfigError, RagError


class EndpointError(RagError):
    """The endpoint could not be reached or answered with an error (after the retries)."""


@dataclass(frozen=True)
class ChatReply:
    """One completion: the text and the endpoint's token counts (0 when it reports none)."""

    text: str
    prompt_tokens: int
    completion_tokens: int


def _openai():
    try:
        import openai
    except ImportError:
        raise ConfigError("endpoint", "OpenAI-compatible endpoints need the openai SDK: "
                                      "pip install 'ragpilot[models]'") from None
    return openai


def v1_base(url: str, where: str = "url") -> str:
    """`url` with a trailing `/v1` (added when missing); ConfigError naming `where` unless
    http(s)."""
    if not isinstance(url, str) or not url.startswith(("http://", "https://")):
        raise ConfigError(where, f"must be an http(s) URL, got {url!r}")
    base = url.rstrip("/")
    return base if base.endswith("/v1") else base + "/v1"


class ChatEndpoint:
    """`chat(messages, ...)` / `achat(...)` against `<base_url>/v1/chat/completions`.

    `timeout_s`: per request (seconds). `max_retries`: extra attempts on 429/5xx/408/409,
    connection errors and timeouts. `max_concurrency`: requests in flight at once from this
    object. `where` names the config key in error messages (e.g. "ragas.base_url").
    """

    def __init__(self, base_url: str, model: str, api_key: str | None = None,
                 timeout_s: float = 60.0, max_retries: int = 4, max_concurrency: int = 4,
                 where: str = "url"):
        openai = _openai()
        if max_retries < 0 or max_concurrency < 1 or timeout_s <= 0:
            raise ConfigError(where, "needs timeout_s > 0, max_retries >= 0, "
                                     "max_concurrency >= 1")
        self.base_url = v1_base(base_url)
        self.chat_url = self.base_url + "/chat/completions"
        self.model, self.where = model, where
        self.timeout_s, self.max_retries = timeout_s, max_retries
        self.max_concurrency = max_concurrency
        # api_key "" sends no Authorization header (local servers); None would make the SDK
        # read OPENAI_API_KEY, which must never leak to a third-party endpoint.
        self._kw = {"base_url": self.base_url, "api_key": api_key or "",
                    "timeout": timeout_s, "max_retries": max_retries}
        self.client = openai.OpenAI(**self._kw)
        self._sync_slots = threading.BoundedSemaphore(max_concurrency)

    def _body(self, messages: Sequence[dict[str, str]], max_tokens: int, temperature: float,
              seed: int | None, json_mode: bool) -> dict[str, Any]:
        body: dict[str, Any] = {"model": self.model, "messages": list(messages),
                                "max_tokens": max_tokens, "temperature": temperature}
        if seed is not None:
            body["seed"] = seed
        if json_mode:
            body["response_format"] = {"type": "json_object"}
        return body

    def chat(self, messages: Sequence[dict[str, str]], max_tokens: int = 256,
             temperature: float = 0.0, seed: int | None = None,
             json_mode: bool = False) -> ChatReply:
        """One chat completion (blocking); EndpointError after the retries are spent."""
        with self._sync_slots:
            return self._call(lambda: self.client.chat.completions.create(
                **self._body(messages, max_tokens, temperature, seed, json_mode)))

    @contextlib.asynccontextmanager
    async def session(self) -> AsyncIterator[AsyncChat]:
        """An asyncio session on the running loop: `await s.achat(...)` with the same
        retries, errors and a concurrency limit of `max_concurrency` within the session;
        its connections are closed on exit."""
        import openai

        client = openai.AsyncOpenAI(**self._kw)
        try:
            yield AsyncChat(self, client, asyncio.Semaphore(self.max_concurrency))
        finally:
            await client.close()

    def _call(self, fn) -> ChatReply:
        try:
            resp = fn()
        except Exception as exc:  # mapped below; never swallowed
            raise self._error(exc) from None
        return self._reply(resp)

    def _reply(self, resp) -> ChatReply:
        try:
            text = resp.choices[0].message.content or ""
        except (AttributeError, IndexError, TypeError) as exc:
            raise EndpointError(f"{self.where} {self.chat_url}: not an OpenAI chat completion "
                                f"({exc!r})") from None
        usage = getattr(resp, "usage", None)
        return ChatReply(text, int(getattr(usage, "prompt_tokens", 0) or 0),
                         int(getattr(usage, "completion_tokens", 0) or 0))

    def _error(self, exc: Exception) -> Exception:
        import openai

        where = f"{self.where} {self.chat_url}"
        if isinstance(exc, openai.APIStatusError):
            body = (exc.response.text or "")[:200] if exc.response is not None else ""
            return EndpointError(f"{where}: HTTP {exc.status_code} after "
                                 f"{self.max_retries} retries: {body}")
        if isinstance(exc, openai.APIConnectionError | openai.APITimeoutError):
            return EndpointError(f"{where}: unreachable ({type(exc).__name__}: {exc})")
        if isinstance(exc, openai.APIResponseValidationError | ValueError | KeyError):
            return EndpointError(f"{where}: not an OpenAI chat completion ({exc!r})")
        return exc

    def close(self) -> None:
        self.client.close()


class AsyncChat:
    """`ChatEndpoint.session()`'s handle: `achat` mirrors `ChatEndpoint.chat`."""

    def __init__(self, endpoint: ChatEndpoint, client, slots: asyncio.Semaphore):
        self.endpoint, self.client, self.slots = endpoint, client, slots

    async def achat(self, messages: Sequence[dict[str, str]], max_tokens: int = 256,
                    temperature: float = 0.0, seed: int | None = None,
                    json_mode: bool = False) -> ChatReply:
        ep = self.endpoint
        async with self.slots:
            try:
                resp = await self.client.chat.completions.create(
                    **ep._body(messages, max_tokens, temperature, seed, json_mode))
            except Exception as exc:  # mapped to EndpointError; anything else re-raised
                raise ep._error(exc) from None
        return ep._reply(resp)
