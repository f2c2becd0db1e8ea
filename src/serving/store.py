"""The interaction log: every routed request and every feedback, append-only and durable.

    store = open_store("runs/serve/interactions.sqlite")       # SQLite, WAL, synchronous=FULL
    store = open_store("postgresql+psycopg://user@host/db")    # any SQLAlchemy URL
    store.log_interaction(Interaction(...))   # returns after COMMIT: only then is it acknowledged
    store.add_feedback(interaction_id, 0.8)   # validated: unknown id / shadow / duplicate / range
    store.export_jsonl("train.jsonl")         # one line per interaction, its reward joined

Tables, columns, the append-only triggers and the migrations of older logs:
`serving.store_schema`.

Durability: SQLite runs in WAL mode with `synchronous=FULL` (an fsync of the WAL at every
COMMIT), and `log_interaction` / `add_feedback` return only after COMMIT, so the API
acknowledges (2xx) only rows that survive a process kill *and* a power cut. NORMAL would still
survive a SIGKILL (the WAL is in the OS page cache) but not a power cut. FULL costs one fsync
per commit (docs/design-notes.md; durability: tests/test_serving_crash.py).
"""

from __future__ import annotations

import json
import math
import os
import sqlite3
import threading
import time
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from rag.errors import ConfigError
from rl.promotion.evidence import pii_leaks_of
from serving import store_schema as schema
from serving.store_schema import StoreError


@dataclass
class Interaction:
    """One routed request (or one shadow answer). Latency in ms per stage."""

    id: str
    question: str
    variant_id: str
    route: str
    propensity: float
    answer: str
    category: str = "default"
    ts: float = field(default_factory=time.time)
    features: dict[str, Any] = field(default_factory=dict)
    context_ids: list[str] = field(default_factory=list)
    citations: list[int] = field(default_factory=list)
    latency_ms: dict[str, float] = field(default_factory=dict)
    tokens_in: int = 0
    tokens_out: int = 0
    shadow: bool = False
    parent_id: str | None = None
    scores: dict[str, float] | None = None
    error: bool = False
    """The pipeline call failed (no answer was returned to the user)."""
    policy_id: str | None = None
    """The per-query policy that chose this config (route `policy`), else None."""
    arm: int | None = None
    """Index of the chosen arm in that policy's portfolio (drawn with `propensity`)."""
    features_hash: str | None = None
    """12 hex of the features the policy decided on (serving.policy_router.features_hash)."""

    def to_row(self) -> dict[str, Any]:
        row = asdict(self)
        for c in schema.JSON_COLUMNS:
            row[c] = None if row[c] is None else json.dumps(row[c], sort_keys=True)
        row["shadow"] = int(self.shadow)
        row["error"] = int(self.error)
        return row


@dataclass(frozen=True)
class FeedbackAck:
    """What a stored feedback joined to: lets the caller update the bandit and metrics."""

    interaction_id: str
    reward: float
    variant_id: str
    route: str
    category: str
    pii_leaks: float = 0.0
    """`scores.pii_leaks` of the rated interaction (0 when not measured)."""


