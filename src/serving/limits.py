"""Backpressure: a bounded number of requests in flight and a token bucket per client.

Both answer "no" instantly with the number of seconds after which a retry can succeed, which
the ingress returns as `429 Too Many Requests` with a `Retry-After` header (whole seconds,
rounded up, at least 1). Thread-safe; time comes from an injectable clock (seconds) for tests.
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
