"""Serving a router app with uvicorn on uvloop."""

from __future__ import annotations

import socket

from ..app import RouterApp

#: Open streams get this long to finish when the router is told to stop.
GRACEFUL_SHUTDOWN_S = 10


def run_router(app: RouterApp, sock: socket.socket, log_level: str) -> bool:
    """Serve `app` on `sock` (bound: common.listen_socket) on a uvloop event loop until
    SIGINT/SIGTERM; False if it could not start.

    uvloop (and httptools, which uvicorn picks when installed) take ~0.25 ms off every
    proxied request on the development machine (benchmarks/router_overhead.py).

    The cyclic garbage collector is what holds the event loop longest, and so sets the tail of
    the per-token delay of many relayed streams (benchmarks/router_overhead.py, 512 streams):
    - everything alive once the app is built (modules, catalogs, the app: ~65,000 objects) is
      moved out of its reach (`gc.freeze`): a full collection over them took 12-17 ms;
    - full collections run after 1,000 middle-generation ones instead of 10. With 512 live
      streams a full collection still takes ~15 ms (their objects are live), and by default it
      came every few seconds; now minutes apart. Young collections are unchanged, and garbage
      freed by reference counting (nearly all of it) never waits for a collection.
    Measured, 6 rounds each, the router's per-chunk received-minus-written p99: 1.32-3.67 ms
    before, 1.23-2.14 ms after.
    """
    import gc

    import uvloop

    gc.collect()
    gc.freeze()
    young, middle, _ = gc.get_threshold()
    gc.set_threshold(young, middle, 1000)
    return uvloop.run(serve(app, sock, log_level))


async def serve(app: RouterApp, sock: socket.socket, log_level: str) -> bool:
    """Run until SIGINT/SIGTERM; False if the server could not start."""
    import uvicorn

    server = uvicorn.Server(
        uvicorn.Config(
            app,
            access_log=False,
            log_config=None,
            log_level=log_level,
            lifespan="on",
            http="httptools",
            # The router reads no client address, and logs none: the X-Forwarded-* rewrite
            # would cost every request ~2% for nothing.
            proxy_headers=False,
            timeout_graceful_shutdown=GRACEFUL_SHUTDOWN_S,
        )
    )
    await server.serve(sockets=[sock])
    return server.started