class InteractionStore:
    """SQL shared by both backends (named `:params` work in sqlite3 and SQLAlchemy `text`)."""

    url: str

    # backend hooks ------------------------------------------------------------------------
    def _write(self, statements: list[tuple[str, dict[str, Any]]]) -> None:
        raise NotImplementedError

    def _read(self, sql: str, params: dict[str, Any] | None = None) -> list[tuple]:
        raise NotImplementedError

    def _iter(self, sql: str) -> Iterator[tuple]:
        yield from self._read(sql)

    def _is_integrity_error(self, exc: Exception) -> bool:
        raise NotImplementedError

    def close(self) -> None:
        """Release connections."""

    # API -------------------------------------------------------------------------------------
    def log_interaction(self, it: Interaction) -> None:
        """Insert one row and commit; returns only once it is durable."""
        cols = ", ".join(schema.COLUMNS)
        vals = ", ".join(f":{c}" for c in schema.COLUMNS)
        self._write([(f"INSERT INTO interactions ({cols}) VALUES ({vals})", it.to_row())])

    def get_interaction(self, interaction_id: str) -> dict[str, Any] | None:
        """One row as `export_jsonl` writes it (its signals merged), without the feedback."""
        rows = self._read(f"{schema.ROW_QUERY} WHERE i.id = :id", {"id": interaction_id})
        return schema.decode_row(rows[0]) if rows else None

    def add_signals(self, interaction_id: str, scores: dict[str, float], ms: float) -> None:
        """Append the reference-free signals of a stored interaction (`scores`: name -> value;
        `ms`: time spent scoring) and commit. Raises StoreError naming `interaction_id` when
        it is unknown (404) or already has signals (409)."""
        try:
            self._write([("INSERT INTO signals VALUES (:iid, :ts, :scores, :ms)",
                          {"iid": interaction_id, "ts": time.time(), "ms": float(ms),
                           "scores": json.dumps(scores, sort_keys=True)})])
        except Exception as exc:
            if not self._is_integrity_error(exc):
                raise
            known = self.get_interaction(interaction_id) is not None
            raise StoreError("interaction_id", f"signals of {interaction_id!r} were already "
                             "recorded" if known else f"unknown interaction {interaction_id!r}",
                             409 if known else 404) from None

    def add_feedback(self, interaction_id: str, reward: float) -> FeedbackAck:
        """Validate and store one reward in [0, 1] for a served (non-shadow) interaction.
        Raises StoreError naming the field: 404 unknown id, 409 already rated or a request
        that failed (the user got no answer to rate, and the bandit must not learn a reward for
        one), 422 shadow id or reward out of range. Nothing already stored is touched."""
        if not isinstance(reward, int | float) or not math.isfinite(reward) \
                or not 0.0 <= reward <= 1.0:
            raise StoreError("reward", f"must be a number in [0, 1], got {reward!r}")
        rows = self._read("SELECT variant_id, route, category, shadow, scores, error FROM "
                          "interactions WHERE id = :id", {"id": interaction_id})
        if not rows:
            raise StoreError("interaction_id", f"unknown interaction {interaction_id!r}", 404)
        variant, route, category, shadow, scores, error = rows[0]
        if shadow:
            raise StoreError("interaction_id", "is a shadow interaction (never shown to a "
                                               "user); rate the served one", 422)
        if error:
            raise StoreError("interaction_id", "failed (the request got an error, not an "
                                               "answer): there is nothing to rate", 409)
        try:
            self._write([("INSERT INTO feedback (interaction_id, reward, ts) VALUES "
                          "(:iid, :reward, :ts)",
                          {"iid": interaction_id, "reward": float(reward), "ts": time.time()})])
        except Exception as exc:
            if self._is_integrity_error(exc):
                raise StoreError("interaction_id", f"feedback for {interaction_id!r} was "
                                                   "already recorded", 409) from None
            raise
        return FeedbackAck(interaction_id, float(reward), variant, route, category,
                           pii_leaks_of(scores))

    def counts(self) -> dict[str, int]:
        (n, ns), = self._read("SELECT COUNT(*), COALESCE(SUM(shadow), 0) FROM interactions")
        (nf,), = self._read("SELECT COUNT(*) FROM feedback")
        return {"interactions": int(n) - int(ns), "shadow_interactions": int(ns),
                "feedback": int(nf)}

    def variant_summary(self) -> list[dict[str, Any]]:
        """Per (variant, route, shadow): requests, rewarded requests, mean reward and a 95%
        normal-approximation CI of it."""
        rows = self._read(
            "SELECT i.variant_id, i.route, i.shadow, COUNT(*), COUNT(f.reward), AVG(f.reward),"
            " SUM(f.reward * f.reward), SUM(i.error) FROM interactions i LEFT JOIN feedback f"
            " ON f.interaction_id = i.id GROUP BY i.variant_id, i.route, i.shadow"
            " ORDER BY i.variant_id, i.route")
        out = []
        for variant, route, shadow, n, nf, mean, sq, errors in rows:
            lo = hi = None
            if nf and nf >= 2:
                var = max((sq - nf * mean * mean) / (nf - 1), 0.0)
                half = 1.96 * math.sqrt(var / nf)
                lo, hi = mean - half, mean + half
            out.append({"variant_id": variant, "route": "shadow" if shadow else route,
                        "requests": int(n), "pulls": int(nf), "mean_reward": mean,
                        "ci_low": lo, "ci_high": hi, "errors": int(errors or 0)})
        return out

    def bandit_history(self, pii_leaks: bool = False) -> list[tuple]:
        """(category, variant, reward) of every rewarded bandit-routed request, in order;
        with `pii_leaks`, (category, variant, reward, scores.pii_leaks) (0 when absent)."""
        rows = self._read(
            "SELECT i.category, i.variant_id, f.reward, i.scores FROM feedback f JOIN "
            "interactions i ON i.id = f.interaction_id WHERE i.route = 'bandit' ORDER BY f.seq")
        if pii_leaks:
            return [(c, v, float(r), pii_leaks_of(sc)) for c, v, r, sc in rows]
        return [(c, v, float(r)) for c, v, r, _ in rows]

    def bandit_feedback_since(self, seq: int) -> list[tuple]:
        """(feedback seq, ts, category, variant, reward, pii_leaks) of rewarded bandit-routed
        requests with seq > `seq`, in seq order: how ingress replicas replay each other's
        feedback (serving.replica_sync)."""
        rows = self._read(
            "SELECT f.seq, f.ts, i.category, i.variant_id, f.reward, i.scores FROM feedback f "
            "JOIN interactions i ON i.id = f.interaction_id WHERE f.seq > :seq AND "
            "i.route = 'bandit' ORDER BY f.seq", {"seq": int(seq)})
        return [(int(q), float(t), c, v, float(r), pii_leaks_of(sc))
                for q, t, c, v, r, sc in rows]

    def save_routing(self, fingerprint: str, action: str, state: dict[str, Any]) -> None:
        """Append the router's state after a change (`action` says which: `admin/traffic`,
        `rollout/advance`, ...); `fingerprint` identifies the YAML routing it was made on."""
        self._write([("INSERT INTO routing (ts, fingerprint, action, state) VALUES "
                      "(:ts, :fp, :action, :state)",
                      {"ts": time.time(), "fp": fingerprint, "action": action,
                       "state": json.dumps(state, sort_keys=True)})])

    def last_routing(self) -> dict[str, Any] | None:
        """The newest routing row as {seq, ts, fingerprint, action, state}, or None."""
        rows = self._read("SELECT seq, ts, fingerprint, action, state FROM routing "
                          "ORDER BY seq DESC LIMIT 1")
        if not rows:
            return None
        seq, ts, fp, action, state = rows[0]
        return {"seq": int(seq), "ts": float(ts), "fingerprint": fp, "action": action,
                "state": json.loads(state)}

    def save_job(self, job_id: str, record: dict[str, Any]) -> None:
        """Append a tuner job's state (`serving.jobs.Job.to_dict()`), so that every ingress
        replica can answer `GET /tuner/jobs/{id}`, not only the one that took the job."""
        self._write([("INSERT INTO tuner_jobs (job_id, ts, record) VALUES (:id, :ts, :rec)",
                      {"id": job_id, "ts": time.time(),
                       "rec": json.dumps(record, sort_keys=True, default=str)})])

    def get_job(self, job_id: str) -> dict[str, Any] | None:
        """The newest stored state of a tuner job, or None."""
        rows = self._read("SELECT record FROM tuner_jobs WHERE job_id = :id ORDER BY seq DESC "
                          "LIMIT 1", {"id": job_id})
        return json.loads(rows[0][0]) if rows else None

    def save_replica_metrics(self, replica: str, body: str) -> None:
        """Overwrite `replica`'s metrics snapshot (JSON text, serving.metrics) with the time
        now; rows of replicas silent for a day are dropped."""
        now = time.time()
        self._write([("INSERT INTO replica_metrics (replica, ts, body) VALUES (:r, :ts, :b) "
                      "ON CONFLICT (replica) DO UPDATE SET ts = excluded.ts, body = excluded.body",
                      {"r": replica, "ts": now, "b": body}),
                     ("DELETE FROM replica_metrics WHERE ts < :cut", {"cut": now - 86400.0})])

    def replica_metrics(self, since: float) -> dict[str, str]:
        """replica -> its snapshot (JSON text) for every replica that wrote at or after
        `since` (Unix seconds)."""
        return dict(self._read("SELECT replica, body FROM replica_metrics WHERE ts >= :since",
                               {"since": float(since)}))

    def export_jsonl(self, path: str | Path, include_shadow: bool = True) -> int:
        """Write one JSON line per interaction (oldest first) with its `reward` and
        `feedback_ts` (null when unrated), and its signals (`add_signals`) merged into `scores`
        and `latency_ms.signals` (a row whose signals are not stored yet has neither: the
        rollout's evidence counts it under quality `none`). Returns the number of lines. The
        file appears whole or not at all (written beside it, then renamed): an export that
        fails on a malformed row (StoreError naming it) leaves no partial file and `path` as
        it was."""
        p = Path(path)
        p.parent.mkdir(parents=True, exist_ok=True)
        where = "" if include_shadow else " WHERE i.shadow = 0"
        sql = (f"SELECT {schema.SELECT_ROW}, f.reward, f.ts FROM {schema.JOIN_ROW} LEFT JOIN "
               f"feedback f ON f.interaction_id = i.id{where} ORDER BY i.ts, i.id")
        n = 0
        tmp = p.with_name(f".{p.name}.{os.getpid()}.tmp")
        try:
            with tmp.open("w", encoding="utf-8") as out:
                for row in self._iter(sql):
                    rec = schema.decode_row(row[:-2])
                    rec["reward"], rec["feedback_ts"] = row[-2:]
                    out.write(json.dumps(rec, ensure_ascii=False) + "\n")
                    n += 1
            os.replace(tmp, p)
        finally:
            tmp.unlink(missing_ok=True)
        return n


