"""Handlers of the ingress's operations routes (declared on serving.app.Ingress): `GET /metrics`
(Prometheus text) and `GET /healthz` (readiness: the store and every pipeline replica).

`OpsRoutes` is a mixin of `serving.app.Ingress` and uses its handles, router, store and metrics.
"""

from __future__ import annotations

import asyncio
from typing import Any

from fastapi.responses import JSONResponse, Response

from serving.api import log


class OpsRoutes:
    """/metrics and /healthz (a mixin of serving.app.Ingress)."""

    async def _metrics_endpoint(self) -> Response:
        body, ctype = self.metrics.render()
        return Response(content=body, media_type=ctype)

    async def _healthz(self) -> JSONResponse:
        """Readiness: 200 once the store answers and every pipeline has a warm replica (each is
        asked for its info, 5 s at most). Otherwise 503 (never a 500), JSON with `status`
        `starting` (no answer within 5 s) or `unavailable` (the store or a replica failed),
        `error` saying what failed and `failed`: variant id -> exception type and message."""
        variants = sorted(self.handles)
        body: dict[str, Any] = {"variants": variants, "stable": self.router.stable,
                                "store": self.store.url}
        try:
            await asyncio.to_thread(self.store.counts)
        except Exception as exc:  # noqa: BLE001 - any store failure means "not ready"
            log.error("healthz: store %s failed: %s: %s", self.store.url,
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
        done, pending = await asyncio.wait(tasks.values(), timeout=5.0) if tasks else \
            (set(), set())
        for t in pending:
            t.cancel()
        failed = {v: f"{type(t.result()).__name__}: {t.result()}" for v, t in tasks.items()
                  if t in done and t.result() is not None}
        slow = sorted(v for v, t in tasks.items() if t in pending)
        if failed:
            log.error("healthz: pipeline replicas failed: %s", failed)
            return JSONResponse(status_code=503, content={
                **body, "status": "unavailable", "failed": failed, "starting": slow,
                "error": f"pipeline replica failed for {len(failed)} of {len(variants)} "
                         f"variant(s): {', '.join(sorted(failed))}"})
        if slow:
            return JSONResponse(status_code=503, content={
                **body, "status": "starting", "failed": {}, "starting": slow,
                "error": f"no answer within 5 s from {', '.join(slow)}"})
        return JSONResponse(status_code=200, content={**body, "status": "ok"})

