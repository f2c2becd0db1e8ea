"""Draining: once `ragpilot serve` starts to stop, every ingress replica refuses new requests
while the ones already inside are answered.

The driver (serving.launch.run_server) names a flag file in $RAGPILOT_DRAIN_FLAG before it
starts its cluster (every Ray process it starts inherits the variable) and creates the file
the moment it receives SIGTERM or SIGINT. While the file exists:

  * `GET /readyz` answers 503 with `status: draining` (serving.routes_ops), so a load balancer
    that health-checks it stops routing here;
  * `DrainGate`, the ingress's ASGI middleware, answers every other request 503 with
    `Retry-After: RETRY_AFTER_S` and `{"error": "server: draining ...", "field": "server"}`
    before any route runs, except `GET /healthz` (the process is alive) and `GET /metrics`
    (the driver counts the requests still in flight through it);
  * a request that passed the gate before the file appeared runs to its answer.

`ragpilot serve` starts a single-machine cluster, so every replica sees the driver's file. An
app started any other way (`serve run`, KubeRay) has no $RAGPILOT_DRAIN_FLAG and the gate lets
everything through; there Serve's own graceful shutdown applies.
"""

from __future__ import annotations

import os

from serving.auth import route_path
from serving.limits import send_error

FLAG_ENV = "RAGPILOT_DRAIN_FLAG"
"""Path of the file whose existence means "draining" (unset: never draining)."""
RETRY_AFTER_S = 5
"""`Retry-After` (seconds) on a request refused while draining: time for a load balancer to
route the client to another instance."""
PASS_THROUGH = frozenset({"/healthz", "/metrics", "/readyz"})
"""Paths the gate never refuses (/readyz says `draining` itself)."""

_seen = {"draining": False}


def draining() -> bool:
    """Whether this process's app is draining: $RAGPILOT_DRAIN_FLAG names a file that exists.
    Once true it stays true (a drain ends with the process)."""
    if _seen["draining"]:
        return True
    path = os.environ.get(FLAG_ENV)
    if path and os.path.exists(path):
        _seen["draining"] = True
    return _seen["draining"]


class DrainGate:
    """ASGI middleware: while `draining()`, a clean 503 with Retry-After for every HTTP request
    but PASS_THROUGH's paths (module docstring); otherwise the app, unchanged."""

    def __init__(self, app):
        self.app = app

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] != "http" or not draining() or route_path(scope) in PASS_THROUGH:
            await self.app(scope, receive, send)
            return
        await send_error(send, 503, "server", "draining (the server is stopping); retry in "
                         f"{RETRY_AFTER_S} s, through the load balancer",
                         ((b"retry-after", str(RETRY_AFTER_S).encode()),
                          (b"connection", b"close")))

