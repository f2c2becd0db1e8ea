"""Ingress replicas that answer the same: routing and bandit statistics read from the store.

The interaction store is the one record every ingress replica shares (SQLite in WAL mode on
one machine, PostgreSQL across nodes). A replica never trusts only its own memory:

  * routing: every change (`/admin/traffic`, `/admin/rollout/*`) is appended to the store's
    `routing` table *as the desired state* (the split plus the configs of the variants it
    names). Each replica's reconciler (`ReplicaSync._sync_routing`) adopts the newest row
    written under its own Serve args (same fingerprint): it adds a `VariantHandle` for any
    variant it has not seen (variants are data for the shared pipeline deployment, so nothing
    is deployed; no `serve.run` runs inside a replica) and sets its router to the row's split.
    A row from other args (an older deployment) is ignored, as at start-up
    (serving.routing_state).
  * bandit statistics: every `/feedback` is a row of `feedback` (seq-ordered); each replica
    replays rows it has not applied yet, in seq order, into its per-category bandits, so all
    replicas hold the same counts. The replica that stored a feedback replays at once
    (read-your-writes); others within `ingress.sync_interval_s`.
  * rate limits: with more than one replica, serving.shared_limits.StoreTokenBucket.

A replica syncs at most every `ingress.sync_interval_s` (default 0.2 s) on the request path
(two indexed reads; concurrent requests wait for the one pass in flight rather than route on
the state it is replacing), immediately after its own feedback, and before it changes the
routing (so a change applies on top of the newest split). A failed read keeps the last state (logged).

PostgreSQL sequences can commit out of order, so feedback rows are tracked by seq for
`SETTLE_S` seconds before the watermark passes them (a late commit is still replayed once).
"""

from __future__ import annotations

import asyncio
import threading
import time
from typing import Any

from rag.config import RAGConfig
from serving.api import log
from serving.routing_state import ROLES

SETTLE_S = 5.0
"""Seconds after which a feedback row's lower seqs are assumed committed (PostgreSQL)."""


class ReplicaSync:
    """A mixin of serving.app.Ingress: uses store, router, settings, handles, configs,
    metrics, `_routing_fp`, `_explicit_arms`, `_policy_reward` and `_new_variant_handle`."""

    def _init_sync(self) -> None:
        """Start-up: routing rows up to now are history (the builder already chose what to
        serve from them); every stored bandit feedback is replayed."""
        self._sync_lock = threading.Lock()
        self._sync_at = time.monotonic()
        self._sync_task: asyncio.Future | None = None
        last = self.store.last_routing()
        self._routing_seq = last["seq"] if last else 0
        self._fb_mark = 0
        self._fb_recent: dict[int, float] = {}
        self._sync_bandit()

    async def _sync_state(self, force: bool = False) -> None:
        """Adopt siblings' routing changes and feedback (throttled unless `force`). Requests
        that find the state older than `sync_interval_s` all wait for one sync pass (single
        flight): none routes on the stale state while a concurrent request refreshes it."""
        if force:
            await asyncio.to_thread(self._sync_now, True)
            return
        task = self._sync_task
        if task is not None and not task.done():
            # a pass is running: `_sync_at` already reads fresh (it is set when the pass
            # starts), but the state is still the one being replaced until the pass ends
            await asyncio.shield(task)
            return
        if time.monotonic() - self._sync_at < self.settings.ingress.sync_interval_s:
            return
        task = self._sync_task = asyncio.ensure_future(asyncio.to_thread(self._sync_now, True))
        await asyncio.shield(task)

    def _sync_now(self, wait: bool = True) -> None:
        """One sync pass (blocking); without `wait`, skipped while another pass runs."""
        if not self._sync_lock.acquire(blocking=wait):
            return
        try:
            self._sync_at = time.monotonic()
            self._sync_routing()
            self._sync_bandit()
        except Exception as exc:  # noqa: BLE001 - keep serving on the last known state
            log.error("replica sync failed (serving the last known state): %s: %s",
                      type(exc).__name__, exc)
        finally:
            self._sync_lock.release()

    def _sync_routing(self) -> None:
        row = self.store.last_routing()
        if row is None or row["seq"] <= self._routing_seq:
            return
        self._routing_seq = row["seq"]
        if row["fingerprint"] != self._routing_fp:
            log.warning("routing: row %d was written under other Serve args; not adopted",
                        row["seq"])
            return
        st = row["state"]
        for vid, cfg in st.get("configs", {}).items():
            self._adopt_variant(vid, cfg)
        missing = [st[r] for r in ROLES if st.get(r) and st[r] not in self.handles]
        if missing:
            log.warning("routing: row %d names variants %s this replica cannot serve; not "
                        "adopted", row["seq"], missing)
            return
        self.router.set_state(st)
        self.metrics.set_traffic(self.router.traffic.canary_percent,
                                 self.router.traffic.shadow_percent)

    def _adopt_variant(self, vid: str, config: dict[str, Any]) -> None:
        """Serve variant `vid` here too (a sibling added it at run time)."""
        if vid in self.handles:
            return
        if len(self.handles) >= self.settings.max_variants:
            log.warning("routing: variant %s not adopted: max_variants reached", vid)
            return
        self.handles[vid] = self._new_variant_handle(RAGConfig.from_dict(config))
        self.configs[vid] = config
        if not self._explicit_arms:
            self.router.add_arm(vid)

    def _sync_bandit(self) -> None:
        for seq, ts, cat, variant, reward, leaks in self.store.bandit_feedback_since(
                self._fb_mark):
            if seq in self._fb_recent:
                continue
            self._fb_recent[seq] = ts
            self.router.update(cat, variant, self._policy_reward(reward, leaks))
        # move the watermark over rows old enough that no lower seq can still commit
        cut = time.time() - SETTLE_S
        pending = [q for q, t in self._fb_recent.items() if t >= cut]
        settled = [q for q, t in self._fb_recent.items() if t < cut]
        if settled:
            mark = min([*pending, max(settled) + 1]) - 1
            if mark > self._fb_mark:
                self._fb_mark = mark
                self._fb_recent = {q: t for q, t in self._fb_recent.items() if q > mark}
