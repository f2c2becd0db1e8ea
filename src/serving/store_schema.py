"""The interaction log's schema (serving.store): columns, tables, DDL for SQLite and
PostgreSQL, the migrations of older logs, how a stored row is read back (`ROW_QUERY`,
`decode_row`: an interaction with its signals merged) and `StoreError`.

Tables (never UPDATEd or DELETEd: SQLite and PostgreSQL triggers reject both):
  interactions(id, ts, question, category, variant_id, route, propensity, features JSON,
               context_ids JSON, citations JSON, answer, latency_ms JSON, tokens_in, tokens_out,
               shadow, parent_id, scores JSON, error, policy_id, arm, features_hash)
  feedback(seq, interaction_id UNIQUE -> interactions.id, reward in [0, 1], ts)
  signals(interaction_id PRIMARY KEY -> interactions.id, ts, scores JSON, ms)   the
               reference-free signals of a gold-less answer, appended after its row (scored
               once the user has the answer: serving.routes_query); exports merge them into
               the row's `scores` and `latency_ms.signals`
  routing(seq, ts, fingerprint, action, state JSON)   the router's split after every admin or
               rollout change, so a restarted app serves what it served (serving.routing_state)
  replica_metrics(replica PRIMARY KEY, ts, body JSON)   the newest metrics snapshot of each
               ingress replica (serving.metrics.MetricsPublisher): the one table whose rows
               are overwritten (and deleted a day after their replica stopped writing)
`ts` is Unix time in seconds; latency in ms per stage; `shadow`=1 rows are mirrored answers
(never returned to the user), `parent_id` names the served interaction they mirror; `error`=1
rows are requests whose pipeline call failed (the caller got a 5xx; answer empty), so the
rollout's burn-rate check sees real error rates in exports.

`policy_id`, `arm`, `features_hash` (nullable) are set on rows a per-query policy routed
(route `policy`, serving.policy_router): which policy decided, the index of the arm it drew
(with probability `propensity`) and a 12-hex hash of the features it decided on (the vector
itself is `features.policy_x`), so a candidate policy can be evaluated off-policy from the log.

Migration: opening an older SQLite/PostgreSQL log adds `error INTEGER NOT NULL DEFAULT 0` and
the nullable `policy_id TEXT`, `arm INTEGER`, `features_hash TEXT` (ALTER TABLE ... ADD COLUMN;
existing rows read as 0 / NULL), and the `signals` table is created where it is missing. The
append-only triggers stay: they guard UPDATE/DELETE of rows, not DDL.
"""

from __future__ import annotations

import json
from typing import Any

from serving.schemas import ApiError


class StoreError(ApiError):
    """Bad feedback. `field` names the offending request field; `status` is the HTTP code."""


JSON_COLUMNS = ("features", "context_ids", "citations", "latency_ms", "scores")
COLUMNS = ("id", "ts", "question", "category", "variant_id", "route", "propensity", "features",
           "context_ids", "citations", "answer", "latency_ms", "tokens_in", "tokens_out",
           "shadow", "parent_id", "scores", "error", "policy_id", "arm", "features_hash")

APPEND_ONLY = ("interactions", "feedback", "signals", "routing", "tuner_jobs")
"""Tables whose rows are only ever added (a job's state change is a new `tuner_jobs` row);
`replica_metrics` is the one that is not."""

REPLICA_METRICS_DDL = """CREATE TABLE IF NOT EXISTS replica_metrics (
        replica TEXT PRIMARY KEY, ts REAL NOT NULL, body TEXT NOT NULL)"""

SIGNALS_DDL = """CREATE TABLE IF NOT EXISTS signals (
        interaction_id TEXT PRIMARY KEY REFERENCES interactions(id), ts REAL NOT NULL,
        scores TEXT NOT NULL, ms REAL NOT NULL)"""

