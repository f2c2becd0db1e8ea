"""Query rewriting for conversational tasks (MTRAG: history + current question).

    last_turn  the current question alone
    concat     the last `history_turns` user turns of the history, then the current question
               (what a retriever needs to resolve "it"/"that one" without a model)
    generator  the local generator rewrites the question into a standalone one (SmolLM2 by
               default; slow, ~1 s per rewrite here, so only when asked); rewrites are cached in
               memory per (history, question), and an empty or overlong rewrite falls back to
               `concat`. The request has its own prompt (`rewrite_messages`: a system line and
               the conversation + instruction), rendered through the model's chat template
               (`render_rewrite_prompt`) — not wrapped in a QA template with no passages
A single-turn example (no history) is its question under every mode.
"""

from __future__ import annotations

from collections.abc import Callable

from rag.errors import ConfigError
from rag.generation.cache import cache_key
from rag.types import Example, Generation

MODES = ("last_turn", "concat", "generator")
MAX_QUERY_CHARS = 1000
MAX_NEW_TOKENS = 48
SYSTEM = "You rewrite the last user question of a conversation as a standalone question."
INSTRUCTION = ("Rewrite the last user question so that it can be understood without the "
               "conversation. Answer with the rewritten question only.")
Messages = list[dict[str, str]]


def _user_turns(example: Example) -> list[str]:
    return [t.get("text", "") for t in example.history
            if t.get("role", "user") == "user" and t.get("text")]


def concat_query(example: Example, history_turns: int) -> str:
    turns = _user_turns(example)[-history_turns:] if history_turns > 0 else []
    q = " ".join([*turns, example.question]).strip()
    return q[-MAX_QUERY_CHARS:]


def rewrite_messages(example: Example, history_turns: int) -> Messages:
    """The rewrite request as chat messages (system + user): the last `history_turns` exchanges
    (2 turns each), the last user question, the instruction. Not a QA prompt: no passages."""
    hist = "\n".join(f"{t.get('role', 'user')}: {t.get('text', '')}"
                     for t in example.history[-2 * max(history_turns, 1):])
    user = (f"Conversation:\n{hist}\n\nLast user question: {example.question}\n\n"
            f"{INSTRUCTION}")
    return [{"role": "system", "content": SYSTEM}, {"role": "user", "content": user}]


def render_rewrite_prompt(tokenizer, messages: Messages) -> str:
    """The prompt text a local model sees: the tokenizer's chat template with the generation
    prompt (as `rag.generation.local.TransformersGenerator` renders QA prompts), or, for a model
    without one, plain text ending in "Rewritten question:"."""
    if getattr(tokenizer, "chat_template", None):
        return tokenizer.apply_chat_template(messages, tokenize=False,
                                             add_generation_prompt=True)
    system = "\n".join(m["content"] for m in messages if m["role"] == "system")
    user = "\n\n".join(m["content"] for m in messages if m["role"] != "system")
    return f"{system}\n\n{user}\nRewritten question:"


def generator_completion(gen) -> Callable[[Messages], str]:
    """`complete(messages) -> text` on a `rag.generation` backend, bypassing its QA templates:
    a local transformers generator (`tokenizer` + `model`) renders `render_rewrite_prompt` and
    decodes greedily (its GenerationCache, when on, keyed by the rendered prompt); an
    OpenAI-compatible one posts the messages as they are."""
    if hasattr(gen, "tokenizer") and hasattr(gen, "model"):
        def complete(messages: Messages) -> str:
            prompt = render_rewrite_prompt(gen.tokenizer, messages)
            cache = getattr(gen, "cache", None)
            key = cache_key(getattr(gen, "fingerprint", ""), "rewrite", prompt, MAX_NEW_TOKENS)
            if cache is not None and (hit := cache.get(key)) is not None:
                return hit.raw
            import torch

            enc = gen.tokenizer([prompt], return_tensors="pt", add_special_tokens=False,
                                return_token_type_ids=False).to(gen.model.device)
            with torch.inference_mode():
                out = gen.model.generate(**enc, max_new_tokens=MAX_NEW_TOKENS, do_sample=False,
                                         temperature=None, top_p=None, top_k=None,
                                         pad_token_id=gen.tokenizer.pad_token_id)
            new = out[0, enc["input_ids"].shape[1]:].tolist()
            raw = gen.tokenizer.decode(new, skip_special_tokens=True)
            if cache is not None:
                cache.put(key, Generation(raw.strip(), raw, (), int(enc["input_ids"].shape[1]),
                                          len(new)))
            return raw

        return complete
    if hasattr(gen, "client") and hasattr(gen, "base_url") and hasattr(gen, "model"):
        def complete_http(messages: Messages) -> str:
            url = f"{gen.base_url}/chat/completions" if gen.base_url.endswith("/v1") else \
                f"{gen.base_url}/v1/chat/completions"
            from rag.generation.openai_compat import EndpointError

            try:
                r = gen.client.post(url, json={"model": gen.model, "messages": messages,
                                               "max_tokens": MAX_NEW_TOKENS,
                                               "temperature": 0.0})
                r.raise_for_status()
                return r.json()["choices"][0]["message"]["content"] or ""
            except Exception as exc:  # noqa: BLE001 - any transport/format error, named
                raise EndpointError(f"rewrite endpoint {url}: {exc}") from None

        return complete_http
    raise ConfigError("selection.mtrag.generator", f"{getattr(gen, 'name', gen)!r} cannot "
                                                   "rewrite (needs a local transformers model "
                                                   "or an OpenAI-compatible endpoint)")


class QueryRewriter:
    """`rewrite(example) -> str` with one of MODES. In `generator` mode the model named
    `generator` (or the `rag.generation` backend object given) completes `rewrite_messages`
    through its own chat template; `generate(messages) -> text` overrides the model (tests;
    another backend)."""

    def __init__(self, mode: str = "concat", history_turns: int = 2,
                 generator: str | object = "smollm2-135m-instruct",
                 generate: Callable[[Messages], str] | None = None):
        if mode not in MODES:
            raise ConfigError("selection.mtrag.rewrite", f"unknown mode {mode!r} (one of "
                                                         f"{', '.join(MODES)})")
        self.mode, self.history_turns = mode, history_turns
        self.generator_name = generator if isinstance(generator, str) else \
            getattr(generator, "name", type(generator).__name__)
        self._backend = None if isinstance(generator, str) else generator
        self._generate = generate
        self._cache: dict[tuple, str] = {}
        self.calls = 0

    def _gen(self, messages: Messages) -> str:
        if self._generate is None:
            if self._backend is None:
                from rag.generation.factory import make_generator

                self._backend = make_generator(self.generator_name)
            self._generate = generator_completion(self._backend)
        self.calls += 1
        return self._generate(messages)

    def rewrite(self, example: Example) -> str:
        if not example.history or self.mode == "last_turn":
            return example.question
        if self.mode == "concat":
            return concat_query(example, self.history_turns)
        key = (tuple((t.get("role"), t.get("text")) for t in example.history), example.question)
        if key not in self._cache:
            out = self._gen(rewrite_messages(example, self.history_turns))
            out = out.strip().split("\n")[0].strip()
            ok = 3 <= len(out) <= MAX_QUERY_CHARS
            self._cache[key] = out if ok else concat_query(example, self.history_turns)
        return self._cache[key]
