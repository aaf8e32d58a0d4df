"""Serving a router app with uvicorn, and the errors that mean "cannot start"."""

from __future__ import annotations

import logging
import sys

from ..app import RouterApp

#: Open streams get this long to finish when the router is told to stop.
GRACEFUL_SHUTDOWN_S = 10

STARTUP_ERRORS: tuple[type[Exception], ...] = ()


def configure_logging(level: str) -> None:
    logging.basicConfig(
        level=level.upper(),
        stream=sys.stderr,
        format="ts=%(asctime)s level=%(levelname)s logger=%(name)s %(message)s",
    )


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
            timeout_graceful_shutdown=GRACEFUL_SHUTDOWN_S,
        )
    )
    await server.serve()
    return server.started