SQLITE_DDL = [
    """CREATE TABLE IF NOT EXISTS interactions (
        id TEXT PRIMARY KEY, ts REAL NOT NULL, question TEXT NOT NULL, category TEXT NOT NULL,
        variant_id TEXT NOT NULL, route TEXT NOT NULL, propensity REAL NOT NULL,
        features TEXT NOT NULL, context_ids TEXT NOT NULL, citations TEXT NOT NULL,
        answer TEXT NOT NULL, latency_ms TEXT NOT NULL, tokens_in INTEGER NOT NULL,
        tokens_out INTEGER NOT NULL, shadow INTEGER NOT NULL, parent_id TEXT, scores TEXT,
        error INTEGER NOT NULL DEFAULT 0, policy_id TEXT, arm INTEGER, features_hash TEXT)""",
    """CREATE TABLE IF NOT EXISTS feedback (
        seq INTEGER PRIMARY KEY AUTOINCREMENT,
        interaction_id TEXT NOT NULL UNIQUE REFERENCES interactions(id),
        reward REAL NOT NULL CHECK (reward >= 0 AND reward <= 1), ts REAL NOT NULL)""",
    "CREATE INDEX IF NOT EXISTS interactions_variant ON interactions(variant_id, route)",
    """CREATE TABLE IF NOT EXISTS routing (
        seq INTEGER PRIMARY KEY AUTOINCREMENT, ts REAL NOT NULL, fingerprint TEXT NOT NULL,
        action TEXT NOT NULL, state TEXT NOT NULL)""",
    """CREATE TABLE IF NOT EXISTS tuner_jobs (
        seq INTEGER PRIMARY KEY AUTOINCREMENT, job_id TEXT NOT NULL, ts REAL NOT NULL,
        record TEXT NOT NULL)""",
    "CREATE INDEX IF NOT EXISTS tuner_jobs_id ON tuner_jobs(job_id, seq)",
    SIGNALS_DDL,
    *[f"""CREATE TRIGGER IF NOT EXISTS {t}_no_{op} BEFORE {op.upper()} ON {t}
          BEGIN SELECT RAISE(ABORT, '{t} is append-only'); END"""
      for t in APPEND_ONLY for op in ("update", "delete")],
    REPLICA_METRICS_DDL,
]
PG_DDL = [
    SQLITE_DDL[0].replace(" REAL", " DOUBLE PRECISION"),
    SQLITE_DDL[1].replace("INTEGER PRIMARY KEY AUTOINCREMENT", "BIGSERIAL PRIMARY KEY")
                  .replace(" REAL", " DOUBLE PRECISION"),
    SQLITE_DDL[2],
    *[SQLITE_DDL[i].replace("INTEGER PRIMARY KEY AUTOINCREMENT", "BIGSERIAL PRIMARY KEY")
                    .replace(" REAL", " DOUBLE PRECISION") for i in (3, 4)],
    SQLITE_DDL[5],
    SIGNALS_DDL.replace(" REAL", " DOUBLE PRECISION"),
    """CREATE OR REPLACE FUNCTION ragpilot_append_only() RETURNS trigger AS $$
       BEGIN RAISE EXCEPTION USING MESSAGE = TG_TABLE_NAME || ' is append-only'; END $$ LANGUAGE plpgsql""",
    *[f"""CREATE OR REPLACE TRIGGER {t}_append_only BEFORE UPDATE OR DELETE ON {t}
          FOR EACH ROW EXECUTE FUNCTION ragpilot_append_only()"""
      for t in APPEND_ONLY],
    REPLICA_METRICS_DDL.replace(" REAL", " DOUBLE PRECISION"),
]

MIGRATIONS = {"error": "ALTER TABLE interactions ADD COLUMN error INTEGER NOT NULL DEFAULT 0",
               "policy_id": "ALTER TABLE interactions ADD COLUMN policy_id TEXT",
               "arm": "ALTER TABLE interactions ADD COLUMN arm INTEGER",
               "features_hash": "ALTER TABLE interactions ADD COLUMN features_hash TEXT"}
"""Migration of logs written before these columns existed (existing rows: 0 / NULL)."""

SELECT_ROW = ", ".join([*("i." + c for c in COLUMNS), "s.scores", "s.ms"])
JOIN_ROW = "interactions i LEFT JOIN signals s ON s.interaction_id = i.id"
ROW_QUERY = f"SELECT {SELECT_ROW} FROM {JOIN_ROW}"
"""An interaction's columns and its signals', which `decode_row` reads."""


def decode_row(row: tuple) -> dict[str, Any]:
    """A row of SELECT_ROW as a dict: JSON decoded; its signals, when stored, merged into
    `scores` and `latency_ms.signals`. A malformed JSON value raises StoreError naming it."""
    rec = dict(zip((*COLUMNS, "signals", "signals_ms"), row, strict=True))
    for c in (*JSON_COLUMNS, "signals"):
        if rec[c] is not None:
            try:
                rec[c] = json.loads(rec[c])
            except json.JSONDecodeError as exc:
                where = "signals.scores" if c == "signals" else f"interactions.{c}"
                raise StoreError(where, f"interaction {rec['id']!r}: malformed JSON "
                                        f"({exc.msg})") from None
    sig, ms = rec.pop("signals"), rec.pop("signals_ms")
    if sig is not None:
        rec["scores"] = {**(rec["scores"] or {}), **sig}
        rec["latency_ms"] = {**rec["latency_ms"], "signals": float(ms)}
    rec["shadow"] = bool(rec["shadow"])
    rec["error"] = bool(rec["error"])
    return rec
