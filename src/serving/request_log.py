"""Structured logs of the ingress: one JSON line per request and per admin action.

    {"ts": 1796619097.271, "kind": "request", "replica": "host:4242", "method": "POST",
     "path": "/query", "status": 200, "latency_ms": 12.4, "interaction_id": "9f…",
     "variant": "3fa1c0de12ab", "route": "stable", "key_id": null}
    {"ts": …, "kind": "admin", "replica": …, "action": "admin/traffic", "key_id": "11db98e9",
     "before": {...the router's split...}, "after": {...}}

Written by each ingress replica to its own file `<logs.dir>/requests-<host>-<pid>.jsonl`
(rotated at `logs.max_bytes`, `logs.backups` old files kept), so replicas never interleave
or rotate each other's files. Request lines are sampled (`logs.sample_rate`, default 1.0:
every request); 5xx answers and admin actions are always written. The question text is left
out unless `logs.include_question` (then PII-redacted like the other logs when
`pii.redact_logs`). Fields a handler knows (interaction id, variant, route) reach the line
through `note(...)`, which fills the current request's record (a context variable the
outermost middleware sets per request); the API key's id is noted by serving.auth.
"""

from __future__ import annotations

import contextvars
import json
import logging
import logging.handlers
import random
import time
from pathlib import Path
from typing import Any

_FIELDS: contextvars.ContextVar[dict[str, Any] | None] = contextvars.ContextVar(
    "ragpilot_request_fields", default=None)


def begin() -> dict[str, Any]:
    """A fresh record for the request this task serves (called by the outermost middleware)."""
    fields: dict[str, Any] = {}
    _FIELDS.set(fields)
    return fields


def note(**fields: Any) -> None:
    """Add fields to the current request's log line (no-op outside a request)."""
    current = _FIELDS.get()
    if current is not None:
        current.update(fields)


def noted(name: str) -> Any:
    """A field noted for the current request (None when absent or outside one)."""
    current = _FIELDS.get()
    return None if current is None else current.get(name)


def log_dir(configured: str | None, store_url: str) -> str:
    """The absolute log folder: `configured`, else `logs/` beside an SQLite store, else
    `runs/serve/logs` (relative paths: against the current directory)."""
    where = configured or (str(Path(store_url).parent / "logs") if "://" not in store_url
                           else "runs/serve/logs")
    return str(Path(where).resolve())


class RequestLog:
    """Writes JSON lines to one rotating file. `sample_rate` in [0, 1] applies to requests
    below 500; `rng` is injectable for tests."""

    def __init__(self, directory: str | Path, replica: str, sample_rate: float = 1.0,
                 max_bytes: int = 50_000_000, backups: int = 5,
                 rng: random.Random | None = None):
        self.replica, self.sample_rate = replica, float(sample_rate)
        self._rng = rng or random.Random()
        safe = replica.replace(":", "-").replace("/", "-")
        self.path = Path(directory) / f"requests-{safe}.jsonl"
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._log = logging.getLogger(f"ragpilot.requests.{safe}")
        self._log.propagate = False
        self._log.setLevel(logging.INFO)
        for h in list(self._log.handlers):  # a second app in this process: one file, one handler
            self._log.removeHandler(h)
            h.close()
        handler = logging.handlers.RotatingFileHandler(self.path, maxBytes=max_bytes,
                                                       backupCount=backups, encoding="utf-8")
        handler.setFormatter(logging.Formatter("%(message)s"))
        self._log.addHandler(handler)

    def _write(self, record: dict[str, Any]) -> None:
        self._log.info(json.dumps(record, default=str, separators=(",", ":")))

    def request(self, method: str, path: str, status: int, latency_ms: float,
                fields: dict[str, Any]) -> bool:
        """One request's line (sampled unless it is a 5xx); True when written."""
        if status < 500 and (self.sample_rate <= 0.0 or
                             (self.sample_rate < 1.0 and self._rng.random() >= self.sample_rate)):
            return False
        self._write({"ts": round(time.time(), 3), "kind": "request", "replica": self.replica,
                     "method": method, "path": path, "status": status,
                     "latency_ms": round(latency_ms, 3), **fields})
        return True

    def admin(self, action: str, before: Any, after: Any, key_id: str | None) -> None:
        """One admin action: who (the API key's id), what, and the state before and after."""
        self._write({"ts": round(time.time(), 3), "kind": "admin", "replica": self.replica,
                     "action": action, "key_id": key_id, "before": before, "after": after})

    def close(self) -> None:
        for h in list(self._log.handlers):
            self._log.removeHandler(h)
            h.close()


_CURRENT: list[RequestLog] = []


def install_request_log(log: RequestLog | None) -> None:
    """Make `log` the one the request middleware writes to (the ingress calls this at
    start-up; None: no request log). A function of this module for the reason
    serving.auth.install_guard gives."""
    _CURRENT[:] = [log] if log is not None else []


def current_request_log() -> RequestLog | None:
    return _CURRENT[0] if _CURRENT else None
