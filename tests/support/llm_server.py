"""A small OpenAI-compatible chat server (`POST /v1/chat/completions`, `GET /v1/models`) for
tests and air-gapped use: the ragas adapter and `OpenAIChatGenerator` talk to it like to vLLM.

Two backends:

* `RuleBasedResponder` (default): a deterministic judge for ragas' prompts. It reads the JSON
  schema title and the final `input:` JSON that ragas' prompts end with, and answers JSON that
  validates against ragas' pydantic output models — statements = the answer's sentences
  (`rag.metrics.support.split_sentences`), a verdict = 1 when ≥ 75% of the statement's content
  stems and every name/number in it occur in the context, answer relevancy's question = the
  answer's first sentence turned into a question (noncommittal from the abstention patterns),
  context precision = the context covers ≥ 50% of the answer's content stems. So scores mean
  something and have known values (an answer copied from the context: faithfulness 1.0; an
  answer about something else: 0.0). Other prompts get "{}" (JSON asked) or a fixed sentence.
* `ChatModelResponder`: any local generator of the model registry (default the packaged
  SmolLM2-135M-Instruct), greedy, chat template applied; too small to follow ragas' schemas,
  but a real local endpoint for `OpenAIChatGenerator`.

Usage is reported per reply (`count_tokens` for the rules, the tokenizer for a model) and
summed in `server.stats` — tests compare it with what a client counted.

    python -m tests.support.llm_server --port 8011 [--backend rules|smollm2-135m-instruct]
"""

from __future__ import annotations

import argparse
import json
import threading
import time
from collections import Counter
from collections.abc import Sequence
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Protocol

from rag.metrics.claims import (
    content_tokens,
    is_noncommittal,
    key_tokens,
    split_sentences,
    strip_citations,
)
from rag.metrics.cost import count_tokens

__all__ = ["RuleBasedResponder", "ChatModelResponder", "LLMServer", "Responder"]

_INPUT_MARK = "input: "
_SCHEMA_MARK = "JSON Schema:"


class Responder(Protocol):
    name: str

    def respond(self, messages: Sequence[dict[str, Any]], max_tokens: int) -> tuple[str, int, int]:
        """messages -> (reply text, prompt tokens, completion tokens)."""


def _text_of(message: dict[str, Any]) -> str:
    content = message.get("content") or ""
    if isinstance(content, list):  # OpenAI content parts
        return " ".join(p.get("text", "") for p in content if isinstance(p, dict))
    return str(content)


def _first_json(text: str, start: int) -> Any:
    i = text.find("{", start)
    if i < 0:
        return None
    try:
        return json.JSONDecoder().raw_decode(text[i:])[0]
    except ValueError:
        return None


