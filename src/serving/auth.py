"""API keys for the Serve app: stored hashed, checked before a request body is read.

    keys = KeyFile("runs/serve/api_keys.json")
    token, rec = keys.create("admin", name="ops")   # the token is shown once, never stored
    keys.verify(token)                              # -> KeyRecord, or None (unknown/revoked)
    keys.revoke(rec.id)

A token is `rpk_<id>_<secret>`: `id` (8 hex) finds the record, `secret` (32 random bytes,
base64url) is checked against `sha256(salt || secret)` with a constant-time compare. A fast
hash is the right tool here: the secret is 256 random bits, not a password, so there is nothing
to brute-force and a slow KDF (scrypt) would only add ~50 ms to every admin call. The file is
written atomically (temp file + rename, mode 0600) under an flock; a running server re-reads
it when its mtime changes, so `ragpilot keys revoke` takes effect on the next request.

Roles: `read` (the /rl/* read endpoints when `auth.protect_reads` is on) and `admin`
(everything else that is not open; admin includes read). Which role a path needs is decided by
`required_role`: an explicit open list, `/rl/*` = read, anything else = admin (default deny, so
a new route is protected until someone opens it on purpose).
"""

from __future__ import annotations

import base64
import contextlib
import fcntl
import hashlib
import hmac
import json
import os
import secrets
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from rag.errors import ConfigError
from rag.jsonrec import check_fields
from serving.limits import send_error
from serving.request_log import note

ROLES = ("read", "admin")
PREFIX = "rpk"
OPEN_PATHS = frozenset({"/query", "/feedback", "/metrics", "/healthz", "/readyz", "/docs",
                        "/openapi.json"})
"""The user path (rate-limited), Prometheus, the liveness and readiness probes and the API
docs."""
OPEN_PREFIXES = ("/docs-assets/",)
"""Swagger UI's own files (serving.api.DOCS_ASSETS)."""
READ_PREFIXES = ("/rl/",)


def required_role(path: str, protect_reads: bool) -> str | None:
    """None (open), `read` or `admin` for a request path."""
    if path in OPEN_PATHS or path.startswith(OPEN_PREFIXES):
        return None
    if path.startswith(READ_PREFIXES) or path.rstrip("/") in ("/rl",):
        return "read" if protect_reads else None
    return "admin"


def role_allows(have: str, need: str) -> bool:
    return ROLES.index(have) >= ROLES.index(need)


@dataclass(frozen=True)
class KeyRecord:
    id: str
    role: str
    salt: str
    hash: str
    name: str = ""
    created: float = 0.0
    revoked: float | None = None

    def public(self) -> dict[str, Any]:
        """What `keys list` shows: never the hash or salt."""
        return {"id": self.id, "role": self.role, "name": self.name, "created": self.created,
                "revoked": self.revoked}


FILE_VERSION = 1
_KEY_FIELDS = {"id": str, "role": str, "salt": str, "hash": str, "name": str,
               "created": (int, float), "revoked": (int, float, type(None))}


def _key_record(k: Any, i: int) -> KeyRecord:
    """The i-th (1-based) entry of a key file's `keys`, each field's type checked (ValueError
    naming the key and field, never a Python signature)."""
    check_fields(k, _KEY_FIELDS, ("id", "role", "salt", "hash"), where=f"key {i}: ")
    if k["role"] not in ROLES:  # a key nobody could check a role against
        raise ValueError(f"key {k['id']!r} has role {k['role']!r} (roles: {', '.join(ROLES)})")
    try:
        bytes.fromhex(k["salt"])
    except ValueError:
        raise ValueError(f"key {k['id']!r}: salt is not hex") from None
    return KeyRecord(**k)


def _digest(salt: str, secret: str) -> str:
    return hashlib.sha256(bytes.fromhex(salt) + secret.encode()).hexdigest()


def parse_token(token: str) -> tuple[str, str] | None:
    """(id, secret) of a well-formed token, else None."""
    parts = token.strip().split("_", 2)
    if len(parts) != 3 or parts[0] != PREFIX or len(parts[1]) != 8 or not parts[2]:
        return None
    return parts[1], parts[2]


