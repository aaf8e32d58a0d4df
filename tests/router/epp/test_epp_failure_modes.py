"""What a GIE gateway does when its endpoint picker is away (FailClose, FailOpen) or slow to
pick, with the picker's fallbacks, and that the endpoint that served is the one billed."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import AbstractContextManager
from pathlib import Path
from typing import Any

import httpx
import pytest
from envoy_gateway import GatewayConfig, start_envoy
from epp_system import StandIn, System, address, chat, epp_system, node, picker_alone, post
from loopback_ports import free_port
from polling_helpers import until

#: Real processes and servers: left out of `make test-fast`.
pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def system(
    tmp_path_factory: pytest.TempPathFactory, served: Callable[[Any], AbstractContextManager[str]]
) -> Iterator[System]:
    with epp_system(served, tmp_path_factory.mktemp("epp-failure")) as running:
        yield running


def test_fail_closed_the_gateway_refuses_while_the_picker_is_away(system: System) -> None:
    envoy = system.envoy(epp_port=free_port())
    r = post(envoy.url, chat(max_tokens=2))
    assert r.status_code == 503, r.text


def test_fail_open_the_gateway_serves_from_its_fallback_while_the_picker_is_away(
    system: System,
) -> None:
    fallback = address(system.nodes["coder-batched"][0])
    envoy = system.envoy(epp_port=free_port(), fail_open=True, fallback=fallback)
    r = post(envoy.url, chat(max_tokens=2))
    assert r.status_code == 200, r.text
    assert "x-tiergate-tier" not in r.headers  # nobody picked: the node answered as it is
    assert r.json()["usage"]["completion_tokens"] == 2


@pytest.mark.parametrize("stream", [False, True])
def test_fail_open_config_with_the_picker_up_picks_and_bills(system: System, stream: bool) -> None:
    """A FailOpen pool's gateway sends whole request bodies (buffered): the picker answers
    the body with its pick, and still rewrites and bills the streamed reply."""
    fallback = address(system.nodes["coder-batched"][0])
    envoy = system.envoy(fail_open=True, fallback=fallback)
    r = post(envoy.url, chat(max_tokens=4, stream=stream), {"x-tiergate-tier": "premium"})
    assert r.status_code == 200, r.text
    assert r.headers["x-tiergate-tier"] == "premium"
    (row,) = system.rows([r.headers["x-tiergate-request-id"]])
    assert row["pool"] == "coder-premium" and row["completion_tokens"] == 4
    assert row["outcome"] == "ok" and row["cost_usd"] > 0


class _NeverPicks(StandIn):
    """A request path whose request waits for a slot that never frees, until it is gone."""

    async def completion(self, scope: Any, receive: Any, send: Any, **_: Any) -> None:
        while (await receive())["type"] != "http.disconnect":
            pass


async def test_fail_open_a_pick_not_made_in_time_is_refused_not_sent_on_unpicked(
    tmp_path: Path,
) -> None:
    """The gateway, as documented, waits for a buffered body's pick longer than the picker
    lets it take: the client gets the picker's refusal, not the fallback unpicked."""
    async with picker_alone(router=_NeverPicks(), pick_within_s=0.5) as picker:
        gateway = GatewayConfig(picker.port, fail_open=True, fallback=f"127.0.0.1:{free_port()}",
                                epp_tls=False)  # fmt: skip
        envoy = start_envoy(gateway, tmp_path)
        try:
            r = await asyncio.to_thread(post, envoy.url, chat(max_tokens=2))
        finally:
            envoy.stop()
    assert r.status_code == 429, r.text
    assert json.loads(r.content)["error"]["code"] == "pick_timeout"
    assert r.headers["retry-after"] == "1"


def test_a_pick_not_made_in_time_is_recorded_as_refused_under_its_request_id(
    served: Callable[[Any], AbstractContextManager[str]], tmp_path: Path
) -> None:
    """The premium tier's 16 slots are taken by long replies; a FailOpen gateway's request
    waits for one past the picker's bound. Its refusal carries the request id the router's
    records use, and the router counts it as shed, not as a client that left."""
    slow = {  # premium on an H100: seconds a reply
        "coder-batched": [node(["coder"])],
        "coder-premium": [node(["coder"], accelerator="h100-sxm")],
        "spark": [node(["coder-spark"])],
    }
    with epp_system(served, tmp_path, nodes=slow) as system:
        system.epp.pick_within_s = 0.5
        premium = {"x-tiergate-tier": "premium"}
        fallback = address(system.nodes["coder-premium"][0])
        envoy = system.envoy(fail_open=True, fallback=fallback)
        with ThreadPoolExecutor(16) as holders:
            held = [
                holders.submit(post, system.url, chat(max_tokens=600), premium) for _ in range(16)
            ]
            until(lambda: slots_taken(system) == 16, "the premium slots were not all taken", 30)
            r = post(envoy.url, chat(max_tokens=2), premium)
            assert r.status_code == 429, r.text
            assert json.loads(r.content)["error"]["code"] == "pick_timeout"
            request_id = r.headers["x-tiergate-request-id"]
            assert len(request_id) == 32
            until(lambda: outcomes(system).get("shed", 0) == 1, "the refusal was not counted", 30)
            assert outcomes(system).get("client_disconnect", 0) == 0
            assert all(holder.result().status_code == 200 for holder in held)


