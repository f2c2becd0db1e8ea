"""Any OpenAI-compatible chat endpoint (Ollama, vLLM, llama.cpp server, …) as a generator.

Requests go through `rag.generation.endpoint.ChatEndpoint` (timeouts, retries with backoff on
429/5xx honouring Retry-After, a concurrency limit)."""

from __future__ import annotations

from rag.errors import ConfigError
from rag.generation.base import Generator
from rag.generation.cache import GenerationCache, cache_key
from rag.generation.endpoint import ChatEndpoint, EndpointError
from rag.generation.parse import parse_output
from rag.generation.prompts import get_prompt
from rag.types import Generation

__all__ = ["OpenAIChatGenerator", "EndpointError"]


class OpenAIChatGenerator(Generator):
    def __init__(self, base_url: str, model: str, api_key: str | None = None,
                 timeout: float = 60.0, cache: bool = True, name: str | None = None,
                 max_retries: int = 4, max_concurrency: int = 4):
        if not base_url.startswith(("http://", "https://")):
            raise ConfigError("url", f"must be an http(s) URL, got {base_url!r}")
        self.base_url = base_url.rstrip("/")
        self.model = model
        self.name = name or f"openai:{model}"
        self.fingerprint = f"openai:{self.base_url}:{model}"
        self.endpoint = ChatEndpoint(self.base_url, model, api_key=api_key, timeout_s=timeout,
                                     max_retries=max_retries, max_concurrency=max_concurrency,
                                     where="generator endpoint")
        self.cache = GenerationCache() if cache else None

    def generate(self, question, contexts, prompt_id, max_new_tokens=48, temperature=0.0,
                 abstain_threshold=None):
        # abstain_threshold is ignored: a `*_abstain` prompt asks the model itself to abstain
        tpl = get_prompt(prompt_id)
        messages = tpl.messages(question, contexts)
        key = cache_key(self.fingerprint, prompt_id, messages, max_new_tokens, temperature)
        if self.cache and (hit := self.cache.get(key)):
            return hit
        reply = self.endpoint.chat(messages, max_tokens=max_new_tokens, temperature=temperature)
        raw = reply.text
        text, cites = parse_output(raw, len(contexts), tpl.concise, question, contexts)
        g = Generation(text, raw, cites if tpl.cites else (), reply.prompt_tokens,
                       reply.completion_tokens or len(raw.split()))
        if self.cache:
            self.cache.put(key, g)
        return g