class KeyFile:
    """The hashed keys, in one JSON file. Reads are cached until the file's mtime changes."""

    def __init__(self, path: str | Path):
        self.path = Path(path)
        self._stamp: tuple[int, int] | None = None
        self._keys: dict[str, KeyRecord] = {}

    # ---- reading ------------------------------------------------------------------------
    def _load_file(self) -> dict[str, KeyRecord]:
        if not self.path.exists():
            return {}
        try:
            data = json.loads(self.path.read_text() or "{}")
            if not isinstance(data, dict) or not isinstance(data.get("keys", []), list):
                raise ValueError('expected {"version": 1, "keys": [...]}')
            if data.get("version", FILE_VERSION) != FILE_VERSION:
                raise ValueError(f"version {data['version']!r} (this ragpilot reads version "
                                 f"{FILE_VERSION})")
            out = {}
            for i, k in enumerate(data.get("keys", []), 1):
                rec = _key_record(k, i)
                if rec.id in out:
                    raise ValueError(f"key {rec.id!r} appears twice")
                out[rec.id] = rec
            return out
        except (ValueError, UnicodeDecodeError) as exc:
            raise ConfigError("auth.keys_file", f"{self.path} is not a ragpilot key file: "
                                                f"{exc}") from None

    def keys(self) -> dict[str, KeyRecord]:
        try:
            st = self.path.stat()
            stamp = (st.st_mtime_ns, st.st_size)
        except FileNotFoundError:
            stamp = None
        if stamp != self._stamp:
            self._keys, self._stamp = self._load_file(), stamp
        return self._keys

    def active(self) -> list[KeyRecord]:
        return [k for k in self.keys().values() if k.revoked is None]

    def verify(self, token: str) -> KeyRecord | None:
        """The active record a token belongs to, or None."""
        parsed = parse_token(token)
        if parsed is None:
            return None
        rec = self.keys().get(parsed[0])
        if rec is None or rec.revoked is not None:
            return None
        ok = hmac.compare_digest(_digest(rec.salt, parsed[1]), rec.hash)
        return rec if ok else None

    # ---- writing (the CLI) ------------------------------------------------------------------
    @contextlib.contextmanager
    def _locked(self):
        self.path.parent.mkdir(parents=True, exist_ok=True)
        with open(self.path.with_suffix(self.path.suffix + ".lock"), "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            try:
                yield self._load_file()
            finally:
                fcntl.flock(lock, fcntl.LOCK_UN)

    def _save(self, keys: dict[str, KeyRecord]) -> None:
        tmp = self.path.with_suffix(self.path.suffix + f".tmp{os.getpid()}")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as f:
            json.dump({"version": FILE_VERSION, "keys": [asdict(k) for k in keys.values()]}, f,
                      indent=1)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, self.path)
        self._stamp = None

    def create(self, role: str, name: str = "") -> tuple[str, KeyRecord]:
        """A new key: (token, record). The token is not stored anywhere."""
        if role not in ROLES:
            raise ConfigError("role", f"must be one of {', '.join(ROLES)}, got {role!r}")
        if len(name) > 200:
            raise ConfigError("name", "at most 200 characters")
        with self._locked() as keys:
            kid = secrets.token_hex(4)
            while kid in keys:
                kid = secrets.token_hex(4)
            secret = base64.urlsafe_b64encode(secrets.token_bytes(32)).decode().rstrip("=")
            salt = secrets.token_hex(16)
            rec = KeyRecord(kid, role, salt, _digest(salt, secret), name, time.time())
            keys[kid] = rec
            self._save(keys)
        return f"{PREFIX}_{kid}_{secret}", rec

    def revoke(self, key_id: str) -> KeyRecord:
        """Mark a key revoked (kept for the audit trail); unknown id -> ConfigError."""
        with self._locked() as keys:
            rec = keys.get(key_id)
            if rec is None:
                raise ConfigError("key_id", f"no key {key_id!r} in {self.path}")
            if rec.revoked is None:
                rec = KeyRecord(**{**asdict(rec), "revoked": time.time()})
                keys[key_id] = rec
                self._save(keys)
        return rec


