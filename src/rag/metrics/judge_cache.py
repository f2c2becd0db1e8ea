"""On-disk cache of judge replies, keyed by a content hash.

An LLM judge at temperature 0 is close to, not exactly, a pure function of its prompt (batching
and hardware change the last logits on real servers), and every call costs money or minutes. So
the ragas adapter stores each parsed reply under sha256(endpoint, model, sampling settings,
prompt, output schema): a re-run of the same inputs replays the same verdicts (same scores, zero
calls), and a changed input misses the cache. SQLite in WAL mode, safe across threads and
processes; the default file is `<ragpilot cache>/judge.sqlite` (`RAGPILOT_CACHE`).

`CachedScorer` does the same one level up for whole rows of any scorer (the local
`QualityScorer` caches rows only in memory): scores of an answer computed once are read back by
every later process.
"""

from __future__ import annotations

import hashlib
import json
import sqlite3
import threading
from pathlib import Path
from typing import Any

from rag.models import cache_dir

__all__ = ["JudgeCache", "CachedScorer", "content_key", "scorer_fingerprint"]


def content_key(*parts: Any) -> str:
    """sha256 of the parts' canonical JSON."""
    blob = json.dumps(parts, sort_keys=True, ensure_ascii=False, default=str)
    return hashlib.sha256(blob.encode()).hexdigest()


class JudgeCache:
    """key -> JSON value. `path=None` uses the ragpilot cache dir; ":memory:" keeps it in RAM
    (one connection shared under a lock, for tests and one-off runs)."""

    def __init__(self, path: str | Path | None = None):
        self.memory = str(path) == ":memory:"
        self.path = Path(path) if path and not self.memory else cache_dir() / "judge.sqlite"
        self._local = threading.local()
        self._lock = threading.Lock()
        self._shared: sqlite3.Connection | None = None
        if self.memory:
            self._shared = sqlite3.connect(":memory:", check_same_thread=False)
        else:
            self.path.parent.mkdir(parents=True, exist_ok=True)
        with self._lock:
            conn = self._conn()
            conn.execute("CREATE TABLE IF NOT EXISTS judge (key TEXT PRIMARY KEY, value TEXT)")
            conn.commit()

    def _conn(self) -> sqlite3.Connection:
        if self._shared is not None:
            return self._shared
        conn = getattr(self._local, "conn", None)
        if conn is None:
            conn = sqlite3.connect(self.path, timeout=30)
            conn.execute("PRAGMA journal_mode=WAL")
            self._local.conn = conn
        return conn

    def get(self, key: str) -> Any | None:
        with self._lock:
            row = self._conn().execute("SELECT value FROM judge WHERE key = ?",
                                       (key,)).fetchone()
        return None if row is None else json.loads(row[0])

    def put(self, key: str, value: Any) -> None:
        with self._lock:
            conn = self._conn()
            conn.execute("INSERT OR REPLACE INTO judge VALUES (?, ?)",
                         (key, json.dumps(value, ensure_ascii=False)))
            conn.commit()

    def __len__(self) -> int:
        with self._lock:
            return int(self._conn().execute("SELECT COUNT(*) FROM judge").fetchone()[0])


def scorer_fingerprint(scorer: Any) -> str:
    """What decides a scorer's rows besides its inputs: settings and models."""
    cfg = getattr(scorer, "config", None)
    if cfg is not None and hasattr(cfg, "chat_url"):  # RagasScorer
        return content_key("ragas", cfg.chat_url, cfg.model, cfg.temperature, cfg.seed,
                           cfg.strictness, cfg.contexts, cfg.encoder)
    emb = getattr(scorer, "embedder", None)
    return content_key(type(scorer).__name__, repr(getattr(scorer, "support", None)),
                       getattr(scorer, "relevancy_statement", None),
                       getattr(emb, "encoder_name", None),
                       getattr(scorer, "question_generator", None) is not None)


class CachedScorer:
    """Any scorer with `score_batch(answers, examples)` (`QualityScorer`, `RagasScorer`) whose
    rows persist on disk by content hash of (scorer settings, question, answer text,
    citations, contexts, reference answers, gold ids): a later process scoring the same answers
    reads them back instead of encoding or calling a judge again. `hits`/`misses` count rows."""

    def __init__(self, scorer: Any, cache: JudgeCache | None = None):
        self.scorer = scorer
        self.cache = cache if cache is not None else JudgeCache()
        self.fingerprint = scorer_fingerprint(scorer)
        self.hits = 0
        self.misses = 0

    def _key(self, answer: Any, example: Any) -> str:
        gold = sorted(d for d, g in example.qrels.items() if g > 0) if example and \
            example.qrels else sorted(example.gold_passage_ids) if example else []
        return content_key("row/1", self.fingerprint, answer.question, answer.text,
                           list(answer.citations),
                           [[c.id, c.title, c.text] for c in answer.contexts],
                           list(example.answers) if example else None, gold)

    def score(self, answer: Any, example: Any = None) -> dict[str, float]:
        return self.score_batch([answer], [example])[0]

    def score_batch(self, answers: Any, examples: Any = None) -> list[dict[str, float]]:
        answers = list(answers)
        examples = list(examples) if examples is not None else [None] * len(answers)
        keys = [self._key(a, e) for a, e in zip(answers, examples, strict=True)]
        rows: list[dict[str, float] | None] = [self.cache.get(k) for k in keys]
        todo = [i for i, r in enumerate(rows) if r is None]
        self.hits += len(rows) - len(todo)
        self.misses += len(todo)
        if todo:
            fresh = self.scorer.score_batch([answers[i] for i in todo],
                                            [examples[i] for i in todo])
            for i, row in zip(todo, fresh, strict=True):
                self.cache.put(keys[i], row)
                rows[i] = row
        return [dict(r) for r in rows if r is not None]
