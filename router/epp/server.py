"""The endpoint picker's gRPC server: Envoy's ext_proc service and the gRPC health service,
on the router's event loop beside its HTTP ports (a service the router app starts and stops).

Health answers for the names the endpoint picker protocol and its gateways use: `liveness`
(the process serves), and `readiness`, `envoy.service.ext_proc.v3.ExternalProcessor`,
`inference-extension` and the empty name, which follow the router's own readiness (`/readyz`:
started, discovery synced, an endpoint to pick).

A stream that breaks (Envoy resets it) ends as a client that left, quietly; one whose messages
are out of order ends with INVALID_ARGUMENT; one the picker itself failed on (a bug) is logged,
counted as an internal error, and ends with INTERNAL.
"""

from __future__ import annotations

import asyncio
import logging
import os
import traceback
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc

from tiergate.router.config import SHUTDOWN_GRACE_S, EppTls
from tiergate.router.endpoints.state import EndpointState
from tiergate.router.epp import protocol
from tiergate.router.epp.deadline import PICK_WITHIN_S
from tiergate.router.epp.stream import End, GatewayStream, ProtocolViolation
from tiergate.router.epp.tls import TlsFiles, TlsProblem, server_credentials
from tiergate.router.handler import Router

__all__ = ["EppServer", "HEALTH_NAMES"]

log = logging.getLogger("tiergate.router")

#: Health service names that follow readiness (`liveness` is served once the server is up).
HEALTH_NAMES = ("", "readiness", protocol.SERVICE, "inference-extension")
#: How often health follows the router's readiness.
HEALTH_INTERVAL_S = 1.0


class EppServer:
    """Serves the endpoint picker on `host:port` (0: any free port; `port` says which once
    started), over TLS unless `tls` says not (router/epp/tls.py). A buffered request body
    waits at most `pick_within_s` for its pick (router/epp/deadline.py)."""

    def __init__(
        self,
        router: Router,
        host: str,
        port: int,
        *,
        fallbacks: int = 0,
        tls: EppTls | None = None,
        ready: Callable[[], bool] = lambda: True,
        on_failure: Callable[[EndpointState], object] = lambda e: None,
        internal_error: Callable[[], None] = lambda: None,
        pick_within_s: float = PICK_WITHIN_S,
        grace_s: float = SHUTDOWN_GRACE_S,
    ) -> None:
        self.router, self.host, self.port = router, host, port
        #: Open streams get this long to finish when the router stops (router.shutdownGraceS).
        self.grace_s = grace_s
        self.fallbacks = fallbacks
        self.pick_within_s = pick_within_s
        self.tls = tls if tls is not None else EppTls()
        self._ready = ready
        self._on_failure = on_failure
        self._internal_error = internal_error
        self._server: grpc.aio.Server | None = None
        self._health = health.aio.HealthServicer()
        self._health_task: asyncio.Task[None] | None = None
        self._stopped: asyncio.Future[None] | None = None
        #: Requests still running, whose streams may have ended (kept until they finish).
        self.requests: set[asyncio.Task[None]] = set()

    @property
    def url(self) -> str:
        shown = f"[{self.host}]" if ":" in self.host else self.host
        return f"{'grpcs' if self.tls.enabled else 'grpc'}://{shown}:{self.port}"

    async def start(self) -> None:
        server = grpc.aio.server()
        protocol.add_servicer(_Servicer(self), server)
        health_pb2_grpc.add_HealthServicer_to_server(self._health, server)
        address = f"{self.host}:{self.port}"
        try:
            if self.tls.enabled:
                self.port = server.add_secure_port(address, self._credentials())
            else:
                self.port = server.add_insecure_port(address)
        except RuntimeError as exc:
            raise OSError(f"the endpoint picker cannot listen on {self.url}: {exc}") from None
        await server.start()
        self._server = server
        await self._health.set("liveness", health_pb2.HealthCheckResponse.SERVING)
        await self._follow_readiness()
        self._health_task = asyncio.create_task(self._keep_health(), name="tiergate-epp-health")
        log.info("event=epp_listening epp_url=%s", self.url)

    def _credentials(self) -> grpc.ServerCredentials:
        tls = self.tls
        files = None
        if tls.cert_file is not None and tls.key_file is not None:
            files = TlsFiles(tls.cert_file, tls.key_file)
        try:
            return server_credentials(files)
        except TlsProblem as problem:
            raise OSError(f"the endpoint picker's TLS (router.eppTls): {problem}") from None

    def drain(self) -> Awaitable[None]:
        """Told to stop: health says NOT_SERVING, no new stream is taken, and the open ones
        get `grace_s` to finish, beside the router's port (`RouterApp.draining`); `stop` then
        waits for the same."""
        return self.stop()

    def stop(self) -> Awaitable[None]:
        if self._stopped is None:
            self._stopped = asyncio.ensure_future(self._stop())
        return self._stopped

    async def _stop(self) -> None:
        if self._health_task is not None:
            self._health_task.cancel()
        if self._server is not None:
            await self._health.enter_graceful_shutdown()
            await self._server.stop(self.grace_s)
        for task in list(self.requests):  # their streams are gone: each ends as a client left
            task.cancel()
        if self.requests:
            await asyncio.gather(*self.requests, return_exceptions=True)

    async def _follow_readiness(self) -> None:
        status = (
            health_pb2.HealthCheckResponse.SERVING
            if self._ready()
            else health_pb2.HealthCheckResponse.NOT_SERVING
        )
        for name in HEALTH_NAMES:
            await self._health.set(name, status)

    async def _keep_health(self) -> None:
        # Its first look comes as soon as the router's start is over (this server starts last).
        while True:
            await self._follow_readiness()
            await asyncio.sleep(HEALTH_INTERVAL_S)

    def stream(self) -> GatewayStream:
        return GatewayStream(
            self.router,
            fallbacks=self.fallbacks,
            on_failure=self._on_failure,
            internal_error=self._internal_error,
            max_reply_bytes=self.router.settings.max_reply_bytes,
            pick_within_s=self.pick_within_s,
        )


