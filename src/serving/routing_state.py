"""Routing that survives a restart.

The router's split (stable / canary / shadow variant ids, mode, percentages) changes at run
time: `POST /admin/traffic` and the promotion state machine (`/admin/rollout/*`). Each change
is appended to the interaction store's `routing` table together with the configs of the
variants it names and a *fingerprint* of the routing the YAML asked for. When the app starts
again:

  * the YAML's routing is unchanged since that row (same fingerprint) -> the row wins: its
    variants are deployed (configs come from the row) and the router serves its split, so a
    promotion to `full` or a rollback is still in force after a restart or a crash;
  * the YAML's routing changed (an operator edited stable/canary/shadow/traffic) -> the YAML
    wins: an explicit new intent beats an older run-time change. A warning names the row.

`restore_routing: false` in the Serve args turns this off (the YAML always wins).
"""

from __future__ import annotations

import hashlib
import json
import logging
from pathlib import Path
from typing import Any

from rag.config import RAGConfig
from serving.schemas import ServeSettings
from serving.store import InteractionStore, open_store

log = logging.getLogger("ragpilot.serve")

ROLES = ("stable", "canary", "shadow")
TRAFFIC_KEYS = ("mode", "canary_percent", "shadow_percent")


def yaml_fingerprint(s: ServeSettings, roles: dict[str, str | None]) -> str:
    """Identifies the routing the Serve args ask for: role -> config hash, and the split."""
    doc = {"roles": {r: roles.get(r) for r in ROLES},
           "traffic": {k: getattr(s.traffic, k) for k in TRAFFIC_KEYS}}
    return hashlib.sha256(json.dumps(doc, sort_keys=True).encode()).hexdigest()[:16]


def snapshot(router_state: dict[str, Any], configs: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """What is stored: the split, and the config (RAGConfig JSON) of every variant it names."""
    ids = [router_state[r] for r in ROLES if router_state.get(r)]
    return {**{k: router_state[k] for k in (*TRAFFIC_KEYS, *ROLES)},
            "configs": {v: configs[v] for v in ids if v in configs}}


def restorable(store: InteractionStore | None, s: ServeSettings,
               roles: dict[str, str | None]) -> dict[str, Any] | None:
    """The stored routing row to serve at start-up, or None (nothing stored, restoring off,
    or the YAML's routing changed since the row was written: logged)."""
    if store is None or not s.restore_routing:
        return None
    row = store.last_routing()
    if row is None:
        return None
    if row["fingerprint"] != yaml_fingerprint(s, roles):
        log.warning("routing: the Serve args' stable/canary/shadow/traffic changed since the "
                    "stored routing (row %d, %s): serving the args, not the stored split",
                    row["seq"], row["action"])
        return None
    state = row["state"]
    missing = [state[r] for r in ROLES if state.get(r) and state[r] not in state["configs"]]
    if missing:
        log.warning("routing: stored row %d names variants without configs %s; serving the "
                    "args", row["seq"], missing)
        return None
    for vid, cfg in restored_configs(row).items():
        if cfg.config_hash != vid:  # written by code that hashed configs differently
            log.warning("routing: stored config %s hashes to %s with this code; serving the "
                        "args", vid, cfg.config_hash)
            return None
    return row


def peek(s: ServeSettings, roles: dict[str, str | None]) -> dict[str, Any] | None:
    """`restorable` for the app builder, which runs before the ingress: reads the store
    without creating it (a SQLite file that does not exist yet holds no routing)."""
    if not s.restore_routing:
        return None
    if "://" not in s.store_url and not Path(s.store_url).exists():
        return None
    store = open_store(s.store_url)
    try:
        return restorable(store, s, roles)
    finally:
        store.close()


def restored_configs(row: dict[str, Any] | None) -> dict[str, RAGConfig]:
    """Variant id -> RAGConfig of the variants a stored routing row needs deployed."""
    if row is None:
        return {}
    return {vid: RAGConfig.from_dict(cfg, where=f"routing.configs.{vid}")
            for vid, cfg in row["state"]["configs"].items()}
