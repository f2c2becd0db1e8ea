"""Backpressure: a bounded number of requests in flight and a token bucket per client.

Both answer "no" instantly with the number of seconds after which a retry can succeed, which
the ingress returns as `429 Too Many Requests` with a `Retry-After` header (whole seconds,
rounded up, at least 1). Thread-safe; time comes from an injectable clock (seconds) for tests.
`BodyLimitMiddleware` refuses oversized request bodies (413) before anything parses them, and
bodies FastAPI would refuse with a message naming neither the cause nor the fix
(`check_json_body`: not JSON by its Content-Type, not UTF-8, nested too deep).
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
                await send_error(send, 400, "content-length", "must be a whole number of bytes")
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
        bad = check_json_body(scope, body)
        if bad is not None:
            await send_error(send, *bad)
            return

        async def replay():
            nonlocal replayed
            if not replayed:
                replayed = True
                return {"type": "http.request", "body": body, "more_body": False}
            return await receive()

        await self.app(scope, replay, send)


MAX_JSON_DEPTH = 32
"""Deepest nesting of arrays and objects a request body may have (the API's own bodies nest
at most 4 deep; Python's JSON parser fails past ~1,000 levels with a generic error)."""


def check_json_body(scope, body: bytes) -> tuple[int, str, str] | None:
    """(status, field, message) for a request body the JSON routes cannot read, else None:
    415 `content-type` when a body is sent as something other than JSON, 400 `body` when it
    is not UTF-8 (naming the byte offset) or nests deeper than MAX_JSON_DEPTH. A request
    without a body passes (the route says what it needs)."""
    if not body.strip() or scope.get("method") not in ("POST", "PUT", "PATCH"):
        return None
    ctype = next((v.decode("latin-1") for k, v in scope.get("headers", ())
                  if k == b"content-type"), "")
    media = ctype.split(";")[0].strip().lower()
    if media != "application/json" and not media.endswith("+json"):
        return (415, "content-type", f"is {media or 'missing'!r}; this API reads JSON bodies: "
                                     "send the body with `Content-Type: application/json`")
    try:
        body.decode("utf-8")
    except UnicodeDecodeError as exc:
        return (400, "body", f"is not valid UTF-8 (byte {exc.start}: 0x{body[exc.start]:02x}); "
                             "encode the JSON body as UTF-8")
    depth = _json_depth(body) if body.count(b"[") + body.count(b"{") > MAX_JSON_DEPTH else 0
    if depth > MAX_JSON_DEPTH:
        return (400, "body", f"JSON nests {depth}+ levels deep; the limit is "
                             f"{MAX_JSON_DEPTH} (arrays and objects inside each other)")
    return None


def _json_depth(body: bytes) -> int:
    """Deepest array/object nesting of a JSON text (brackets inside strings ignored); stops
    counting one past MAX_JSON_DEPTH."""
    depth = deepest = 0
    in_str = escaped = False
    for b in body:
        if in_str:
            if escaped:
                escaped = False
            elif b == 0x5C:  # backslash
                escaped = True
            elif b == 0x22:  # quote
                in_str = False
        elif b == 0x22:
            in_str = True
        elif b in (0x5B, 0x7B):  # [ {
            depth += 1
            if depth > deepest:
                deepest = depth
                if deepest > MAX_JSON_DEPTH:
                    return deepest
        elif b in (0x5D, 0x7D):
            depth -= 1
    return deepest


async def send_error(send, status: int, field: str, message: str,
                     headers: tuple[tuple[bytes, bytes], ...] = ()) -> None:
    """Answer an ASGI request from a middleware with the API's error body
    (`{"error": "<field>: <message>", "field": <field>}`, as `serving.api`'s handlers give it),
    `status` and any extra `headers` (raw ASGI pairs)."""
    import json

    payload = json.dumps({"error": f"{field}: {message}", "field": field}).encode()
    await send({"type": "http.response.start", "status": status,
                "headers": [(b"content-type", b"application/json"),
                            (b"content-length", str(len(payload)).encode()), *headers]})
    await send({"type": "http.response.body", "body": payload})


async def _too_large(send, size: int, limit: int, at_least: bool = False) -> None:
    more = "more than " if at_least else ""
    await send_error(send, 413, "body", f"request body is {more}{size} bytes; the limit is {limit} "
                                   "(limits.max_body_bytes)")
