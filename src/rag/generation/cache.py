"""On-disk generation cache: SQLite (WAL) in the ragpilot cache dir, keyed by sha256 over
(backend fingerprint, prompt id, rendered prompt, max_new_tokens, temperature). Safe across
processes; a greedy generation is a pure function of that key."""

from __future__ import annotations

import hashlib
import json
import sqlite3
import threading
from pathlib import Path

from rag.models import cache_dir
from rag.types import Generation


def cache_key(*parts: object) -> str:
    return hashlib.sha256(json.dumps(parts, sort_keys=True, default=str).encode()).hexdigest()


class GenerationCache:
    def __init__(self, path: str | Path | None = None):
        self.path = Path(path) if path else cache_dir() / "generations.sqlite"
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._local = threading.local()
        with self._conn() as c:
            c.execute("CREATE TABLE IF NOT EXISTS gen (key TEXT PRIMARY KEY, value TEXT)")

    def _conn(self) -> sqlite3.Connection:
        conn = getattr(self._local, "conn", None)
        if conn is None:
            conn = sqlite3.connect(self.path, timeout=30)
            conn.execute("PRAGMA journal_mode=WAL")
            self._local.conn = conn
        return conn

    def get(self, key: str) -> Generation | None:
        row = self._conn().execute("SELECT value FROM gen WHERE key = ?", (key,)).fetchone()
        if row is None:
            return None
        d = json.loads(row[0])
        return Generation(d["text"], d["raw"], tuple(d["citations"]), d["tokens_in"],
                          d["tokens_out"], cached=True)

    def put(self, key: str, g: Generation) -> None:
        with self._conn() as c:
            c.execute("INSERT OR REPLACE INTO gen VALUES (?, ?)", (key, json.dumps(
                {"text": g.text, "raw": g.raw, "citations": list(g.citations),
                 "tokens_in": g.tokens_in, "tokens_out": g.tokens_out})))