class RuleBasedResponder:
    """Deterministic answers to ragas' judge prompts (module docstring)."""

    name = "ragpilot-rules"

    def __init__(self, support_threshold: float = 0.75, precision_threshold: float = 0.5):
        self.support_threshold = support_threshold
        self.precision_threshold = precision_threshold
        self.tasks: Counter[str] = Counter()

    # ---- the judgement rules -----------------------------------------------------------------
    def coverage(self, statement: str, context: str) -> tuple[float, int, int]:
        """(share of the statement's content stems found in the context, found, total)."""
        toks = set(content_tokens(statement))
        if not toks:
            return 0.0, 0, 0
        found = len(toks & set(content_tokens(context)))
        return found / len(toks), found, len(toks)

    def supported(self, statement: str, context: str) -> tuple[int, str]:
        cov, found, total = self.coverage(statement, context)
        pool = set(content_tokens(context))
        missing = sorted(key_tokens(statement) - pool)
        ok = total > 0 and cov >= self.support_threshold and not missing
        reason = f"The context contains {found} of the {total} content words of the statement"
        if missing:
            reason += f"; not found: {', '.join(missing)}"
        return int(ok), reason + "."

    @staticmethod
    def statements(answer: str) -> list[str]:
        text = strip_citations(answer)
        return [] if is_noncommittal(text) else split_sentences(text)

    @staticmethod
    def question_for(response: str) -> str:
        sents = split_sentences(strip_citations(response))
        first = (sents[0] if sents else response).strip().rstrip(".!?")
        return f"What is true about: {first}?" if first else ""

    # ---- dispatch -----------------------------------------------------------------------------
    def reply(self, prompt: str) -> str:
        schema = _first_json(prompt, prompt.find(_SCHEMA_MARK)) if _SCHEMA_MARK in prompt else None
        title = schema.get("title", "") if isinstance(schema, dict) else ""
        pos = prompt.rfind(_INPUT_MARK)
        data = _first_json(prompt, pos) if pos >= 0 else None
        if not isinstance(data, dict):
            data = {}
        self.tasks[title or "other"] += 1
        out: Any
        if title == "StatementGeneratorOutput":
            out = {"statements": self.statements(str(data.get("answer", "")))}
        elif title == "NLIStatementOutput":
            ctx = str(data.get("context", ""))
            out = {"statements": []}
            for s in data.get("statements", []) or []:
                verdict, reason = self.supported(str(s), ctx)
                out["statements"].append({"statement": s, "reason": reason, "verdict": verdict})
        elif title == "AnswerRelevanceOutput":
            resp = str(data.get("response", ""))
            out = {"question": self.question_for(resp),
                   "noncommittal": int(is_noncommittal(strip_citations(resp)))}
        elif title == "ContextPrecisionOutput":
            cov, found, total = self.coverage(str(data.get("answer", "")),
                                              str(data.get("context", "")))
            out = {"reason": f"The context contains {found} of the {total} content words of "
                             f"the answer.",
                   "verdict": int(total > 0 and cov >= self.precision_threshold)}
        elif title == "ContextRecallOutput":
            ctx = str(data.get("context", ""))
            out = {"classifications": []}
            for s in split_sentences(strip_citations(str(data.get("answer", "")))):
                verdict, reason = self.supported(s, ctx)
                out["classifications"].append({"statement": s, "reason": reason,
                                               "attributed": verdict})
        elif schema is not None or "json" in prompt.lower():
            out = {}
        else:
            return "I cannot answer that."
        return json.dumps(out, ensure_ascii=False)

    def respond(self, messages, max_tokens):
        prompt = "\n".join(_text_of(m) for m in messages)
        user = [_text_of(m) for m in messages if m.get("role") == "user"]
        text = self.reply(user[-1] if user else prompt)
        return text, count_tokens(prompt), count_tokens(text)


class ChatModelResponder:
    """A registry generator (transformers) answering chat messages greedily."""

    def __init__(self, generator: str = "smollm2-135m-instruct", max_new_tokens: int = 256):
        from rag.generation.factory import make_generator

        gen = make_generator(generator, cache=False)
        if not hasattr(gen, "model") or not hasattr(gen, "tokenizer"):
            raise ValueError(f"generator {generator!r} is not a local transformers model")
        self.gen, self.name, self.max_new_tokens = gen, generator, max_new_tokens
        self._lock = threading.Lock()  # one forward pass at a time

    def respond(self, messages, max_tokens):
        tok, model = self.gen.tokenizer, self.gen.model
        msgs = [{"role": m.get("role", "user"), "content": _text_of(m)} for m in messages]
        prompt = tok.apply_chat_template(msgs, tokenize=False, add_generation_prompt=True)
        enc = tok([prompt], return_tensors="pt", add_special_tokens=False,
                  return_token_type_ids=False)
        with self._lock, self.gen._torch.inference_mode():
            out = model.generate(**enc, max_new_tokens=min(max_tokens, self.max_new_tokens),
                                 do_sample=False, temperature=None, top_p=None, top_k=None,
                                 pad_token_id=tok.pad_token_id)
        new = out[0, enc["input_ids"].shape[1]:].tolist()
        return tok.decode(new, skip_special_tokens=True), int(enc["input_ids"].shape[1]), len(new)


