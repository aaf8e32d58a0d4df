"""Sim-node tests run the app in-process: httpx.ASGITransport plus the node started by hand
(ASGITransport does not run lifespans) on a virtual clock, so steps cost no real time."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest
from sim_server_helpers import ClientFactory, node_config

from tiergate.sim_nodes.engine.clock import VirtualClock
from tiergate.sim_nodes.server import create_app, running


@pytest.fixture
async def make_client() -> AsyncIterator[ClientFactory]:
    """`await make_client(clock=..., **NodeConfig fields)` -> a client of a running node."""
    stack: list[tuple[Any, httpx.AsyncClient]] = []

    async def make(clock: Any = None, **overrides: Any) -> httpx.AsyncClient:
        app = create_app(node_config(**overrides), clock=clock or VirtualClock())
        runner = running(app)
        await runner.__aenter__()
        client = httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://node")
        client.app = app  # type: ignore[attr-defined]
        stack.append((runner, client))
        return client

    yield make
    for runner, client in reversed(stack):
        await client.aclose()
        await runner.__aexit__(None, None, None)


@pytest.fixture
async def client(make_client: ClientFactory) -> httpx.AsyncClient:
    return await make_client()
