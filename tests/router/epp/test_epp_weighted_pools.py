"""Two GIE pools behind one route, weighted 70/30, each with its own tiergate picker (GIE's
conformance `GatewayWeightedAcrossTwoInferencePools`): a real Envoy splits the requests by the
weights (per-backend ext_proc, as gateways render it), and every request is picked, served and
billed within the pool the route chose."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, ExitStack
from pathlib import Path
from typing import Any

import pytest
from envoy_gateway import Envoy, GatewayConfig, start_envoy
from epp_system import System, chat, epp_system, node, post

#: Real processes and servers: left out of `make test-fast`.
pytestmark = pytest.mark.slow

REQUESTS = 200
WEIGHTS = (70, 30)
#: Four standard deviations of a binomial share at 200 requests: failing by chance ~1 in 15,000.
TOLERANCE = 4 * (0.7 * 0.3 / REQUESTS) ** 0.5


@pytest.fixture(scope="module")
def pools(
    tmp_path_factory: pytest.TempPathFactory, served: Callable[[Any], AbstractContextManager[str]]
) -> Iterator[tuple[System, System, Envoy]]:
    """Two routers, each the picker of its own pool's nodes, and one Envoy over both."""
    folder = tmp_path_factory.mktemp("epp-weighted")
    with ExitStack() as stack:
        systems = []
        for name, seed in (("a", 10), ("b", 20)):
            nodes = {
                "coder-batched": [node(["coder"], seed=seed), node(["coder"], seed=seed + 1)],
                "coder-premium": [node(["coder"], seed=seed + 2)],
                "spark": [node(["coder-spark"], seed=seed + 3)],
            }
            where = Path(folder / name)
            where.mkdir()
            systems.append(stack.enter_context(epp_system(served, where, nodes=nodes)))
        a, b = systems
        gateway = GatewayConfig(
            epp_port=0, weighted=[(WEIGHTS[0], a.epp.port), (WEIGHTS[1], b.epp.port)]
        )
        envoy = start_envoy(gateway, folder, "envoy-weighted")
        stack.callback(envoy.stop)
        yield a, b, envoy


def _nodes(system: System) -> set[str]:
    return {url for urls in system.nodes.values() for url in urls}


def test_the_route_splits_by_weight_and_each_pool_serves_and_bills_its_own(
    pools: tuple[System, System, Envoy],
) -> None:
    a, b, envoy = pools
    ids = []
    for _ in range(REQUESTS):
        reply = post(envoy.url, chat(max_tokens=1))
        assert reply.status_code == 200, reply.text
        ids.append(reply.headers["x-tiergate-request-id"])
    rows_a, rows_b = a.rows(ids), b.rows(ids)
    billed_a = {r["request_id"] for r in rows_a}
    billed_b = {r["request_id"] for r in rows_b}
    assert billed_a | billed_b == set(ids) and not billed_a & billed_b
    share = len(billed_a) / REQUESTS
    assert abs(share - WEIGHTS[0] / sum(WEIGHTS)) <= TOLERANCE, (len(billed_a), len(billed_b))
    # Each picker's requests were served by its own pool's nodes, and billed where served.
    assert {r["endpoint"] for r in rows_a} <= _nodes(a)
    assert {r["endpoint"] for r in rows_b} <= _nodes(b)
