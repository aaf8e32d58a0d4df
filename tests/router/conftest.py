"""Router tests' shared fixture: serving any ASGI app (a sim node, the router) with uvicorn on
a free localhost port, in a thread of its own, for tests that need real sockets."""

from __future__ import annotations

import socket
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager
from typing import Any

import pytest
import uvicorn

from tiergate.common.connection_limits import ConnectionGate
from tiergate.common.limited_protocol import server_options


@contextmanager
def serve_app(app: Any) -> Iterator[str]:
    """Yield the base URL of `app` served on 127.0.0.1; stop it on exit. An app that carries
    its connections' gate (the router's) is served within its limits, as its CLI serves it."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    gate = getattr(app, "connections", None)
    options = server_options(gate) if isinstance(gate, ConnectionGate) else {}
    server = uvicorn.Server(
        uvicorn.Config(app, log_level="warning", access_log=False, lifespan="on", **options)
    )
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    try:
        deadline = time.monotonic() + 20
        while not server.started:
            assert thread.is_alive() and time.monotonic() < deadline, "server did not start"
            time.sleep(0.01)
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(20)
        sock.close()


@pytest.fixture(scope="session")
def served() -> Callable[[Any], AbstractContextManager[str]]:
    """`with served(app) as url:` serves `app` on a real socket for the block."""
    return serve_app


@pytest.fixture
def router_recursion_limit() -> Iterator[None]:
    """Python's default recursion limit, which the router runs with: a test-only dependency
    (celpy) raises it on import, and the JSON nesting tests depend on it."""
    before = sys.getrecursionlimit()
    sys.setrecursionlimit(1000)
    try:
        yield
    finally:
        sys.setrecursionlimit(before)