class LLMServer:
    """The HTTP server around a responder, in a daemon thread. `port=0` picks a free port.

        with LLMServer() as srv:          # srv.url == "http://127.0.0.1:<port>/v1"
            ...
        srv.stats   # {"requests", "prompt_tokens", "completion_tokens", "errors", "tasks"}
    """

    def __init__(self, responder: Responder | None = None, host: str = "127.0.0.1",
                 port: int = 0):
        self.responder = responder or RuleBasedResponder()
        self._lock = threading.Lock()
        self._stats = {"requests": 0, "prompt_tokens": 0, "completion_tokens": 0, "errors": 0}
        self._httpd = ThreadingHTTPServer((host, port), self._handler())
        self._httpd.daemon_threads = True
        self._thread: threading.Thread | None = None

    @property
    def host(self) -> str:
        return str(self._httpd.server_address[0])

    @property
    def port(self) -> int:
        return int(self._httpd.server_address[1])

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}/v1"

    @property
    def stats(self) -> dict[str, Any]:
        with self._lock:
            out: dict[str, Any] = dict(self._stats)
        tasks = getattr(self.responder, "tasks", None)
        out["tasks"] = dict(tasks) if tasks is not None else {}
        return out

    def start(self) -> LLMServer:
        self._thread = threading.Thread(target=self._httpd.serve_forever, daemon=True,
                                        name="llm-server")
        self._thread.start()
        return self

    def stop(self) -> None:
        self._httpd.shutdown()
        self._httpd.server_close()

    def __enter__(self) -> LLMServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def _handler(self):
        server = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def _send(self, code: int, payload: dict[str, Any]) -> None:
                out = json.dumps(payload, ensure_ascii=False).encode()
                self.send_response(code)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(out)))
                self.end_headers()
                self.wfile.write(out)

            def _error(self, code: int, field: str, msg: str) -> None:
                with server._lock:
                    server._stats["errors"] += 1
                self._send(code, {"error": {"message": f"{field}: {msg}", "param": field,
                                            "type": "invalid_request_error"}})

            def do_GET(self):  # noqa: N802 - http.server API
                if self.path.rstrip("/") in ("/v1/models", "/models"):
                    self._send(200, {"object": "list", "data": [
                        {"id": server.responder.name, "object": "model", "owned_by": "ragpilot"}]})
                elif self.path.rstrip("/") in ("/health", "/v1/health"):
                    self._send(200, {"status": "ok"})
                else:
                    self._error(404, "path", f"no route {self.path}")

            def do_POST(self):  # noqa: N802 - http.server API
                if self.path.rstrip("/") not in ("/v1/chat/completions", "/chat/completions"):
                    return self._error(404, "path", f"no route {self.path}")
                try:
                    body = json.loads(self.rfile.read(int(self.headers.get("Content-Length")
                                                          or 0)) or b"null")
                except ValueError:
                    return self._error(400, "body", "not valid JSON")
                if not isinstance(body, dict):
                    return self._error(400, "body", "must be a JSON object")
                msgs = body.get("messages")
                if not isinstance(msgs, list) or not msgs or not all(
                        isinstance(m, dict) for m in msgs):
                    return self._error(400, "messages", "must be a non-empty list of objects")
                max_tokens = body.get("max_tokens") or 1024
                if not isinstance(max_tokens, int) or max_tokens < 1:
                    return self._error(400, "max_tokens", "must be a positive integer")
                text, p_tok, c_tok = server.responder.respond(msgs, max_tokens)
                with server._lock:
                    server._stats["requests"] += 1
                    server._stats["prompt_tokens"] += p_tok
                    server._stats["completion_tokens"] += c_tok
                self._send(200, {
                    "id": f"chatcmpl-{server._stats['requests']}", "object": "chat.completion",
                    "created": int(time.time()), "model": body.get("model") or
                    server.responder.name,
                    "choices": [{"index": 0, "finish_reason": "stop",
                                 "message": {"role": "assistant", "content": text}}],
                    "usage": {"prompt_tokens": p_tok, "completion_tokens": c_tok,
                              "total_tokens": p_tok + c_tok}})

            def log_message(self, *args: object) -> None:
                pass

        return Handler


def main(argv: list[str] | None = None) -> int:
    from rag.env import configure_runtime_env

    configure_runtime_env()
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--port", type=int, default=8011)
    ap.add_argument("--backend", default="rules",
                    help="rules | a registry generator name (e.g. smollm2-135m-instruct)")
    args = ap.parse_args(argv)
    responder = RuleBasedResponder() if args.backend == "rules" else \
        ChatModelResponder(args.backend)
    srv = LLMServer(responder, host=args.host, port=args.port)
    print(f"serving {responder.name} at {srv.url} (Ctrl-C to stop)", flush=True)
    try:
        srv._httpd.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        srv._httpd.server_close()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
