"""The router's metrics port: `GET /metrics` (Prometheus text) and nothing else.

It is a port of its own, apart from the tenant-facing one, because the metrics carry every
tenant's name, budget and spend: monitoring reaches this port, tenants do not (the chart's
NetworkPolicy). The app holds no state and starts nothing; the router app (router/http/app.py)
owns the metrics and the services that feed them, and both apps are served in one process.
"""

from __future__ import annotations

import logging
from typing import Protocol

from tiergate.router.base.asgi import Receive, Scope, Send, send_bytes, send_error
from tiergate.router.base.errors import RouterError
from tiergate.router.http.metrics import CONTENT_TYPE

__all__ = ["METRICS_PATH", "MetricsApp"]

log = logging.getLogger("tiergate.router")

#: The one path the metrics port serves.
METRICS_PATH = "/metrics"


class Exposition(Protocol):
    """What the app serves: the router's metrics, as Prometheus text."""

    def exposition(self) -> bytes: ...


class MetricsApp:
    """The ASGI app of the metrics port."""

    def __init__(self, metrics: Exposition) -> None:
        self.metrics = metrics

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "lifespan":
            await _lifespan(receive, send)
            return
        if scope["type"] != "http":
            return
        if scope["path"] != METRICS_PATH:
            await send_error(send, RouterError(404, f"no route {scope['path']}", code="not_found"))
        elif scope["method"] not in ("GET", "HEAD"):
            allowed = RouterError(
                405,
                f"method not allowed: {METRICS_PATH} takes GET, HEAD",
                code="method_not_allowed",
                headers={"allow": "GET, HEAD"},
            )
            await send_error(send, allowed)
        else:
            try:
                body = self.metrics.exposition()
            except Exception:  # a bug: logged, and the scrape fails as Prometheus expects
                log.exception("event=internal_error path=%s", METRICS_PATH)
                error = RouterError(500, "internal router error", type="server_error",
                                    code="internal_error")  # fmt: skip
                await send_error(send, error)
                return
            await send_bytes(send, 200, body, content_type=(b"content-type", CONTENT_TYPE.encode()))


async def _lifespan(receive: Receive, send: Send) -> None:
    """Nothing to start or stop: the router app's lifespan does that."""
    while True:
        message = await receive()
        if message["type"] == "lifespan.startup":
            await send({"type": "lifespan.startup.complete"})
        elif message["type"] == "lifespan.shutdown":
            await send({"type": "lifespan.shutdown.complete"})
            return
