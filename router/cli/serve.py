"""Serving a router app with uvicorn on uvloop, within its connection limits: the tenant-facing
port and, beside it in the same event loop, the metrics port (router/http/metrics_app.py)."""

from __future__ import annotations

import logging
import resource
import socket
from collections.abc import Callable

from tiergate.common.cli import CliError
from tiergate.common.connection_limits import ConnectionGate, ConnectionLimits
from tiergate.common.fd_budget import FdBudgetError, max_connections
from tiergate.router.config import ConnectionSettings
from tiergate.router.http.app import RouterApp
from tiergate.router.upstream import proxy

log = logging.getLogger("tiergate.router")


#: File descriptors kept beside client connections and their upstream ones: the scraper's
#: idle connection to each endpoint (a few hundred), the Kubernetes watches, the ledger's
#: files, a reloaded file while it is read, the event loop's and the standard streams.
RESERVED_FDS = 256
#: Connections the metrics port holds at once: a few scrapers, never the tenants' load.
METRICS_MAX_CONNECTIONS = 16


def connection_cap(settings: ConnectionSettings) -> int:
    """The most client connections the router may hold (tiergate/common/fd_budget.py);
    CliError when `router.connections.maxConnections` does not fit the open-file limit."""
    try:
        cap, _ = max_connections(
            settings.max_connections,
            setting="router.connections.maxConnections",
            reserve=RESERVED_FDS + METRICS_MAX_CONNECTIONS,
            upstream_pool=proxy.MAX_CONNECTIONS,
        )
    except FdBudgetError as exc:
        raise CliError(str(exc)) from None
    return cap


def log_connection_limits(settings: ConnectionSettings, cap: int) -> None:
    """The limits the router serves within, logged once it is about to serve (a start that
    fails on something else is then its one error line)."""
    open_files = resource.getrlimit(resource.RLIMIT_NOFILE)[0]  # as max_connections raised it
    log.info("event=connection_limits %s open_file_limit=%d",
             settings.limits(cap).summary(), open_files)  # fmt: skip


def run_router(
    app: RouterApp,
    sock: socket.socket,
    metrics_sock: socket.socket,
    log_level: str,
    on_started: Callable[[], None] | None = None,
) -> bool:
    """Serve `app` on `sock` and its metrics on `metrics_sock` (both bound and listening:
    common.listen_socket) on a uvloop event loop until SIGINT/SIGTERM; False if it could not
    start. `on_started` is called once both serve.

    uvloop (and httptools, which uvicorn picks when installed) make every proxied request
    cheaper (benchmarks/router_overhead.py). The cyclic garbage collector is what holds the
    event loop longest, and so sets the tail of the per-token delay of many relayed streams:
    everything alive once the app is built is moved out of its reach (`gc.freeze`), and full
    collections run after 1,000 middle-generation ones instead of 10 (with hundreds of live
    streams a full collection takes milliseconds). Young collections are unchanged, and
    garbage freed by reference counting (nearly all of it) never waits for a collection.
    """
    import gc

    import uvloop

    gc.collect()
    gc.freeze()
    young, middle, _ = gc.get_threshold()
    gc.set_threshold(young, middle, 1000)
    return uvloop.run(serve(app, sock, metrics_sock, log_level, on_started))


async def serve(
    app: RouterApp,
    sock: socket.socket,
    metrics_sock: socket.socket,
    log_level: str,
    on_started: Callable[[], None] | None = None,
) -> bool:
    """Run until SIGINT/SIGTERM; False if the server could not start.

    The metrics port's server starts once the app's lifespan has, and stops first: it
    handles no signals of its own (the app's server does), and it reads what the app owns.
    Told to stop, both let the requests in flight finish for up to `app.shutdown_grace_s`.
    """
    import uvicorn

    from tiergate.common.limited_protocol import server_options

    grace = app.shutdown_grace_s

    metrics_gate = ConnectionGate(ConnectionLimits(max_connections=METRICS_MAX_CONNECTIONS), log)
    metrics_server = uvicorn.Server(
        uvicorn.Config(
            app.metrics_app,
            access_log=False,
            log_config=None,
            log_level=log_level,
            lifespan="off",
            **server_options(metrics_gate),
            proxy_headers=False,
            timeout_graceful_shutdown=grace,
        )
    )

    class Server(uvicorn.Server):
        async def startup(self, sockets: list[socket.socket] | None = None) -> None:
            await super().startup(sockets)
            if self.started:
                # What uvicorn.Server.serve does before its startup (its signal handling
                # aside: this server's signals stop both).
                if not metrics_server.config.loaded:
                    metrics_server.config.load()
                metrics_server.lifespan = metrics_server.config.lifespan_class(
                    metrics_server.config
                )
                await metrics_server.startup(sockets=[metrics_sock])
                if on_started is not None:
                    on_started()

        async def shutdown(self, sockets: list[socket.socket] | None = None) -> None:
            app.draining()  # the endpoint picker's streams get the same grace, at once
            if metrics_server.started:
                await metrics_server.shutdown(sockets=[metrics_sock])
            await super().shutdown(sockets)

    server = Server(
        uvicorn.Config(
            app,
            access_log=False,
            log_config=None,
            log_level=log_level,
            lifespan="on",
            # httptools, with the timeouts and the connection cap uvicorn lacks.
            **server_options(app.connections),
            # The router reads no client address, and logs none: the X-Forwarded-* rewrite
            # would cost every request ~2% for nothing.
            proxy_headers=False,
            timeout_graceful_shutdown=grace,
        )
    )
    await server.serve(sockets=[sock])
    return server.started
