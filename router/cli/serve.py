"""Serving a router app with uvicorn on uvloop."""

from __future__ import annotations

from ..app import RouterApp

#: Open streams get this long to finish when the router is told to stop.
GRACEFUL_SHUTDOWN_S = 10


def run_router(app: RouterApp, host: str, port: int, log_level: str) -> bool:
    """Serve `app` on a uvloop event loop until SIGINT/SIGTERM; False if it could not start.

    uvloop (and httptools, which uvicorn picks when installed) take ~0.25 ms off every
    proxied request on the development machine (benchmarks/router_overhead.py).

    Everything alive once the app is built (modules, catalogs, the app: ~65,000 objects) is
    moved out of the garbage collector's reach (`gc.freeze`): a full collection over them held
    the event loop for 12-17 ms every few seconds under load, which showed as the tail of the
    per-token delay of 512 relayed streams. Objects made while serving are collected as usual.
    """
    import gc

    import uvloop

    gc.collect()
    gc.freeze()
    return uvloop.run(serve(app, host, port, log_level))


async def serve(app: RouterApp, host: str, port: int, log_level: str) -> bool:
    """Run until SIGINT/SIGTERM; False if the server could not start (port taken...)."""
    import uvicorn

    server = uvicorn.Server(
        uvicorn.Config(
            app,
            host=host,
            port=port,
            access_log=False,
            log_config=None,
            log_level=log_level,
            lifespan="on",
            http="httptools",
            timeout_graceful_shutdown=GRACEFUL_SHUTDOWN_S,
        )
    )
    await server.serve()
    return server.started