class _Write:
    """One caller's statements waiting for a group commit (SQLiteStore._write)."""

    __slots__ = ("statements", "done", "error")

    def __init__(self, statements: list[tuple[str, dict[str, Any]]]):
        self.statements, self.done, self.error = statements, False, None


class SQLiteStore(InteractionStore):
    """One connection in WAL mode; `synchronous=FULL` by default so an acknowledged row
    survives a power cut, not only a process crash.

    Group commit: concurrent writers (the ingress writes from worker threads) share one
    transaction, hence one fsync of the WAL. A writer queues its statements and takes the
    connection lock; whoever holds it commits every queued write, each inside its own
    SAVEPOINT, so one write's error (a duplicate feedback: IntegrityError -> 409) undoes only
    that write and is raised to its own caller. Every caller still returns only after the
    COMMIT that made its rows durable (or raises). With one writer at a time this is exactly
    one transaction per write, as before; under load (16 clients) an fsync costs ~6 ms here and
    commits serialise across ingress replicas on the file's write lock, so batching them
    shortens the queue behind the lock."""

    def __init__(self, path: str | Path, synchronous: str = "FULL", create: bool = True):
        """`create` False: the store must already exist (a reader: `export-interactions`);
        a missing file or one without the interactions table is a ConfigError, and nothing
        is created."""
        self.path = Path(path)
        if not create:
            _require_sqlite_store(self.path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.url = str(self.path)
        self._lock = threading.Lock()
        self._queue: list[_Write] = []
        self._queue_lock = threading.Lock()
        self._db = sqlite3.connect(str(self.path), check_same_thread=False, timeout=30.0,
                                   isolation_level=None)
        self._db.execute("PRAGMA journal_mode=WAL")
        self._db.execute(f"PRAGMA synchronous={synchronous}")
        self._db.execute("PRAGMA foreign_keys=ON")
        for stmt in schema.SQLITE_DDL:
            self._db.execute(stmt)
        cols = {r[1] for r in self._db.execute("PRAGMA table_info(interactions)")}
        for col, ddl in schema.MIGRATIONS.items():
            if col not in cols:
                self._db.execute(ddl)

    def _write(self, statements: list[tuple[str, dict[str, Any]]]) -> None:
        job = _Write(statements)
        with self._queue_lock:
            self._queue.append(job)
        with self._lock:
            if not job.done:  # else an earlier holder committed it while we waited
                with self._queue_lock:
                    batch, self._queue = self._queue, []
                self._commit(batch)
        if job.error is not None:
            raise job.error

    def _commit(self, batch: list[_Write]) -> None:
        """All of `batch` in one transaction, one SAVEPOINT per write (holding `_lock`)."""
        try:
            self._db.execute("BEGIN IMMEDIATE")
            try:
                for job in batch:
                    self._db.execute("SAVEPOINT w")
                    try:
                        for sql, params in job.statements:
                            self._db.execute(sql, params)
                    except Exception as exc:  # this write only: undo it, keep the others
                        job.error = exc
                        self._db.execute("ROLLBACK TO w")
                    self._db.execute("RELEASE w")
                self._db.execute("COMMIT")
            except BaseException:
                if self._db.in_transaction:
                    self._db.execute("ROLLBACK")
                raise
        except BaseException as exc:  # nothing of the batch is stored: every caller hears it
            for job in batch:
                job.error = job.error or exc
            if not isinstance(exc, Exception):
                for job in batch:
                    job.done = True
                raise
        finally:
            for job in batch:
                job.done = True

    def _read(self, sql: str, params: dict[str, Any] | None = None) -> list[tuple]:
        with self._lock:
            return self._db.execute(sql, params or {}).fetchall()

    def _is_integrity_error(self, exc: Exception) -> bool:
        return isinstance(exc, sqlite3.IntegrityError)

    def close(self) -> None:
        with self._lock:
            self._db.close()


def _require_sqlite_store(path: Path) -> None:
    """ConfigError unless `path` is an SQLite file holding the interactions table."""
    if not path.is_file():
        raise ConfigError("store_url", f"no interaction store at {path} (the Serve app writes "
                                       "one at its store_url, default "
                                       "runs/serve/interactions.sqlite)")
    try:
        db = sqlite3.connect(f"file:{path.resolve()}?mode=ro", uri=True)
        try:
            found = db.execute("SELECT 1 FROM sqlite_master WHERE type = 'table' AND "
                               "name = 'interactions'").fetchone()
        finally:
            db.close()
    except sqlite3.DatabaseError as exc:
        raise ConfigError("store_url", f"{path} is not an SQLite database ({exc})") from None
    if not found:
        raise ConfigError("store_url", f"{path} is an SQLite database without an interactions "
                                       "table: not an interaction store")


class SQLAlchemyStore(InteractionStore):
    """Any SQLAlchemy URL (PostgreSQL in production; `sqlite:///` works for tests)."""

    def __init__(self, url: str, create: bool = True):
        """`create` False: the database must already hold the interactions table (a reader);
        otherwise a ConfigError, and no table is created."""
        try:
            import sqlalchemy as sa
        except ImportError:
            raise ConfigError("store_url", f"{url.split(':', 1)[0]} URLs need SQLAlchemy and "
                                           "a driver (pip install sqlalchemy psycopg)") from None
        self.url, self._sa = url, sa
        scheme = url.split(":", 1)[0]
        try:
            self._engine = sa.create_engine(url, pool_pre_ping=True)
        except ImportError as exc:
            raise ConfigError("store_url", f"the {scheme} driver is not installed ({exc}); "
                                           "e.g. pip install 'psycopg[binary]'") from None
        except (sa.exc.ArgumentError, sa.exc.NoSuchModuleError) as exc:
            raise ConfigError("store_url", f"not a usable database URL {url!r}: {exc}") from None
        ddl = schema.SQLITE_DDL if self._engine.dialect.name == "sqlite" else schema.PG_DDL
        if not create:
            db = self._engine.url.database
            if self._engine.dialect.name == "sqlite" and db and db != ":memory:":
                _require_sqlite_store(Path(db))  # before connecting creates the file
        try:
            with self._engine.begin() as conn:
                if not create and not sa.inspect(conn).has_table("interactions"):
                    shown = self._engine.url.render_as_string(hide_password=True)
                    raise ConfigError("store_url", f"{shown} holds no interactions table: "
                                                   "not an interaction store")
                if self._engine.dialect.name == "sqlite":
                    conn.exec_driver_sql("PRAGMA journal_mode=WAL")
                for stmt in ddl:
                    conn.exec_driver_sql(stmt)
                cols = {c["name"] for c in sa.inspect(conn).get_columns("interactions")}
                for col, ddl in schema.MIGRATIONS.items():
                    if col not in cols:
                        conn.exec_driver_sql(ddl)
        except sa.exc.OperationalError as exc:
            raise ConfigError("store_url", f"cannot connect to {scheme} store: "
                                           f"{str(exc).splitlines()[0]}") from None

    def _write(self, statements: list[tuple[str, dict[str, Any]]]) -> None:
        with self._engine.begin() as conn:  # commits on exit, rolls back on error
            for sql, params in statements:
                conn.execute(self._sa.text(sql), params)

    def _read(self, sql: str, params: dict[str, Any] | None = None) -> list[tuple]:
        with self._engine.connect() as conn:
            return [tuple(r) for r in conn.execute(self._sa.text(sql), params or {})]

    def _is_integrity_error(self, exc: Exception) -> bool:
        return isinstance(exc, self._sa.exc.IntegrityError)

    def close(self) -> None:
        self._engine.dispose()


STORE_SCHEMES = ("sqlite", "postgresql", "postgres")
"""SQLAlchemy URL schemes a store URL may name (`postgresql+psycopg://...` included)."""


def check_store_url(url: str | Path, field: str = "store_url") -> str:
    """`url` as a store URL, else ConfigError `field`: empty, a directory (a path must name
    the SQLite file) or a URL scheme no store speaks. Opens nothing: the Serve app checks its
    `store_url` before Ray starts, `open_store` before it connects."""
    s = str(url)
    if not s:
        raise ConfigError(field, "must be a path or a database URL")
    if "://" in s:
        scheme = s.split("://", 1)[0].split("+", 1)[0]
        if scheme not in STORE_SCHEMES:
            raise ConfigError(field, f"{scheme!r} is not a supported database (an SQLite path, "
                                     f"or {', '.join(STORE_SCHEMES)} URLs)")
    elif Path(s).is_dir():
        raise ConfigError(field, f"{s} is a directory; name the SQLite file (e.g. "
                                 "runs/serve/interactions.sqlite)")
    return s


def open_store(url: str | Path, create: bool = True) -> InteractionStore:
    """A path (or `sqlite://` URL without a driver suffix) -> SQLiteStore; any other URL with
    `://` -> SQLAlchemyStore (PostgreSQL etc.). `create` False: open an existing store only
    (readers: a mistyped path is a ConfigError, not an empty store). `check_store_url` first."""
    s = check_store_url(url)
    if "://" not in s:
        return SQLiteStore(s, create=create)
    return SQLAlchemyStore(s, create=create)
