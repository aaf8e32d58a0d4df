"""The picker's gRPC health follows the router's readiness: a router with no endpoint to pick
is alive and not ready, as `/readyz` says."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from contextlib import AbstractContextManager
from pathlib import Path
from typing import Any

import grpc
import httpx
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from picker_channel import aio_channel

from tiergate.router.build import build_app
from tiergate.router.config import parse_config
from tiergate.router.discovery.view import StaticSource, build_view
from tiergate.router.epp.server import HEALTH_NAMES, EppServer
from tiergate.sim_nodes.catalogs import default_catalog

#: Real servers on real sockets: left out of `make test-fast`.
pytestmark = pytest.mark.slow


def test_a_router_with_nothing_to_pick_is_alive_and_not_ready(
    served: Callable[[Any], AbstractContextManager[str]], tmp_path: Path
) -> None:
    config = parse_config(
        f"router: {{ledgerPath: {tmp_path / 'ledger.sqlite'}, eppPort: 0}}\npools:\n"
        "  - {name: b, tier: batched, model: llama-3.1-8b, accelerator: wse-3, "
        "servedModelName: coder, endpoints: []}\n"
    )
    app = build_app(config, StaticSource(build_view(config.pools, default_catalog())))
    with served(app) as url:
        epp = next(s for s in app.services if isinstance(s, EppServer))

        async def check() -> dict[str, int]:
            async with aio_channel("127.0.0.1", epp.port) as channel:
                stub = health_pb2_grpc.HealthStub(channel)
                return {
                    name: (await stub.Check(health_pb2.HealthCheckRequest(service=name))).status
                    for name in (*HEALTH_NAMES, "liveness")
                }

        statuses = asyncio.run(check())
        assert httpx.get(url + "/readyz", timeout=10).status_code == 503
    assert statuses.pop("liveness") == health_pb2.HealthCheckResponse.SERVING
    assert set(statuses.values()) == {health_pb2.HealthCheckResponse.NOT_SERVING}


def test_told_to_stop_the_picker_drains_at_once_beside_the_router_s_port(tmp_path: Path) -> None:
    """The router's port waits up to its grace for what it serves; the picker must not wait
    for that before its own streams start theirs: `RouterApp.draining`, called as the server
    begins to stop, stops it taking streams at once (its health said NOT_SERVING first), and
    `stop`, later, is the same shutdown, not a second one."""
    config = parse_config(
        f"router: {{ledgerPath: {tmp_path / 'ledger.sqlite'}, eppPort: 0,"
        " eppTls: {enabled: false}}\npools:\n"
        "  - {name: b, tier: batched, model: llama-3.1-8b, accelerator: wse-3, "
        "servedModelName: coder, endpoints: ['http://127.0.0.1:9']}\n"
    )
    app = build_app(config, StaticSource(build_view(config.pools, default_catalog())))
    epp = next(s for s in app.services if isinstance(s, EppServer))

    async def run() -> None:
        await epp.start()
        app.ready = True
        app.draining()  # the router's port would now wait for its own requests
        assert not app.ready
        async with aio_channel("127.0.0.1", epp.port, tls=False) as channel:
            stub = health_pb2_grpc.HealthStub(channel)
            with pytest.raises(grpc.aio.AioRpcError) as refused:
                await stub.Check(health_pb2.HealthCheckRequest(service=""), timeout=5)
        assert refused.value.code() == grpc.StatusCode.UNAVAILABLE
        stopping = epp.stop()  # the app's own stop, later: the same shutdown
        assert stopping is epp.drain()
        await asyncio.wait_for(stopping, 30)

    asyncio.run(run())
