"""The FastAPI application object of the ragpilot ingress and what wraps every route: error
bodies (`{"error": "<field>: <message>", "field": ...}`: 422 for validation and ConfigError,
ApiError's own status, and Starlette's own errors: 400 `body`, 404 `path`, 405 `method`), request
counting, API keys and the body-size limit.

serving.app declares the routes on `api` (class-based, on `Ingress`); their handlers live in
serving.routes_query, routes_admin, routes_tuner and routes_ops.
"""

# No `from __future__ import annotations`: FastAPI must see real classes in route signatures.
import logging
import os
import socket
import time
from pathlib import Path
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.openapi.docs import get_swagger_ui_html
from fastapi.responses import HTMLResponse, JSONResponse
from fastapi.staticfiles import StaticFiles
from starlette.exceptions import HTTPException as StarletteHTTPException

from rag.errors import ConfigError
from serving import request_log
from serving.auth import AuthMiddleware, current_guard, route_path
from serving.drain import DrainGate
from serving.limits import BodyLimitMiddleware, current_body_limit
from serving.metrics import ServeMetrics, current_metrics
from serving.schemas import ApiError

log = logging.getLogger("ray.serve")
api = FastAPI(title="ragpilot", version="0.1.0",
              description="RAG serving with canary/shadow routing, a bandit router, feedback "
                          "logging and asynchronous tuner evaluations.",
              docs_url=None, redoc_url=None)  # /docs below: FastAPI's loads a CDN
DOCS_ASSETS = "/docs-assets"
"""Swagger UI's JavaScript and CSS, from the swagger-ui-py package (no CDN: /docs works
offline and on an air-gapped cluster)."""


def _swagger_static() -> str:
    import swagger_ui

    return str(Path(swagger_ui.__file__).parent / "static")


api.mount(DOCS_ASSETS, StaticFiles(directory=_swagger_static()), name="docs-assets")


@api.get("/docs", include_in_schema=False)
async def _docs(request: Request) -> HTMLResponse:
    """Swagger UI over /openapi.json, every asset from DOCS_ASSETS."""
    root = request.scope.get("root_path", "").rstrip("/")
    return get_swagger_ui_html(openapi_url=f"{root}{api.openapi_url}", title="ragpilot API",
                               swagger_js_url=f"{root}{DOCS_ASSETS}/swagger-ui-bundle.js",
                               swagger_css_url=f"{root}{DOCS_ASSETS}/swagger-ui.css",
                               swagger_favicon_url=f"{root}{DOCS_ASSETS}/favicon-32x32.png")

_ENDPOINTS = {"/query": "query", "/feedback": "feedback", "/tuner/evaluate": "tuner_evaluate",
              "/admin/traffic": "admin_traffic"}


def _error(status: int, field: str, message: str, **extra: Any) -> JSONResponse:
    return JSONResponse(status_code=status,
                        content={"error": f"{field}: {message}", "field": field, **extra})


@api.exception_handler(RequestValidationError)
async def _invalid(_: Request, exc: RequestValidationError) -> JSONResponse:
    err = exc.errors()[0]
    # a union's member ("dict[str,any]", "str") is not a field: `canary_config`, not
    # `canary_config.dict[str,any]`
    field = ".".join(str(x) for x in err.get("loc", ())
                     if x != "body" and not _union_tag(x)) or "body"
    if err.get("type") == "json_invalid":
        field = "body"
    # where, what and why of each error, never the input itself: it may not be renderable as
    # JSON (NaN, a lone surrogate) and echoing a client's payload back helps nobody
    detail = [{"loc": [str(x) for x in e.get("loc", ())], "msg": str(e.get("msg", "")),
               "type": str(e.get("type", ""))} for e in exc.errors()]
    return _error(422, field, str(err.get("msg", "invalid")), detail=detail)


def _union_tag(part: Any) -> bool:
    return isinstance(part, str) and ("[" in part or part in (
        "str", "int", "float", "bool", "none", "dict", "list"))


@api.exception_handler(ApiError)
async def _api_error(_: Request, exc: ApiError) -> JSONResponse:
    response = _error(exc.status, exc.field, exc.message)
    response.headers.update(exc.headers or {})
    return response