@dataclass(frozen=True)
class Denied:
    """Why a request was refused: 401 (no or bad key) or 403 (key lacks the role)."""

    status: int
    message: str


class Guard:
    """The ingress's check: `check(path, headers)` -> None (allowed) or a Denied."""

    def __init__(self, keys: KeyFile | None, enabled: bool = True, protect_reads: bool = False):
        self.keys, self.enabled, self.protect_reads = keys, enabled, protect_reads

    @staticmethod
    def token_from(headers: dict[str, str]) -> str | None:
        """`Authorization: Bearer <token>` or `X-API-Key: <token>` (header names lower-case)."""
        auth = headers.get("authorization", "")
        if auth[:7].lower() == "bearer ":
            return auth[7:].strip() or None
        return headers.get("x-api-key") or None

    def check(self, path: str, headers: dict[str, str]) -> Denied | None:
        need = required_role(path, self.protect_reads)
        if need is None or not self.enabled:
            return None
        token = self.token_from(headers)
        hint = f"`ragpilot keys create --role {need}`"
        if token is None:
            return Denied(401, f"{path} needs an API key with role {need}: send "
                               f"`Authorization: Bearer <key>` or `X-API-Key: <key>` (create "
                               f"one with {hint})")
        try:
            rec = self.keys.verify(token) if self.keys is not None else None
        except ConfigError as exc:
            return Denied(401, f"API keys unavailable ({exc.message})")
        if rec is None:
            return Denied(401, "invalid or revoked API key")
        note(key_id=rec.id)  # the request log's "who"
        if not role_allows(rec.role, need):
            return Denied(403, f"key {rec.id} has role {rec.role}; {path} needs role {need}")
        return None


_CURRENT: dict[str, Guard] = {}


def install_guard(guard: Guard) -> None:
    """Make `guard` the one `current_guard` returns (the ingress calls this at start-up).

    Why a function in this module and not a global of serving.app: Ray Serve cloudpickles the
    FastAPI app and the ingress class *by value* while serving.app is still being imported,
    so each gets its own copy of that module's globals; functions of this (already imported)
    module are pickled by reference and therefore shared by both copies."""
    _CURRENT["guard"] = guard


def current_guard() -> Guard | None:
    return _CURRENT.get("guard")


def route_path(scope) -> str:
    """The ASGI request's path as the app routes it: `root_path` (a proxy's mount prefix)
    removed, so `/prefix/query` and `/query` name the same endpoint."""
    path = scope.get("path", "/")
    root = scope.get("root_path", "")
    if root and root != "/" and path.startswith(root):
        path = path[len(root):] or "/"
    return path


class AuthMiddleware:
    """ASGI middleware: runs `Guard.check` before routing or body parsing. `guard` is a
    callable (the ingress sets the Guard from its settings after import); None means the app
    is not initialised yet, and a protected path is refused with 503 (fail closed)."""

    def __init__(self, app, guard, routed=None):
        """`routed(scope)`: whether any route of the app has the request's path (a path
        none has is passed on, so it answers 404 instead of asking for a key)."""
        self.app, self.guard, self.routed = app, guard, routed

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        path = route_path(scope)
        g: Guard | None = self.guard()
        if g is None:
            denied = None if required_role(path, True) is None else \
                Denied(503, "server is starting: API keys not loaded yet")
        else:
            headers = {k.decode("latin-1").lower(): v.decode("latin-1")
                       for k, v in scope.get("headers", ())}
            denied = g.check(path, headers)
        if denied is None or (self.routed is not None and not self.routed(scope)):
            await self.app(scope, receive, send)
            return
        extra = ((b"www-authenticate", b'Bearer realm="ragpilot"'),) if denied.status == 401 \
            else ()
        await send_error(send, denied.status, "authorization", denied.message, extra)
