"""Backpressure: a bounded number of requests in flight and a token bucket per client.

Both answer "no" instantly with the number of seconds after which a retry can succeed, which
the ingress returns as `429 Too Many Requests` with a `Retry-After` header (whole seconds,
rounded up, at least 1). Thread-safe; time comes from an injectable clock (seconds) for tests.
`BodyLimitMiddleware` refuses oversized request bodies (413) before anything parses them.
"""

from __future__ import annotations

import math
import threading
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass


@dataclass
class _Bucket:
    tokens: float
    stamp: float


class TokenBucketLimiter:
    """Per-client token bucket: `rate` tokens/s refill up to `burst`; one request costs one
    token. At most `max_clients` buckets are kept (least recently used forgotten: a forgotten
    client starts again with a full bucket)."""

    def __init__(self, rate: float, burst: float, max_clients: int = 10_000,
                 clock: Callable[[], float] = time.monotonic):
        if rate <= 0 or burst < 1 or max_clients < 1:
            raise ValueError("rate must be > 0, burst >= 1, max_clients >= 1")
        self.rate, self.burst, self.max_clients = float(rate), float(burst), max_clients
        self.clock = clock
        self._buckets: OrderedDict[str, _Bucket] = OrderedDict()
        self._lock = threading.Lock()

    def acquire(self, client: str, cost: float = 1.0) -> float:
        """0.0 when allowed (the token is taken), else seconds until `cost` tokens exist."""
        now = self.clock()
        with self._lock:
            b = self._buckets.get(client)
            if b is None:
                b = _Bucket(self.burst, now)
                self._buckets[client] = b
                if len(self._buckets) > self.max_clients:
                    self._buckets.popitem(last=False)
            else:
                self._buckets.move_to_end(client)
                b.tokens = min(self.burst, b.tokens + (now - b.stamp) * self.rate)
                b.stamp = now
            if b.tokens >= cost:
                b.tokens -= cost
                return 0.0
            return (cost - b.tokens) / self.rate

    def __len__(self) -> int:
        return len(self._buckets)


class InflightGate:
    """At most `limit` requests at once; `try_enter` never blocks (a full gate means the
    server is saturated: waiting would only grow the queue and every request's latency)."""

    def __init__(self, limit: int, retry_after_s: float = 1.0):
        if limit < 1:
            raise ValueError("limit must be >= 1")
        self.limit, self.retry_after_s = limit, retry_after_s
        self.inflight = 0
        self.peak = 0
        self._lock = threading.Lock()

    def try_enter(self) -> bool:
        with self._lock:
            if self.inflight >= self.limit:
                return False
            self.inflight += 1
            self.peak = max(self.peak, self.inflight)
            return True

    def leave(self) -> None:
        with self._lock:
            self.inflight = max(0, self.inflight - 1)


def retry_after_header(seconds: float) -> str:
    """HTTP Retry-After value: whole seconds, rounded up, at least 1."""
    return str(max(1, math.ceil(seconds)))


_BODY_LIMIT = {"bytes": 1_048_576}


def set_body_limit(n: int) -> None:
    """The limit `current_body_limit` returns (set by the ingress from `limits.max_body_bytes`;
    a function of this module so Ray's by-value pickling of the app shares it: see
    serving.auth.install_guard)."""
    _BODY_LIMIT["bytes"] = int(n)


def current_body_limit() -> int:
    return _BODY_LIMIT["bytes"]


class BodyLimitMiddleware:
    """ASGI middleware: refuse a request body larger than `limit()` bytes with 413, before
    the app parses it. A declared `Content-Length` above the limit is refused without reading
    a byte; a chunked body is read up to the limit (never more) and then replayed to the app.
    `limit` is a callable so the ingress can set it from its settings after import."""

    def __init__(self, app, limit: Callable[[], int]):
        self.app, self.limit = app, limit

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        limit = self.limit()
        declared = next((v for k, v in scope.get("headers", ()) if k == b"content-length"), None)
        if declared is not None:
            if not declared.strip().isdigit():
                await _json(send, 400, "content-length", "must be a whole number of bytes")
                return
            if int(declared) > limit:
                await _too_large(send, int(declared), limit)
                return
        chunks: list[bytes] = []
        size = 0
        while True:
            msg = await receive()
            if msg["type"] != "http.request":  # client went away: let the app see it
                break
            chunks.append(msg.get("body", b""))
            size += len(chunks[-1])
            if size > limit:
                await _too_large(send, size, limit, at_least=True)
                return
            if not msg.get("more_body", False):
                break
        body, replayed = b"".join(chunks), False

        async def replay():
            nonlocal replayed
            if not replayed:
                replayed = True
                return {"type": "http.request", "body": body, "more_body": False}
            return await receive()

        await self.app(scope, replay, send)


async def _json(send, status: int, field: str, message: str) -> None:
    import json

    payload = json.dumps({"error": f"{field}: {message}", "field": field}).encode()
    await send({"type": "http.response.start", "status": status,
                "headers": [(b"content-type", b"application/json"),
                            (b"content-length", str(len(payload)).encode())]})
    await send({"type": "http.response.body", "body": payload})


async def _too_large(send, size: int, limit: int, at_least: bool = False) -> None:
    more = "more than " if at_least else ""
    await _json(send, 413, "body", f"request body is {more}{size} bytes; the limit is {limit} "
                                   "(limits.max_body_bytes)")
