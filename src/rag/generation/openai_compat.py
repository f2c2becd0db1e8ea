"""Any OpenAI-compatible chat endpoint (Ollama, vLLM, llama.cpp server, …) as a generator."""

from __future__ import annotations

import httpx

from rag.errors import ConfigError, RagError
from rag.generation.base import Generator
from rag.generation.cache import GenerationCache, cache_key
from rag.generation.parse import parse_output
from rag.generation.prompts import get_prompt
from rag.types import Generation


class EndpointError(RagError):
    """The endpoint could not be reached or answered with an error."""


class OpenAIChatGenerator(Generator):
    def __init__(self, base_url: str, model: str, api_key: str | None = None,
                 timeout: float = 60.0, cache: bool = True, name: str | None = None):
        if not base_url.startswith(("http://", "https://")):
            raise ConfigError("url", f"must be an http(s) URL, got {base_url!r}")
        self.base_url = base_url.rstrip("/")
        self.model = model
        self.name = name or f"openai:{model}"
        self.fingerprint = f"openai:{self.base_url}:{model}"
        headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self.client = httpx.Client(timeout=timeout, headers=headers)
        self.cache = GenerationCache() if cache else None

    def generate(self, question, contexts, prompt_id, max_new_tokens=48, temperature=0.0):
        tpl = get_prompt(prompt_id)
        messages = tpl.messages(question, contexts)
        key = cache_key(self.fingerprint, prompt_id, messages, max_new_tokens, temperature)
        if self.cache and (hit := self.cache.get(key)):
            return hit
        url = f"{self.base_url}/chat/completions" if self.base_url.endswith("/v1") else \
            f"{self.base_url}/v1/chat/completions"
        try:
            r = self.client.post(url, json={"model": self.model, "messages": messages,
                                            "max_tokens": max_new_tokens,
                                            "temperature": temperature})
            r.raise_for_status()
            body = r.json()
            raw = body["choices"][0]["message"]["content"] or ""
        except httpx.HTTPError as exc:
            raise EndpointError(f"generator endpoint {url}: {exc}") from None
        except (KeyError, IndexError, ValueError) as exc:
            raise EndpointError(f"generator endpoint {url}: unexpected response ({exc})") from None
        usage = body.get("usage") or {}
        text, cites = parse_output(raw, len(contexts), tpl.concise, question)
        g = Generation(text, raw, cites if tpl.cites else (), int(usage.get("prompt_tokens", 0)),
                       int(usage.get("completion_tokens", len(raw.split()))))
        if self.cache:
            self.cache.put(key, g)
        return g
