"""The router's ASGI app: the OpenAI-compatible API, usage, health and OpenAPI.

Raw ASGI with a dict of routes: the request path is `handler.Router.completion`; the rest
are small. The lifespan starts discovery and metric scraping and stops them, closing the
shared upstream client and the ledger.

This is the tenant-facing port: nothing here names a tenant other than the caller. The
metrics, which name every tenant, are the metrics port's (`metrics_app`,
router/http/metrics_app.py), served beside this app on a port of their own.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from typing import Protocol

from tiergate.common.connection_limits import ConnectionGate, ConnectionLimits
from tiergate.router.base.asgi import (
    Message,
    Receive,
    Scope,
    Send,
    header_map,
    send_error,
    send_json,
)
from tiergate.router.base.errors import RouterError
from tiergate.router.config import SHUTDOWN_GRACE_S
from tiergate.router.handler import Router
from tiergate.router.http.metrics import RouterMetrics
from tiergate.router.http.metrics_app import MetricsApp
from tiergate.router.http.openapi import openapi_document
from tiergate.router.http.usage import usage_response
from tiergate.router.ledger.records import LedgerError
from tiergate.router.request.models import models_reply

log = logging.getLogger("tiergate.router")


class Service(Protocol):
    """Something the app starts with it and stops with it (discovery, scraper)."""

    def start(self) -> Awaitable[None] | None: ...
    def stop(self) -> Awaitable[None] | None: ...


Handler = Callable[[Scope, Receive, Send], Awaitable[None]]


class RouterApp:
    """The ASGI application."""

    def __init__(
        self,
        router: Router,
        services: list[Service] | None = None,
        *,
        synced: Callable[[], bool] = lambda: True,
        ready_needs_endpoints: bool = True,
        connections: ConnectionGate | None = None,
        metrics: RouterMetrics,
        shutdown_grace_s: int = SHUTDOWN_GRACE_S,
    ) -> None:
        self.router = router
        #: How long requests in flight get to finish when the server stops (router.shutdownGraceS).
        self.shutdown_grace_s = shutdown_grace_s
        # The same object as the router's (which sees only what its stages report).
        self.metrics = metrics
        # Its clients' connections, as the server that serves the app limits and counts them.
        self.connections = connections or ConnectionGate(ConnectionLimits(), log)
        self.ready_needs_endpoints = ready_needs_endpoints
        self.services = services or []
        self.ready = False
        # Discovery has seen all of its pools once; before that an empty or partial view
        # would make a load balancer send requests that could only get 503 or 404.
        self.synced = synced
        # The metrics port's app: the same router's metrics, served apart from tenants.
        self.metrics_app = MetricsApp(metrics)
        self._routes: dict[tuple[str, str], Handler] = {
            ("POST", "/v1/chat/completions"): self._chat,
            ("POST", "/v1/completions"): self._completions,
            ("GET", "/v1/models"): self._models,
            ("GET", "/v1/usage"): self._usage,
            ("GET", "/healthz"): self._healthz,
            ("GET", "/readyz"): self._readyz,
            ("GET", "/openapi.json"): self._openapi,
        }
        # A path's methods, for a 405's Allow header; HEAD wherever GET is (uvicorn sends
        # the headers of the GET reply without its body).
        self._allowed: dict[str, list[str]] = {}
        for method, path in self._routes:
            self._allowed.setdefault(path, []).extend(
                ["GET", "HEAD"] if method == "GET" else [method]
            )

    @property
    def routes(self) -> list[tuple[str, str]]:
        """(method, path) of every route this app serves (HEAD too wherever GET is)."""
        return list(self._routes)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        kind = scope["type"]
        if kind == "http":
            method, path = scope["method"], scope["path"]
            handler = self._routes.get((method, path))
            if handler is None and method == "HEAD":
                handler = self._routes.get(("GET", path))
            if handler is not None:
                await self._guarded(handler, scope, receive, send)
            elif path in self._allowed:
                allowed = ", ".join(self._allowed[path])
                await send_error(
                    send,
                    RouterError(
                        405,
                        f"method not allowed: {path} takes {allowed}",
                        code="method_not_allowed",
                        headers={"allow": allowed},
                    ),
                )
            else:
                await send_error(
                    send, RouterError(404, f"no route {scope['path']}", code="not_found")
                )
        elif kind == "lifespan":
            await self._lifespan(receive, send)

    async def _guarded(self, handler: Handler, scope: Scope, receive: Receive, send: Send) -> None:
        """Run a handler; a bug becomes a logged 500 in the error envelope, never a traceback."""
        started = False

        async def tracking_send(message: Message) -> None:
            nonlocal started
            started = started or message["type"] == "http.response.start"
            await send(message)

        try:
            await handler(scope, receive, tracking_send)
        except Exception:
            self.metrics.internal_errors.inc()
            log.exception("event=internal_error path=%s", scope["path"])
            if not started:
                error = RouterError(500, "internal router error", type="server_error",
                                    code="internal_error")  # fmt: skip
                await send_error(send, error)

    async def start(self) -> None:
        self.metrics.gc_pauses.install()
        for service in self.services:
            started = service.start()
            if started is not None:
                await started
        self.ready = True

    def draining(self) -> None:
        """Told to stop, before the router's port waits for what it serves: not ready, and the
        services that serve requests of their own (the endpoint picker: a `drain` method) start
        finishing theirs now, within the same grace, not once the port is done."""
        self.ready = False
        for service in self.services:
            drain = getattr(service, "drain", None)
            if drain is not None:
                drain()

    async def stop(self) -> None:
        self.ready = False
        for service in reversed(self.services):
            stopped = service.stop()
            if stopped is not None:
                await stopped
        await self.router.upstream.aclose()
        self.router.ledger.close()
        self.metrics.gc_pauses.uninstall()

    async def _lifespan(self, receive: Receive, send: Send) -> None:
        while True:
            message = await receive()
            if message["type"] == "lifespan.startup":
                try:
                    await self.start()
                except Exception as exc:  # a router that cannot start must say why
                    log.exception("event=startup_failed")
                    await send({"type": "lifespan.startup.failed", "message": str(exc)})
                    return
                await send({"type": "lifespan.startup.complete"})
            elif message["type"] == "lifespan.shutdown":
                await self.stop()
                await send({"type": "lifespan.shutdown.complete"})
                return

    async def _chat(self, scope: Scope, receive: Receive, send: Send) -> None:
        await self.router.completion(scope, receive, send, chat=True)

    async def _completions(self, scope: Scope, receive: Receive, send: Send) -> None:
        await self.router.completion(scope, receive, send, chat=False)

    async def _models(self, scope: Scope, receive: Receive, send: Send) -> None:
        await send_json(send, 200, models_reply(self.router.view()))

    async def _usage(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            tenant = self.router.tenants.authenticate(header_map(scope).get("authorization"))
        except RouterError as error:
            await send_error(send, error)
            return
        try:
            body = await usage_response(
                self.router.ledger, tenant, self.router.budgets, self.router.wall()
            )
        except LedgerError as exc:  # the shared ledger cannot be reached
            log.warning("event=usage_unavailable error=%s", exc)
            unavailable = RouterError(503, "the usage ledger cannot be read now; retry shortly",
                                      type="server_error", code="ledger_unavailable",
                                      headers={"Retry-After": "1"})  # fmt: skip
            await send_error(send, unavailable)
            return
        await send_json(send, 200, body)

    async def _healthz(self, scope: Scope, receive: Receive, send: Send) -> None:
        await send_json(send, 200, {"status": "ok"})

    def readiness(self) -> tuple[bool, str, int]:
        """Whether the router is ready to serve (started, discovery synced, an endpoint to
        send requests to), why not, and how many endpoints are usable: `/readyz`, and the
        endpoint picker's health."""
        endpoints = self.router.view().endpoints()
        now = self.router.clock()
        usable = [e for e in endpoints if not e.is_ejected(now)]
        has_endpoints = bool(usable) or not self.ready_needs_endpoints
        if not self.ready:
            return False, "starting", len(usable)
        if not self.synced():
            return False, "discovery not synced", len(usable)
        if not has_endpoints:
            return False, "no usable endpoint", len(usable)
        return True, "ready", len(usable)

    async def _readyz(self, scope: Scope, receive: Receive, send: Send) -> None:
        ready, reason, usable = self.readiness()
        if ready:
            await send_json(send, 200, {"status": "ready", "endpoints": usable})
        else:
            await send_json(send, 503, {"status": "not ready", "reason": reason})

    async def _openapi(self, scope: Scope, receive: Receive, send: Send) -> None:
        await send_json(send, 200, openapi_document())