_HTTP_FIELDS = {400: "body", 404: "path", 405: "method"}
"""The field an HTTP error of Starlette's names (a body it could not parse, a path or method
the app does not have)."""


@api.exception_handler(StarletteHTTPException)
async def _http_error(_: Request, exc: StarletteHTTPException) -> JSONResponse:
    response = _error(exc.status_code, _HTTP_FIELDS.get(exc.status_code, "request"),
                      str(exc.detail))
    response.headers.update(exc.headers or {})
    return response


@api.exception_handler(ConfigError)
async def _config_error(_: Request, exc: ConfigError) -> JSONResponse:
    return _error(422, exc.field, exc.message)


# Outer to inner: request counting (CountRequests, below) -> drain gate -> API keys -> body
# size -> FastAPI.
# Starlette puts the last-added middleware outermost, so these two are added before the counter.
# State reaches them through functions of serving.limits/serving.auth (see install_guard).
api.add_middleware(BodyLimitMiddleware, limit=current_body_limit)
api.add_middleware(AuthMiddleware, guard=current_guard, routed=lambda scope: _routed(scope))


def _routed(scope) -> bool:
    """Whether a route of the application serving this request has its path (any method):
    the API-key check runs only then, and any other path answers 404. The application is
    the one Starlette put in `scope["app"]`, not this module's `api`: under Serve the replica
    serves a by-value copy of it, and only that copy holds the ingress's routes. Without an
    application in the scope every path counts as routed (the key check runs)."""
    from starlette.routing import Match

    app = scope.get("app")
    router = getattr(app, "router", None)
    if router is None:
        return True
    scope = {**scope, "path": route_path(scope), "root_path": ""}
    # another method on a route's path is a PARTIAL match: 405 after the key check
    return any(route.matches(scope)[0] is not Match.NONE for route in router.routes)


_UNLOGGED = frozenset({"/metrics", "/healthz", "/readyz"})
"""Probe and scrape paths: no request log line (they would be most of the file)."""

REPLICA_ID = f"{socket.gethostname()}:{os.getpid()}"
"""Which ingress replica answered: every response's `X-Ragpilot-Replica` header."""


def replica_id() -> str:
    """REPLICA_ID of the calling process. Code pickled by value (serving.app's Ingress) must
    call this rather than import the constant, which would carry the driver's pid along."""
    return REPLICA_ID


_REPLICA_HEADER = (b"x-ragpilot-replica", REPLICA_ID.encode("latin-1"))


class CountRequests:
    """Outermost ASGI middleware: the `X-Ragpilot-Replica` header on every response and the
    request counter by endpoint and status (401/413 answers of the inner middlewares too).
    Plain ASGI, not `@app.middleware("http")`: Starlette's BaseHTTPMiddleware runs each
    request through an extra task group and memory streams (measurable per request)."""

    def __init__(self, app):
        self.app = app

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        path = route_path(scope)
        t0 = time.perf_counter()
        fields = request_log.begin()
        status = [500]  # what the client gets if the app raises before answering

        async def send_counted(message) -> None:
            if message["type"] == "http.response.start":
                status[0] = message["status"]
                message = {**message, "headers": [*message.get("headers", ()), _REPLICA_HEADER]}
                metrics: ServeMetrics | None = current_metrics()  # see install_metrics
                if metrics is not None:
                    metrics.request(_ENDPOINTS.get(path, "other"), message["status"])
            await send(message)

        try:
            await self.app(scope, receive, send_counted)
        finally:
            out = request_log.current_request_log()
            if out is not None and path not in _UNLOGGED:
                try:
                    out.request(scope.get("method", ""), path, status[0],
                                (time.perf_counter() - t0) * 1000.0, fields)
                except Exception as exc:  # noqa: BLE001 - a full disk must not fail requests
                    log.warning("request log not written: %s: %s", type(exc).__name__, exc)


api.add_middleware(DrainGate)  # inside the counter: a draining 503 is counted and logged
api.add_middleware(CountRequests)