class FeedFailed(Exception):
    """The picker failed on one of Envoy's messages (a bug, logged where it happened)."""


class _Servicer:
    """`envoy.service.ext_proc.v3.ExternalProcessor`: one `Process` stream per request."""

    def __init__(self, server: EppServer) -> None:
        self._server = server

    async def Process(  # noqa: N802 (the gRPC method's name)
        self, requests: AsyncIterator[Any], context: grpc.aio.ServicerContext[Any, Any]
    ) -> AsyncIterator[Any]:
        stream = self._server.stream()
        reader = asyncio.create_task(_read(requests, stream), name="tiergate-epp-read")
        try:
            while True:
                answer = await stream.outbox.get()
                if isinstance(answer, End):
                    break
                yield answer
            error = reader.exception() if reader.done() and not reader.cancelled() else None
            if isinstance(error, ProtocolViolation):
                log.warning("event=epp_protocol_violation problem=%s", error)
                await context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(error))
            elif isinstance(error, FeedFailed):
                self._server._internal_error()
                await context.abort(grpc.StatusCode.INTERNAL, "internal endpoint picker error")
        finally:
            reader.cancel()
            stream.ended()
            task = stream.task
            if task is not None and not task.done():
                self._server.requests.add(task)
                task.add_done_callback(self._server.requests.discard)


async def _read(requests: AsyncIterator[Any], stream: GatewayStream) -> None:
    """Feed the stream Envoy's messages until it ends them; then the stream ends too."""
    try:
        async for request in requests:
            try:
                stream.feed(request)
            except ProtocolViolation:
                raise
            except Exception as exc:
                _log_feed_failure(request, exc)
                raise FeedFailed from exc
    except (ProtocolViolation, FeedFailed):
        stream.outbox.put_nowait(End())
        raise
    except Exception:  # the stream broke (reset): as if the client left
        stream.outbox.put_nowait(End())
        return
    stream.half_closed()  # Envoy sends no more; the answers still owed go out


def _log_feed_failure(request: Any, exc: Exception) -> None:
    """Where the picker failed and on what kind of message; not the exception's message, which
    may quote a header (a key) or the body. Its traceback only at debug level."""
    where = traceback.extract_tb(exc.__traceback__)[-1]
    log.error("event=internal_error via=epp phase=%s error=%s at=%s:%s function=%s",
              protocol.phase(request), type(exc).__name__, os.path.basename(where.filename),
              where.lineno, where.name)  # fmt: skip
    log.debug("event=internal_error via=epp traceback", exc_info=exc)