def slots_taken(system: System) -> int:
    return sum(q.active for q in system.app.router.admission.queues.values())


def outcomes(system: System) -> dict[str, float]:
    """tiergate_requests_total by outcome."""
    found: dict[str, float] = {}
    for line in httpx.get(system.metrics + "/metrics", timeout=10).text.splitlines():
        if line.startswith("tiergate_requests_total{"):
            outcome = line.split('outcome="')[1].split('"')[0]
            found[outcome] = found.get(outcome, 0.0) + float(line.split()[-1])
    return found


@pytest.mark.parametrize("fallbacks", [1, 0])
def test_fallbacks_the_gateway_walks_the_list_and_the_served_endpoint_is_billed(
    served: Callable[[Any], AbstractContextManager[str]],
    tmp_path_factory: pytest.TempPathFactory,
    fallbacks: int,
) -> None:
    """With `eppFallbacks: 1` the pick names a second endpoint; a gateway whose load balancer
    reads the list (Envoy's override_host) retries there when the first fails, and tells the
    picker which served (GIE's served endpoint): that endpoint's row, that endpoint's pool.
    With none, the gateway's own retry goes elsewhere, and the one that served is billed
    still."""
    nodes = {
        "coder-batched": [node(["coder"], failure_rate=1.0), node(["coder"], seed=1)],
        "coder-premium": [node(["coder"])],
        "spark": [node(["coder-spark"])],
    }
    folder = tmp_path_factory.mktemp("epp-fallbacks")
    with epp_system(served, folder, router=f"eppFallbacks: {fallbacks}", nodes=nodes) as system:
        failing, good = system.nodes["coder-batched"]
        envoy = system.envoy(override_host=[address(u) for u in system.nodes["coder-batched"]],
                             retries=2)  # fmt: skip
        ids = []
        for _ in range(8):
            r = post(envoy.url, chat(max_tokens=2))
            assert r.status_code == 200, r.text
            ids.append(r.headers["x-tiergate-request-id"])
        rows = system.rows(ids)
        assert len(rows) == len(ids)
        assert {row["endpoint"] for row in rows} == {good}
        assert {row["outcome"] for row in rows} == {"ok"}
        first = next(e for e in system.app.router.view().endpoints() if e.url == failing)
        # Picked first at least once: the gateway went past it, which counts as its failure.
        assert first.consecutive_failures > 0 or first.ejections > 0


@pytest.mark.parametrize("stream", [False, True])
def test_a_gateway_retry_to_another_tier_s_pod_is_billed_at_the_tier_that_served(
    served: Callable[[Any], AbstractContextManager[str]],
    tmp_path_factory: pytest.TempPathFactory,
    stream: bool,
) -> None:
    """The GIE pool the operator keeps selects every pool's pods, so a gateway's own retry
    past the pick (no fallbacks) may reach a pod of another tier. The reply is billed, and
    its headers say, the tier and pool that served it, not those picked."""
    nodes = {
        "coder-batched": [node(["coder"], failure_rate=1.0)],
        "coder-premium": [node(["coder"])],
        "spark": [node(["coder-spark"])],
    }
    folder = tmp_path_factory.mktemp("epp-other-tier")
    with epp_system(served, folder, nodes=nodes) as system:
        (failing,), (premium,) = system.nodes["coder-batched"], system.nodes["coder-premium"]
        envoy = system.envoy(override_host=[address(failing), address(premium)], retries=2)
        r = post(envoy.url, chat(max_tokens=3, stream=stream))
        assert r.status_code == 200, r.text
        replies = [
            json.loads(line[6:])
            for line in r.text.splitlines()
            if line.startswith("data: {")
        ] if stream else [r.json()]  # fmt: skip
        assert replies and {reply["service_tier"] for reply in replies} == {"priority"}
        assert r.headers["x-tiergate-tier"] == "premium"
        assert r.headers["x-tiergate-pool"] == "coder-premium"
        (row,) = system.rows([r.headers["x-tiergate-request-id"]])
        assert (row["pool"], row["tier_served"], row["endpoint"]) == (
            "coder-premium",
            "premium",
            premium,
        )
        pool = system.app.router.view().pools["coder-premium"]
        assert row["cost_usd"] == pytest.approx(
            pool.cost_usd(row["prompt_tokens"], row["completion_tokens"])
        )
        picked = next(e for e in system.app.router.view().endpoints() if e.url == failing)
        assert picked.consecutive_failures > 0 or picked.ejections > 0
