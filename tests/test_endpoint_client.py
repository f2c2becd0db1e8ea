"""The shared OpenAI-compatible client (rag.generation.endpoint) survives real providers:
429/503 answers with Retry-After are retried after the delay the server asks for, a run no
longer aborts on one 429, retries end in a clear EndpointError, and concurrency is capped.

The endpoint is the project's local responder (tests.support.llm_server, rule-based) behind a small
front that answers a scripted sequence of failures first, as a rate-limited provider would."""

from __future__ import annotations

import json
import threading
import time
from collections import deque
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import httpx
import pytest
from tests.support.llm_server import LLMServer

from rag.generation.endpoint import ChatEndpoint, EndpointError

MSG = [{"role": "user", "content": "Say something."}]


class FlakyFront:
    """HTTP front on 127.0.0.1: pops (status, headers) faults from `faults` per POST and
    answers them; once empty, forwards to `upstream`. Records each POST's arrival time and the
    peak number of requests in flight."""

    def __init__(self, upstream: str, faults=(), delay_s: float = 0.0):
        self.upstream, self.faults, self.delay_s = upstream, deque(faults), delay_s
        self.arrivals: list[float] = []
        self.inflight = self.peak = 0
        self._lock = threading.Lock()
        front = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def do_POST(self):  # noqa: N802 - http.server API
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                with front._lock:
                    front.arrivals.append(time.monotonic())
                    front.inflight += 1
                    front.peak = max(front.peak, front.inflight)
                    fault = front.faults.popleft() if front.faults else None
                try:
                    time.sleep(front.delay_s)
                    if fault:
                        code, headers = fault
                        out = json.dumps({"error": {"message": f"scripted {code}"}}).encode()
                    else:
                        r = httpx.post(front.upstream + "/chat/completions", content=body,
                                       headers={"Content-Type": "application/json"})
                        code, headers, out = r.status_code, {}, r.content
                    self.send_response(code)
                    for k, v in headers.items():
                        self.send_header(k, v)
                    self.send_header("Content-Type", "application/json")
                    self.send_header("Content-Length", str(len(out)))
                    self.end_headers()
                    self.wfile.write(out)
                finally:
                    with front._lock:
                        front.inflight -= 1

            def log_message(self, *args):
                pass

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.httpd.daemon_threads = True
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}/v1"

    def close(self):
        self.httpd.shutdown()
        self.httpd.server_close()


@pytest.fixture
def upstream():
    with LLMServer() as srv:
        yield srv


def test_429_then_503_with_retry_after_then_success(upstream):
    front = FlakyFront(upstream.url, [(429, {"Retry-After": "1.5"}),
                                      (503, {"Retry-After": "0.2"})])
    try:
        ep = ChatEndpoint(front.url, "m", max_retries=3)
        reply = ep.chat(MSG, max_tokens=16)
    finally:
        front.close()
    assert reply.text and reply.completion_tokens > 0
    assert len(front.arrivals) == 3 and upstream.stats["requests"] == 1
    # the second attempt waited for the server's Retry-After (1.5 s), not the SDK's own
    # first backoff (<= 0.5 s)
    assert front.arrivals[1] - front.arrivals[0] >= 1.4
    assert front.arrivals[2] - front.arrivals[1] >= 0.15


def test_retries_spent_is_a_clear_error(upstream):
    front = FlakyFront(upstream.url, [(503, {"Retry-After": "0.1"})] * 3)
    try:
        ep = ChatEndpoint(front.url, "m", max_retries=1, where="judge endpoint")
        with pytest.raises(EndpointError, match=r"judge endpoint .*HTTP 503 after 1 retries"):
            ep.chat(MSG)
    finally:
        front.close()
    assert len(front.arrivals) == 2  # one call + one retry, then it gives up


def test_client_errors_are_not_retried(upstream):
    front = FlakyFront(upstream.url, [(400, {})])
    try:
        with pytest.raises(EndpointError, match="HTTP 400"):
            ChatEndpoint(front.url, "m", max_retries=3).chat(MSG)
    finally:
        front.close()
    assert len(front.arrivals) == 1


def test_concurrency_is_capped(upstream):
    front = FlakyFront(upstream.url, delay_s=0.3)
    ep = ChatEndpoint(front.url, "m", max_concurrency=2)
    try:
        threads = [threading.Thread(target=ep.chat, args=(MSG,)) for _ in range(6)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    finally:
        front.close()
    assert len(front.arrivals) == 6 and front.peak <= 2


def test_generator_run_survives_a_429(upstream, tmp_path, monkeypatch):
    from rag.generation.openai_compat import OpenAIChatGenerator
    from rag.types import Context

    monkeypatch.setenv("RAGPILOT_CACHE", str(tmp_path))
    front = FlakyFront(upstream.url, [(429, {"Retry-After": "0.1"})])
    try:
        gen = OpenAIChatGenerator(front.url, "m", cache=False)
        ctx = [Context("p1", "Paris", "Paris is the capital of France.")]
        outs = [gen.generate(q, ctx, "cite_concise") for q in ("Capital of France?", "Where?")]
    finally:
        front.close()
    assert all(o.raw for o in outs) and len(front.arrivals) == 3


def test_judge_backend_survives_a_429(upstream):
    from rag.metrics.judge import OpenAIJudgeBackend
    from rag.types import Context

    front = FlakyFront(upstream.url, [(429, {"Retry-After": "0.1"})])
    try:
        be = OpenAIJudgeBackend(front.url, "m")
        res = be.judge_batch([("Capital of France?",
                               [Context("p", "Paris", "Paris is the capital.")], "Paris", "Rome")])
    finally:
        front.close()
    assert len(res) == 1 and len(front.arrivals) == 2


def test_ragas_run_survives_a_429(upstream, tmp_path):
    pytest.importorskip("ragas")
    from rag.metrics.ragas_adapter import RagasScorer
    from rag.types import Answer, Context

    front = FlakyFront(upstream.url, [(429, {"Retry-After": "0.1"}), (503, {})])
    try:
        scorer = RagasScorer({"base_url": front.url, "model": "m", "cache": False,
                              "max_concurrency": 2})
        ctx = Context("p", "Paris", "Paris is the capital and largest city of France.")
        ans = Answer("q1", "What is the capital of France?", "Paris is the capital of France.",
                     (1,), (ctx,), (), {}, 0, 0, "h")
        row = scorer.score(ans)
    finally:
        front.close()
    assert "faithfulness" in row and 0.0 <= row["faithfulness"] <= 1.0
    assert scorer.usage["total"]["calls"] >= 2
