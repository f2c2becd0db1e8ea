"""Handlers of the ingress's control-plane routes (declared on serving.app.Ingress): `GET
/rl/stats`, `GET /rl/leaderboard`, `GET|POST /admin/traffic` (the run-time split, stored so it
survives a restart: serving.routing_state) and `/admin/rollout*` (evidence-gated promotion
through `rl.promotion.service`, the same operations and state as `ragpilot rollout`).

`AdminRoutes` is a mixin of `serving.app.Ingress` and uses its state: settings, handles,
configs, router, store, metrics, gate, jobs, gates, `_tasks`, `_explicit_arms`, `_routing_fp`,
`_deploy_lock`, `_shared` and `restored`; serving.replica_sync keeps it in step with
the other ingress replicas.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

from fastapi.encoders import jsonable_encoder

from rag.config import RAGConfig
from rag.errors import ConfigError
from rl.promotion import service as rollouts
from serving.api import log
from serving.request_log import noted
from serving.routing_state import ROLES, snapshot
from serving.schemas import (
    ApiError,
    RolloutAdvanceRequest,
    RolloutRollbackRequest,
    RolloutStartRequest,
    TrafficRequest,
)


class AdminRoutes:
    """/rl/*, /admin/traffic and /admin/rollout* (a mixin of serving.app.Ingress)."""

    # ---- routing that survives a restart (serving.routing_state) ----------------------------
    def _restore_routing(self, row: dict[str, Any] | None) -> dict[str, Any] | None:
        """Serve a stored routing row (the builder deployed its variants); None when there is
        none to serve. Returns what the restored row was (shown by GET /admin/traffic)."""
        if row is None:
            return None
        st = row["state"]
        ids = [st[r] for r in ROLES if st.get(r)]
        if any(v not in self.handles for v in ids):
            log.warning("routing: stored row %d needs variants %s that are not deployed; "
                        "serving the args", row["seq"], sorted(set(ids) - set(self.handles)))
            return None
        for v in ids:
            self.configs.setdefault(v, st["configs"][v])
            if not self._explicit_arms and v not in self.router.arms:
                self.router.add_arm(v)
        self.router.set_state(st)
        log.warning("routing: restored the split set by %s (row %d): stable %s, canary %s "
                    "%.1f%%, shadow %s %.1f%%", row["action"], row["seq"], st["stable"],
                    st["canary"], st["canary_percent"], st["shadow"], st["shadow_percent"])
        return {"seq": row["seq"], "ts": row["ts"], "action": row["action"]}

    def _change_routing(self, action: str, change) -> dict[str, Any]:
        """Apply `change()` to the router and append the new split to the store; if the store
        refuses the row, the router goes back to the split it had and the caller gets a 503
        (a change that would not survive a restart is not made). The newest stored split is
        adopted first, so the change applies on top of a sibling replica's."""
        self._sync_now()
        before = self.router.state()
        state = change()
        try:
            self.store.save_routing(self._routing_fp, action,
                                    snapshot(self.router.state(), self.configs))
        except Exception as exc:  # noqa: BLE001 - any store failure: undo, say why
            self.router.set_state(before)
            log.error("routing: %s not applied, the store refused it: %s: %s", action,
                      type(exc).__name__, exc)
            raise ApiError("store", f"routing not changed: the store could not record it "
                                    f"({type(exc).__name__}: {exc})", 503) from None
        self.metrics.set_traffic(self.router.traffic.canary_percent,
                                 self.router.traffic.shadow_percent)
        if self.request_log is not None:
            self.request_log.admin(action, before, self.router.state(), noted("key_id"))
        return state

    # ---- control plane ------------------------------------------------------------------------
    # Reads of shared state adopt the store's newest routing and feedback first, so every
    # replica answers the same at once, also when no query has passed through it
    # (serving.replica_sync); without that a quiet replica showed its old split.
    async def _stats(self) -> dict[str, Any]:
        await self._sync_state(force=True)
        counts = await asyncio.to_thread(self.store.counts)
        by_variant = await asyncio.to_thread(self.store.variant_summary)
        return {"traffic": self.router.state(), "variants": self.configs, "store": counts,
                "by_variant": by_variant, "deltas": self.metrics.deltas(),
                "inflight": self.gate.inflight, "peak_inflight": self.gate.peak,
                "jobs": self.jobs.counts(), "gates": self.gates,
                "shadow_tasks_pending": len(self._tasks),
                "signals": {"pending": len(self._signal_tasks),
                            "skipped": self._signals_skipped}}

    async def _leaderboard(self, category: str | None = None) -> dict[str, Any]:
        await self._sync_state(force=True)
        rows = await asyncio.to_thread(self.store.variant_summary)
        return {"mode": self.router.traffic.mode,
                "bandit": self.router.leaderboard(category),
                "variants": [r for r in rows if r["route"] != "shadow"]}

    async def _get_traffic(self) -> dict[str, Any]:
        await self._sync_state(force=True)
        return {**self.router.state(), "restored": self.restored}

    # ---- evidence-gated promotion (rl.promotion.service; same state as `ragpilot rollout`) ---
    def _rollout(self):
        from rl.promotion.state_machine import STATE_FILE

        d = Path(self.settings.rollout_dir)
        if not (d / STATE_FILE).exists():
            raise ApiError("rollout", f"no rollout in {d}; POST /admin/rollout/start", 404)
        return rollouts.load(d)

    def _apply_rollout_traffic(self, sm, action: str) -> dict[str, Any]:
        """Point the router at the split the rollout's stage asks for, stable included: the
        candidate at `full`, else the rollout's `stable` (kept in its state.json), so a
        rollback from any stage, `full` included, serves the old stable again."""
        t = rollouts.router_settings(sm)
        stable: Any = t["stable"]
        warning = None
        if stable not in self.handles:  # a state written elsewhere: never route to nothing
            warning = (f"rollout stable {stable!r} is not deployed here; the router keeps "
                       f"{self.router.stable!r} (set it with POST /admin/traffic `stable`)")
            log.warning(warning)
            stable = False
        state = self._change_routing(action, lambda: self.router.set_traffic(
            "split", t["canary_percent"], t["shadow_percent"], t["canary"], t["shadow"],
            stable=stable))
        return {**state, "warning": warning} if warning else state

    async def _rollout_status(self) -> dict[str, Any]:
        self._rollout()
        return jsonable_encoder(rollouts.status(self.settings.rollout_dir))

    async def _rollout_start(self, body: RolloutStartRequest) -> dict[str, Any]:
        for name, vid in (("candidate", body.candidate), ("stable", body.stable)):
            if vid is not None and vid not in self.handles:
                raise ApiError(name, f"no deployed variant {vid!r} (have: "
                                     f"{', '.join(sorted(self.handles))})", 404)
        try:
            sm = rollouts.start(self.settings.rollout_dir, body.candidate,
                                body.stable or self.router.stable, body.manifest_id,
                                force=body.force)
        except ConfigError as exc:
            if exc.field == "state":  # an unfinished rollout: a conflict `force` resolves
                raise ApiError("force", exc.message.replace("pass --force",
                                                            "send force: true"), 409) from None
            raise
        return {"rollout_id": sm.state.rollout_id, "stage": sm.stage,
                "traffic": self._apply_rollout_traffic(sm, "rollout/start")}

    async def _rollout_advance(self, body: RolloutAdvanceRequest) -> dict[str, Any]:
        """Observe the body's reports (then, with `from_log`, the interaction log as
        evidence of the stage's kind), then try one stage up; 409 once the rollout ended."""
        from rl.promotion.evaluators import EvaluationReport
        from rl.promotion.evidence import Evidence, reports_from_file

        sm = self._rollout()
        if sm.done:
            raise ApiError("rollout", str(rollouts.RolloutClosed(sm.stage)), 409)
        evidence = Evidence()
        for i, r in enumerate(body.reports):
            try:
                evidence.reports.append(EvaluationReport.from_dict(r))
            except ConfigError as exc:  # report.<key> -> reports.<i>.<key>
                raise ApiError(f"reports.{i}{exc.field.removeprefix('report')}",
                               exc.message) from None
        if body.from_log:
            import tempfile

            with tempfile.TemporaryDirectory() as tmp:
                path = Path(tmp) / "interactions.jsonl"
                await asyncio.to_thread(self.store.export_jsonl, path)
                if path.stat().st_size:
                    evidence += reports_from_file(path, sm,
                                                  pii_penalty=self.settings.pii.leak_penalty)
        decision = rollouts.advance(sm, evidence.reports)
        out = {"decision": rollouts.decision_record(decision), "stage": sm.stage,
               "traffic": self._apply_rollout_traffic(sm, f"rollout/{decision.action}")}
        return {**out, "notes": evidence.notes} if evidence.notes else out

    async def _rollout_rollback(self, body: RolloutRollbackRequest) -> dict[str, Any]:
        """Roll back now (from any stage, `full` included); 409 when it already was, and the
        live split is left alone (a router changed by hand since stays as it is)."""
        sm = self._rollout()
        if sm.stage == "rolled_back":
            raise ApiError("rollout", "already rolled back; start a new one", 409)
        d = rollouts.rollback(sm, f"manual (API): {rollouts.check_reason(body.reason)}")
        return {"decision": rollouts.decision_record(d), "stage": sm.stage,
                "traffic": self._apply_rollout_traffic(sm, "rollout/rollback")}

    async def _set_traffic(self, body: TrafficRequest) -> dict[str, Any]:
        """Every part of the request is checked before anything changes: a refused request
        deploys no variant and leaves the split as it was."""
        given = body.model_fields_set
        if "stable" in given and body.stable is None:
            raise ApiError("stable", "cannot be removed (something must serve); send a "
                                     "variant id or config overrides")
        if body.mode == "policy" and self.policy_handle is None:
            raise ApiError("mode", "policy needs a policy deployment (the app's `policy:` "
                                   "section); this app has none", 409)
        specs = {f: getattr(body, f) for f in ("stable", "canary_config", "shadow_config")
                 if f in given}
        checked = {f: self._check_variant(spec, f) for f, spec in specs.items()}
        self._check_split(body, {f: h for f, (h, _) in checked.items()})
        async with self._deploy_lock:
            new = {h: (f, cfg) for f, (h, cfg) in checked.items()
                   if cfg is not None and h not in self.handles}
            if new and len(self.handles) + len(new) > self.settings.max_variants:
                field = next(iter(new.values()))[0]
                raise ApiError(field, f"already {len(self.handles)} variants deployed and "
                                      f"this adds {len(new)} (max_variants "
                                      f"{self.settings.max_variants}); reuse one by its id",
                               409)
            for h, (_, cfg) in new.items():
                self.handles[h] = await asyncio.to_thread(self._deploy, cfg)
                self.configs[h] = cfg.model_dump(mode="json")
                if not self._explicit_arms:
                    self.router.add_arm(h)
        ids = {f: h for f, (h, _) in checked.items()}
        return self._change_routing("admin/traffic", lambda: self.router.set_traffic(
            body.mode, body.canary_percent, body.shadow_percent,
            ids.get("canary_config", False), ids.get("shadow_config", False),
            stable=ids.get("stable", False)))

    def _check_split(self, body: TrafficRequest, ids: dict[str, str | None]) -> None:
        """Refuse a split that would not do what it says: a percentage this request sets above
        0 for a canary or shadow that will not exist, or a canary or shadow that is the stable
        variant itself (its traffic would measure nothing)."""
        stable = ids.get("stable") or self.router.stable
        for role, pct in (("canary", body.canary_percent), ("shadow", body.shadow_percent)):
            field = f"{role}_config"
            variant = ids[field] if field in ids else getattr(self.router, role)
            if pct and variant is None:
                raise ApiError(f"{role}_percent", f"is {pct:g} but no {role} variant is set "
                                                  f"(send {field} too)")
            if field in ids and variant is not None and variant == stable:
                raise ApiError(field, f"is the stable variant {stable}; a {role} must differ "
                                      "from what it is compared with")

    def _check_variant(self, spec: dict[str, Any] | str | None,
                       field: str) -> tuple[str | None, RAGConfig | None]:
        """(variant id, the config to deploy when it is new) for `spec`: a deployed variant's
        id, config overrides (validated, `k` within the limit) or None (remove). Deploys
        nothing."""
        if spec is None:
            return None, None
        if isinstance(spec, str):
            if spec not in self.handles:
                raise ConfigError(field, f"no deployed variant {spec!r} (have: "
                                         f"{', '.join(sorted(self.handles))})")
            return spec, None
        cfg = self._limited_config(spec, field)
        return cfg.config_hash, cfg

    def _deploy(self, cfg: RAGConfig):
        """A handle for `cfg` on the shared pipeline deployment (serving.shared_pipelines): a
        variant is data sent with each request, so nothing is deployed here. The desired
        state (the split naming it, with its config) is what `_change_routing` stores; the
        other ingress replicas adopt it from there (serving.replica_sync)."""
        from serving.shared_pipelines import VariantHandle

        log.info("serving variant %s on the shared pipelines", cfg.config_hash)
        return VariantHandle(self._shared, cfg.config_hash, cfg.model_dump(mode="json"))

    def _new_variant_handle(self, cfg: RAGConfig):
        """What serves a variant added at run time (here or by a sibling replica)."""
        return self._deploy(cfg)

    def _limited_config(self, overrides: dict[str, Any], field: str) -> RAGConfig:
        """`base` + overrides, validated, with `k` within `limits.max_k`."""
        cfg = self.settings.config(overrides, where=field)
        cap = self.settings.limits.max_k
        if cfg.k > cap:
            raise ApiError(f"{field}.k", f"is {cfg.k}; the limit is {cap} (limits.max_k)")
        from rag.errors import ModelNotFoundError
        from rag.generation.factory import check_generator

        try:  # else every request to it would fail (502)
            check_generator(cfg.generator)
        except ModelNotFoundError as exc:
            raise ApiError(f"{field}.generator", str(exc)) from None
        except ConfigError as exc:
            raise ApiError(f"{field}.generator", exc.message) from None
        return cfg

