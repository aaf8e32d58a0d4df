"""Hosted pools beside a gateway: the router's own port sends requests to a provider's API, a
real Envoy reaches the pods alone. A tier that only hosted pools serve is no tier of the
gateway's: asked for by name, a clear 400 (not a 503 to retry for ever); with `service_tier:
auto`, or by spill-over, the request goes to a tier with pods."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, ExitStack
from typing import Any

import httpx
import pytest
from envoy_gateway import Envoy
from epp_system import ALICE, System, chat, epp_system, node, post

from tiergate.sim_nodes.server import create_app

#: Real processes and servers: left out of `make test-fast`.
pytestmark = pytest.mark.slow

WAFER = {"x-tiergate-tier": "wafer-scale"}


@pytest.fixture(scope="module")
def system(
    tmp_path_factory: pytest.TempPathFactory, served: Callable[[Any], AbstractContextManager[str]]
) -> Iterator[System]:
    """The usual three pools of pods, and two hosted pools on a provider (a sim node standing
    in for its API): `coder` in the wafer-scale tier, where no pod serves `coder`, and `solo`,
    which only the provider serves."""
    folder = tmp_path_factory.mktemp("epp-hosted")
    key = folder / "provider.key"
    key.write_text("provider-key-0123456789\n")
    with ExitStack() as stack:
        provider = stack.enter_context(served(create_app(node(["provider-coder"]))))
        endpoint = (
            f"endpoint: {{url: {json.dumps(provider + '/v1')}, model: provider-coder, "
            f"apiKeyFile: {json.dumps(str(key))}}}, "
            "billing: {inputPerMillionUsd: 1, outputPerMillionUsd: 2}"
        )
        pools = (
            f"  - {{name: coder-hosted, tier: wafer-scale, model: llama-3.1-8b, "
            f"servedModelName: coder, {endpoint}}}\n"
            f"  - {{name: solo-hosted, tier: batched, model: llama-3.1-8b, "
            f"servedModelName: solo, {endpoint}}}\n"
        )
        yield stack.enter_context(epp_system(served, folder, pools=pools))


@pytest.fixture(scope="module")
def envoy(system: System) -> Envoy:
    return system.envoy()


def _error(reply: Any) -> dict[str, Any]:
    error: dict[str, Any] = json.loads(reply.content)["error"]
    return error


def test_the_router_s_own_port_serves_the_hosted_tier(system: System) -> None:
    reply = post(system.url, chat(max_tokens=3), WAFER)
    assert reply.status_code == 200, reply.text
    assert reply.headers["x-tiergate-pool"] == "coder-hosted"
    assert post(system.url, chat("solo", max_tokens=3)).status_code == 200


def test_through_the_gateway_a_tier_only_hosted_pools_serve_is_refused_with_why(
    envoy: Envoy,
) -> None:
    reply = post(envoy.url, chat(max_tokens=3), WAFER)
    assert reply.status_code == 400, reply.text
    error = _error(reply)
    assert error["code"] == "tier_not_served", error
    assert "only by hosted pools" in error["message"] and "own port" in error["message"]
    assert "tiers serving it through the gateway: batched, premium" in error["message"]


def test_through_the_gateway_auto_moves_to_a_tier_with_pods(envoy: Envoy) -> None:
    reply = post(envoy.url, chat(max_tokens=3, service_tier="auto"), WAFER)
    assert reply.status_code == 200, reply.text
    assert reply.headers["x-tiergate-tier"] == "batched"
    assert reply.headers["x-tiergate-tier-requested"] == "wafer-scale"
    assert reply.headers["x-tiergate-fallback"] == "true"
    assert reply.headers["x-tiergate-pool"] == "coder-batched"


def test_through_the_gateway_a_model_only_hosted_pools_serve_is_not_found(envoy: Envoy) -> None:
    reply = post(envoy.url, chat("solo", max_tokens=3))
    assert reply.status_code == 404, reply.text
    error = _error(reply)
    assert error["code"] == "model_not_found", error
    assert "only by hosted pools" in error["message"], error


def test_the_gateway_s_model_list_is_what_it_can_serve(envoy: Envoy, system: System) -> None:
    def listed(base: str) -> dict[str, list[str]]:
        reply = httpx.get(base + "/v1/models", headers=ALICE, timeout=30)
        assert reply.status_code == 200, reply.text
        return {m["id"]: m["tiers"] for m in reply.json()["data"]}

    through_gateway, own_port = listed(envoy.url), listed(system.url)
    assert through_gateway["coder"] == ["batched", "premium"] and "solo" not in through_gateway
    assert own_port["coder"] == ["batched", "premium", "wafer-scale"]
    assert own_port["solo"] == ["batched"]
