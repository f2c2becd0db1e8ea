"""Handlers of the ingress's operations routes (declared on serving.app.Ingress): `GET /metrics`
(Prometheus text: every live ingress replica's series, labelled `replica`), `GET /healthz`
(liveness: this ingress replica runs) and `GET /readyz` (readiness: the store and every
deployment answer, and no drain has started).

`OpsRoutes` is a mixin of `serving.app.Ingress` and uses its handles, router, store and metrics.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

from fastapi.responses import JSONResponse, Response

from serving.api import log, replica_id
from serving.drain import draining

READY_TIMEOUT_S = 2.0
"""How long `/readyz` waits for each deployment's answer before saying `starting`."""
STARTED = time.time()


class OpsRoutes:
    """/metrics, /healthz and /readyz (a mixin of serving.app.Ingress)."""

    async def _metrics_endpoint(self) -> Response:
        body, ctype = await asyncio.to_thread(self.publisher.render)
        return Response(content=body, media_type=ctype)

    async def _healthz(self) -> JSONResponse:
        """Liveness: 200 whenever this replica's event loop answers; touches nothing else
        (a failing store or pipeline is /readyz's answer, not a reason to restart us)."""
        return JSONResponse(status_code=200, content={
            "status": "alive", "replica": replica_id(),
            "uptime_s": round(time.time() - STARTED, 3)})

    async def _readyz(self) -> JSONResponse:
        """Readiness: 200 once the store answers and every deployment (each variant on the
        shared pipelines, the policy when there is one) answers its `info` call within
        READY_TIMEOUT_S. Otherwise 503 (never a 500), JSON with `status` `starting` (no
        answer in time) or `unavailable` (the store or a replica failed), `error` saying
        what failed and `failed`: variant id -> exception type and message. From the start
        of a drain (serving.drain), 503 with `status` `draining` and nothing probed."""
        variants = sorted(self.handles)
        body: dict[str, Any] = {"variants": variants, "stable": self.router.stable,
                                "store": self.store.url}
        if draining():
            return JSONResponse(status_code=503, content={
                **body, "status": "draining", "failed": {},
                "error": "the server is stopping: route new requests elsewhere"})
        try:
            await asyncio.to_thread(self.store.counts)
        except Exception as exc:  # noqa: BLE001 - any store failure means "not ready"
            log.error("readyz: store %s failed: %s: %s", self.store.url,
                      type(exc).__name__, exc)
            return JSONResponse(status_code=503, content={
                **body, "status": "unavailable",
                "error": f"store: {type(exc).__name__}: {exc}", "failed": {}})

        async def probe(v: str) -> BaseException | None:
            try:
                await self.handles[v].info.remote()
            except Exception as exc:  # noqa: BLE001 - a dead replica, an actor error, ...
                return exc
            return None

        tasks = {v: asyncio.ensure_future(probe(v)) for v in variants}
        if self.policy_handle is not None:
            tasks["policy"] = asyncio.ensure_future(self._probe_policy())
        done, pending = (await asyncio.wait(tasks.values(), timeout=READY_TIMEOUT_S)
                         if tasks else (set(), set()))
        for t in pending:
            t.cancel()
        failed = {v: f"{type(t.result()).__name__}: {t.result()}" for v, t in tasks.items()
                  if t in done and t.result() is not None}
        slow = sorted(v for v, t in tasks.items() if t in pending)
        if failed:
            log.error("readyz: pipeline replicas failed: %s", failed)
            return JSONResponse(status_code=503, content={
                **body, "status": "unavailable", "failed": failed, "starting": slow,
                "error": f"pipeline replica failed for {len(failed)} of {len(tasks)} "
                         f"variant(s): {', '.join(sorted(failed))}"})
        if slow:
            return JSONResponse(status_code=503, content={
                **body, "status": "starting", "failed": {}, "starting": slow,
                "error": f"no answer within {READY_TIMEOUT_S:g} s from {', '.join(slow)}"})
        return JSONResponse(status_code=200, content={**body, "status": "ok"})

    async def _probe_policy(self) -> BaseException | None:
        try:
            await self.policy_handle.info.remote()
        except Exception as exc:  # noqa: BLE001 - any failure means "not ready"
            return exc
        return None
