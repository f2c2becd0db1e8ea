"""A per-client token bucket kept in the interaction store, shared by all ingress replicas.

With one ingress replica the in-memory `serving.limits.TokenBucketLimiter` is exact and free;
with several, each would hand out its own `burst` and `rate` (a client balanced over N
replicas would get N times its limit). `StoreTokenBucket` keeps one bucket per client in the
store's `rate_buckets(client, tokens, ts, allowed)` table and refills/takes a token in one
atomic UPSERT ... RETURNING (SQLite >= 3.35, PostgreSQL >= 9.5), so replicas see one bucket.
Same contract as TokenBucketLimiter: `acquire(client)` -> 0.0 (allowed, token taken) or the
seconds until one exists.

SQLite: the buckets live beside the interaction log, in `<log stem>.limits<suffix>` (e.g.
`interactions.limits.sqlite`), WAL mode, `synchronous=OFF` (a bucket is not worth an fsync:
losing the last refill on a power cut only gives clients a fuller bucket). A file of its own
because the log commits with `synchronous=FULL`: sharing its write lock would make every
request's token wait for other requests' fsyncs. The UPSERT then takes ~0.05 ms, so the
ingress calls it inline; PostgreSQL (`blocking` True: a network round trip) is called from a
worker thread.
Time is wall-clock seconds (`time.time`: replicas are processes, monotonic clocks differ).
Buckets idle long enough to be full again are deleted now and then (equivalent to a new
client's full bucket), so the table stays small.
"""

from __future__ import annotations

import sqlite3
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

_DDL = ("CREATE TABLE IF NOT EXISTS rate_buckets (client TEXT PRIMARY KEY, "
        "tokens {real} NOT NULL, ts {real} NOT NULL, allowed INTEGER NOT NULL)")
_TAKE = """INSERT INTO rate_buckets (client, tokens, ts, allowed)
    VALUES (:client, :burst - :cost, :now, 1)
    ON CONFLICT (client) DO UPDATE SET
      tokens = {least}(:burst, rate_buckets.tokens + (:now - rate_buckets.ts) * :rate)
               - CASE WHEN {least}(:burst, rate_buckets.tokens + (:now - rate_buckets.ts)
                               * :rate) >= :cost THEN :cost ELSE 0 END,
      allowed = CASE WHEN {least}(:burst, rate_buckets.tokens + (:now - rate_buckets.ts)
                                  * :rate) >= :cost THEN 1 ELSE 0 END,
      ts = :now
    RETURNING tokens, allowed"""
PRUNE_EVERY = 500
"""Acquires between two deletions of idle (full again) buckets."""


def buckets_path(store_path: str | Path) -> Path:
    """Where a SQLite interaction log's rate buckets live (`a/log.sqlite` ->
    `a/log.limits.sqlite`)."""
    p = Path(store_path)
    return p.with_name(f"{p.stem}.limits{p.suffix}")


class StoreTokenBucket:
    """Per-client token bucket in the store at `url` (a SQLite path or an SQLAlchemy URL):
    `rate` tokens/s refill up to `burst`; one request costs one token."""

    def __init__(self, url: str | Path, rate: float, burst: float,
                 clock: Callable[[], float] = time.time):
        if rate <= 0 or burst < 1:
            raise ValueError("rate must be > 0 and burst >= 1")
        self.rate, self.burst, self.clock = float(rate), float(burst), clock
        self._lock = threading.Lock()
        self._n = 0
        s = str(url)
        self._sa: Any = None
        self.blocking = "://" in s
        """True when an acquire is a network round trip (call it off the event loop)."""
        if "://" not in s:
            self.path = buckets_path(s)
            self._db = sqlite3.connect(str(self.path), check_same_thread=False, timeout=30.0,
                                       isolation_level=None)
            self._db.execute("PRAGMA journal_mode=WAL")
            self._db.execute("PRAGMA synchronous=OFF")
            self._db.execute(_DDL.format(real="REAL"))
            self._sql = _TAKE.format(least="MIN")
        else:
            import sqlalchemy as sa

            self._sa = sa
            self._engine = sa.create_engine(s, pool_pre_ping=True)
            sqlite = self._engine.dialect.name == "sqlite"
            with self._engine.begin() as conn:
                conn.exec_driver_sql(_DDL.format(real="REAL" if sqlite else
                                                 "DOUBLE PRECISION"))
            self._sql = _TAKE.format(least="MIN" if sqlite else "LEAST")

    def _execute(self, sql: str, params: dict[str, Any]) -> list[tuple]:
        if self._sa is None:
            with self._lock:
                return self._db.execute(sql, params).fetchall()
        with self._engine.begin() as conn:
            return [tuple(r) for r in conn.execute(self._sa.text(sql), params)]

    def acquire(self, client: str, cost: float = 1.0) -> float:
        """0.0 when allowed (the token is taken), else seconds until `cost` tokens exist."""
        now = self.clock()
        (tokens, allowed), = self._execute(self._sql, {
            "client": client, "burst": self.burst, "cost": float(cost), "now": now,
            "rate": self.rate})
        self._n += 1
        if self._n % PRUNE_EVERY == 0:
            self._execute("DELETE FROM rate_buckets WHERE ts < :cut",
                          {"cut": now - self.burst / self.rate})
        return 0.0 if allowed else (cost - float(tokens)) / self.rate

    def __len__(self) -> int:
        (n,), = self._execute("SELECT COUNT(*) FROM rate_buckets", {})
        return int(n)

    def close(self) -> None:
        if self._sa is None:
            self._db.close()
        else:
            self._engine.dispose()
