"""Query rewriting for conversational tasks (MTRAG: history + current question).

    last_turn  the current question alone
    concat     the last `history_turns` user turns of the history, then the current question
               (what a retriever needs to resolve "it"/"that one" without a model)
    generator  the local generator rewrites the question into a standalone one (SmolLM2 by
               default; slow, ~1 s per rewrite here, so only when asked); rewrites are cached in
               memory per (history, question), and an empty or overlong rewrite falls back to
               `concat`
A single-turn example (no history) is its question under every mode.
"""

from __future__ import annotations

from collections.abc import Callable

from rag.errors import ConfigError
from rag.types import Example

MODES = ("last_turn", "concat", "generator")
MAX_QUERY_CHARS = 1000
PROMPT = ("Rewrite the last user question so that it can be understood without the "
          "conversation. Answer with the rewritten question only.\n\nConversation:\n{history}\n"
          "Last user question: {question}\nRewritten question:")


def _user_turns(example: Example) -> list[str]:
    return [t.get("text", "") for t in example.history
            if t.get("role", "user") == "user" and t.get("text")]


def concat_query(example: Example, history_turns: int) -> str:
    turns = _user_turns(example)[-history_turns:] if history_turns > 0 else []
    q = " ".join([*turns, example.question]).strip()
    return q[-MAX_QUERY_CHARS:]


class QueryRewriter:
    """`rewrite(example) -> str` with one of MODES. `generate(prompt) -> text` overrides the
    local generator (tests; another backend)."""

    def __init__(self, mode: str = "concat", history_turns: int = 2,
                 generator: str = "smollm2-135m-instruct",
                 generate: Callable[[str], str] | None = None):
        if mode not in MODES:
            raise ConfigError("selection.mtrag.rewrite", f"unknown mode {mode!r} (one of "
                                                         f"{', '.join(MODES)})")
        self.mode, self.history_turns, self.generator_name = mode, history_turns, generator
        self._generate = generate
        self._cache: dict[tuple, str] = {}
        self.calls = 0

    def _gen(self, prompt: str) -> str:
        if self._generate is None:
            from rag.generation.factory import make_generator

            gen = make_generator(self.generator_name)

            def run(p: str) -> str:
                return gen.generate(p, (), "plain", max_new_tokens=48).text

            self._generate = run
        self.calls += 1
        return self._generate(prompt)

    def rewrite(self, example: Example) -> str:
        if not example.history or self.mode == "last_turn":
            return example.question
        if self.mode == "concat":
            return concat_query(example, self.history_turns)
        key = (tuple((t.get("role"), t.get("text")) for t in example.history), example.question)
        if key not in self._cache:
            hist = "\n".join(f"{t.get('role', 'user')}: {t.get('text', '')}"
                             for t in example.history[-2 * max(self.history_turns, 1):])
            out = self._gen(PROMPT.format(history=hist, question=example.question))
            out = out.strip().split("\n")[0].strip()
            ok = 3 <= len(out) <= MAX_QUERY_CHARS
            self._cache[key] = out if ok else concat_query(example, self.history_turns)
        return self._cache[key]
