"""Through a real Envoy, tiergate as its endpoint picker: the same tiers, tenants, budgets,
refusals and billing as on the router's own port, and the gateway following the picks."""

from __future__ import annotations

import asyncio
import http.client
import json
import socket
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager
from typing import Any
from urllib.parse import urlsplit

import httpx
import openai
import pytest
from envoy_gateway import Envoy
from epp_system import ALICE, BOB, CAROL, ERIN, System, address, chat, epp_system, post, slots_free
from grpc_health.v1 import health_pb2, health_pb2_grpc
from picker_channel import aio_channel
from polling_helpers import until

from tiergate.router.epp.server import HEALTH_NAMES

#: Real processes and servers: left out of `make test-fast`.
pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def system(
    tmp_path_factory: pytest.TempPathFactory, served: Callable[[Any], AbstractContextManager[str]]
) -> Iterator[System]:
    with epp_system(served, tmp_path_factory.mktemp("epp")) as running:
        yield running


@pytest.fixture(scope="module")
def envoy(system: System) -> Envoy:
    return system.envoy()


def test_the_openai_sdk_chats_and_streams_through_the_gateway(envoy: Envoy) -> None:
    client = openai.OpenAI(base_url=envoy.url + "/v1", api_key="alice-key-0123456789")
    reply = client.chat.completions.create(
        model="coder", messages=[{"role": "user", "content": "Hello"}], max_tokens=5
    )
    assert reply.choices[0].message.content
    assert reply.service_tier == "default"
    assert reply.usage is not None and reply.usage.completion_tokens == 5
    chunks = list(
        client.chat.completions.create(
            model="coder",
            messages=[{"role": "user", "content": "Hello"}],
            max_tokens=6,
            stream=True,
            stream_options={"include_usage": True},
        )
    )
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text
    usage = chunks[-1].usage
    assert usage is not None and usage.completion_tokens == 6
    assert (usage.model_extra or {})["cost_usd"] > 0  # billed, as the router's port says


@pytest.mark.parametrize(
    ("headers", "body", "tier", "service_tier"),
    [
        ({}, chat(max_tokens=3), "batched", "default"),
        ({"x-tiergate-tier": "premium"}, chat(max_tokens=3), "premium", "priority"),
        ({}, chat(max_tokens=3, speed="fast"), "premium", "priority"),
        ({}, chat(max_tokens=3, service_tier="priority"), "premium", "priority"),
        ({}, chat(max_tokens=3, service_tier="flex"), "batched", "flex"),
        ({}, chat("coder-spark", max_tokens=3), "wafer-scale", "default"),
    ],
)
def test_each_tier_is_chosen_and_served_as_on_the_routers_port(
    system: System,
    envoy: Envoy,
    headers: dict[str, str],
    body: dict[str, Any],
    tier: str,
    service_tier: str,
) -> None:
    r = post(envoy.url, body, headers)
    assert r.status_code == 200, r.text
    assert r.headers["server"] == "envoy"  # it came through the gateway
    assert r.headers["x-tiergate-tier"] == tier
    assert r.json()["service_tier"] == service_tier
    pool = r.headers["x-tiergate-pool"]
    (row,) = system.rows([r.headers["x-tiergate-request-id"]])
    assert row["tier_served"] == tier and row["pool"] == pool and row["outcome"] == "ok"
    assert row["endpoint"] in system.nodes[pool]
    assert row["cost_usd"] == pytest.approx(float(r.headers["x-tiergate-cost-usd"]), abs=1e-10)


def test_a_tenant_refused_a_tier_gets_the_403_envelope(envoy: Envoy) -> None:
    r = post(envoy.url, chat(max_tokens=3), {**BOB, "x-tiergate-tier": "premium"})
    assert r.status_code == 403, r.text
    assert r.headers["content-type"] == "application/json"
    error = r.json()["error"]
    assert (error["type"], error["code"]) == ("permission_error", "tier_not_allowed")
    assert "premium" in error["message"]


def test_a_bad_key_gets_the_401_envelope(envoy: Envoy) -> None:
    r = post(envoy.url, chat(max_tokens=3), {"authorization": "Bearer nobody-0123456789"})
    assert r.status_code == 401, r.text
    assert set(r.json()["error"]) >= {"message", "type", "code"}


def test_a_spent_budget_gets_the_429_envelope_with_retry_after(envoy: Envoy) -> None:
    statuses = []
    for _ in range(3):  # the first may still fit the budget; its cost spends it
        r = post(envoy.url, chat(max_tokens=3), CAROL)
        statuses.append(r.status_code)
        if r.status_code == 429:
            break
    assert statuses[-1] == 429, statuses
    error = r.json()["error"]
    assert (error["type"], error["code"]) == ("insufficient_quota", "budget_exceeded")
    assert int(r.headers["retry-after"]) >= 1


def test_a_rate_limited_tenant_gets_the_429_envelope(envoy: Envoy) -> None:
    statuses = [post(envoy.url, chat(max_tokens=2), ERIN).status_code for _ in range(2)]
    assert statuses == [200, 200]
    r = post(envoy.url, chat(max_tokens=2), ERIN)  # the third within the minute
    assert r.status_code == 429, r.text
    error = r.json()["error"]
    assert (error["type"], error["code"]) == ("rate_limit_error", "rate_limit_exceeded")
    assert int(r.headers["retry-after"]) >= 1


def test_a_body_that_is_not_json_gets_the_400_envelope(envoy: Envoy) -> None:
    r = post(envoy.url, b"{this is not json")
    assert r.status_code == 400, r.text
    assert "not valid JSON" in r.json()["error"]["message"]


def test_the_openai_sdk_lists_the_models_through_the_gateway(system: System, envoy: Envoy) -> None:
    """As the router's port lists them: a client that lists models first works behind the
    gateway too. No endpoint is picked for it, and nothing is billed."""
    rows_before = len(system.rows())
    client = openai.OpenAI(base_url=envoy.url + "/v1", api_key="alice-key-0123456789")
    listed = {m.id: (m.model_extra or {})["tiers"] for m in client.models.list()}
    own = httpx.get(system.url + "/v1/models", timeout=10).json()["data"]
    assert listed == {m["id"]: m["tiers"] for m in own}
    assert listed["coder"] == ["batched", "premium"] and listed["coder-spark"] == ["wafer-scale"]
    assert len(system.rows()) == rows_before
    refused = post(envoy.url, chat(), path="/v1/models")  # as the router's port refuses it
    assert refused.status_code == 405 and refused.headers["allow"] == "GET, HEAD"
    assert refused.json()["error"]["code"] == "method_not_allowed"


def test_an_unknown_path_gets_the_404_envelope(envoy: Envoy) -> None:
    r = post(envoy.url, chat(), path="/v1/embeddings")
    assert r.status_code == 404
    assert r.json()["error"]["code"] == "not_found"


def test_the_gateway_follows_the_picks_within_the_subset_hint(system: System, envoy: Envoy) -> None:
    """GIE's GatewayFollowingEPPRouting: every reply comes from an endpoint the picker was
    allowed to pick (here the gateway's subset hint: one node, then the other)."""
    for node in system.nodes["coder-batched"]:
        ids = []
        for _ in range(6):
            r = post(envoy.url, chat(max_tokens=2), {"x-test-subset": address(node)})
            assert r.status_code == 200, r.text
            ids.append(r.headers["x-tiergate-request-id"])
        assert {row["endpoint"] for row in system.rows(ids)} == {node}


def test_a_subset_with_no_endpoint_of_the_tier_gets_503(system: System, envoy: Envoy) -> None:
    spark = address(system.nodes["spark"][0])
    r = post(envoy.url, chat(max_tokens=2), {"x-test-subset": spark})  # a batched request
    assert r.status_code == 503, r.text
    assert r.json()["error"]["type"] == "server_error"


def test_a_client_cannot_choose_the_endpoint(system: System, envoy: Envoy) -> None:
    """A client's own x-gateway-destination-endpoint is not where the request goes."""
    spark = address(system.nodes["spark"][0])
    r = post(envoy.url, chat(max_tokens=2), {"x-gateway-destination-endpoint": spark})
    assert r.status_code == 200, r.text
    (row,) = system.rows([r.headers["x-tiergate-request-id"]])
    assert row["pool"] == "coder-batched" and row["endpoint"] != system.nodes["spark"][0]


def test_gateway_traffic_counts_in_usage_and_metrics(system: System, envoy: Envoy) -> None:
    def usage() -> dict[str, Any]:
        r = httpx.get(system.url + "/v1/usage", headers=ALICE, timeout=30)
        assert r.status_code == 200, r.text
        data: dict[str, Any] = r.json()
        return data

    def served() -> float:
        text = httpx.get(system.metrics + "/metrics", timeout=30).text
        return sum(
            float(line.rsplit(" ", 1)[1])
            for line in text.splitlines()
            if line.startswith("tiergate_requests_total{") and 'outcome="ok"' in line
        )

    before_usage, before_served = json.dumps(usage()), served()
    r = post(envoy.url, chat(max_tokens=2))
    assert r.status_code == 200
    assert served() == before_served + 1
    assert json.dumps(usage()) != before_usage


def test_billing_through_the_gateway_equals_the_routers_port(system: System, envoy: Envoy) -> None:
    """The same requests, once on each way in: the same rows but for ids and times."""
    bodies = [
        chat(max_tokens=4),
        chat(max_tokens=7, stream=True),
        chat(max_tokens=5, stream=True, stream_options={"include_usage": True}),
        chat(max_tokens=3, speed="fast"),
        chat("coder-spark", max_tokens=6, stream=True),
    ]

    def billed(base: str) -> list[tuple[Any, ...]]:
        ids = []
        for body in bodies:
            r = post(base, body)
            assert r.status_code == 200, r.text
            ids.append(r.headers["x-tiergate-request-id"])
        rows = {row["request_id"]: row for row in system.rows(ids)}
        keys = ("tier_requested", "tier_served", "pool", "prompt_tokens",
                "completion_tokens", "cost_usd", "http_status", "outcome")  # fmt: skip
        return [tuple(rows[i][k] for k in keys) for i in ids]

    assert billed(envoy.url) == billed(system.url)


def test_health_answers_for_the_protocols_names(system: System) -> None:
    async def check() -> dict[str, int]:
        async with aio_channel("127.0.0.1", system.epp.port) as channel:
            stub = health_pb2_grpc.HealthStub(channel)
            found = {}
            for name in (*HEALTH_NAMES, "liveness"):
                reply = await stub.Check(health_pb2.HealthCheckRequest(service=name))
                found[name] = reply.status
            return found

    serving = {health_pb2.HealthCheckResponse.SERVING}
    until(lambda: set(asyncio.run(check()).values()) == serving, "the picker is not SERVING")


def test_envoy_health_checks_the_picker_as_healthy(system: System) -> None:
    """A gateway's own gRPC health check of the picker's cluster (the protocol's name)."""
    checked = system.envoy(health_check=True)

    def healthy() -> bool:
        stats = checked.stats()
        return stats.get("cluster.epp.health_check.success", 0) >= 1

    until(healthy, "Envoy never found the picker healthy")
    assert checked.stats().get("cluster.epp.health_check.failure", 0) == 0


def test_every_slot_is_free_once_the_gateway_traffic_is_over(system: System) -> None:
    assert slots_free(system)


@pytest.mark.parametrize(
    ("headers", "body"),
    [
        ({"x-slo-ttft-ms": "-5"}, chat(max_tokens=2)),
        ({"x-slo-ttft-ms": "0.000001"}, chat(max_tokens=2)),
        ({}, chat("no-such-model", max_tokens=2)),
        ({"x-tiergate-tier": "wafer-scale"}, chat(max_tokens=2)),
        ({"x-tiergate-tier": "gold"}, chat(max_tokens=2)),
        ({}, chat(max_tokens=0)),
        ({}, {"model": "coder"}),
        ({"x-tiergate-cascade": "wafer-scale>premium"}, chat(max_tokens=2)),
    ],
    ids=[
        "bad-slo",
        "unattainable-slo",
        "unknown-model",
        "tier-not-serving",
        "unknown-tier",
        "zero-cap",
        "no-messages",
        "cascade-without-tools",
    ],  # fmt: skip
)
def test_a_request_gets_the_same_answer_through_the_gateway(
    system: System, envoy: Envoy, headers: dict[str, str], body: dict[str, Any]
) -> None:
    """One request path: the same status and error code on either way in."""
    direct, through = post(system.url, body, headers), post(envoy.url, body, headers)
    assert through.status_code == direct.status_code, (direct.text, through.text)
    if direct.status_code != 200:
        assert through.json()["error"]["code"] == direct.json()["error"]["code"]
    else:
        assert through.headers["x-tiergate-tier"] == direct.headers["x-tiergate-tier"]


def test_a_cascade_is_refused_through_the_gateway(envoy: Envoy) -> None:
    """A cascade needs a second attempt on another tier: the gateway sends a request once."""
    tools = [{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}]
    body = chat("coder-spark", max_tokens=2, tools=tools)
    r = post(envoy.url, body, {"x-tiergate-cascade": "wafer-scale>premium"})
    assert r.status_code == 400, r.text
    assert r.json()["error"]["code"] == "cascade_not_supported"


def test_a_chunked_request_body_and_one_larger_than_a_message_go_through(
    system: System, envoy: Envoy
) -> None:
    """Bodies as clients send them: in pieces (chunked), and longer than one ext_proc
    message carries (the picker sends them back in several)."""
    data = json.dumps(chat(max_tokens=2)).encode()

    def pieces() -> Iterator[bytes]:
        yield data[:10]
        yield data[10:]

    headers = {**ALICE, "content-type": "application/json"}
    r = httpx.post(envoy.url + "/v1/chat/completions", content=pieces(), headers=headers,
                   timeout=60)  # fmt: skip
    assert r.status_code == 200, r.text
    long_prompt = "word " * 40_000  # 200 kB
    body = {"model": "coder", "messages": [{"role": "user", "content": long_prompt}],
            "max_tokens": 2}  # fmt: skip
    direct, through = post(system.url, body), post(envoy.url, body)
    assert through.status_code == direct.status_code == 200, through.text
    assert through.json()["usage"]["prompt_tokens"] == direct.json()["usage"]["prompt_tokens"]


def post_with_trailers(url: str, body: bytes) -> http.client.HTTPResponse:
    """POST `body` chunked, with a trailer after it (an HTTP/1.1 client that checksums); the
    reply read whole."""
    where = urlsplit(url)
    assert where.hostname is not None and where.port is not None
    head = (
        "POST /v1/chat/completions HTTP/1.1\r\nhost: gateway\r\n"
        f"authorization: {ALICE['authorization']}\r\ncontent-type: application/json\r\n"
        "transfer-encoding: chunked\r\ntrailer: x-checksum\r\n\r\n"
    ).encode()
    chunk = b"%x\r\n%s\r\n0\r\nx-checksum: 1\r\n\r\n" % (len(body), body)
    with socket.create_connection((where.hostname, where.port), timeout=60) as sock:
        sock.sendall(head + chunk)
        reply = http.client.HTTPResponse(sock)
        reply.begin()
        reply.read()
        return reply


@pytest.mark.parametrize("fail_open", [False, True], ids=["full-duplex", "buffered"])
def test_a_body_followed_by_trailers_is_picked(system: System, fail_open: bool) -> None:
    fallback = address(system.nodes["coder-batched"][0]) if fail_open else None
    envoy = system.envoy(http1_trailers=True, fail_open=fail_open, fallback=fallback)
    reply = post_with_trailers(envoy.url, json.dumps(chat(max_tokens=2)).encode())
    assert reply.status == 200
    assert reply.headers["x-tiergate-request-id"]  # picked by tiergate, not the fallback


def test_a_body_up_to_the_router_s_limit_is_picked_when_the_gateway_fails_open(
    system: System,
) -> None:
    """A fail-open gateway buffers the whole body before the picker sees it: past its buffer
    limit it refuses the body itself (a 503 here, no envelope, nothing billed; the picker sees
    a reply before its pick). Its limit is set to
    the router's body limit (docs/operations/gateway.md), so a 2 MiB body (images, say) is
    picked and sent on as on the router's port (which sends a body past a MiB in pieces)."""
    fallback = address(system.nodes["coder-batched"][0])
    envoy = system.envoy(fail_open=True, fallback=fallback)
    long_prompt = "word " * 420_000  # 2.1 MB
    body = {"model": "coder", "messages": [{"role": "user", "content": long_prompt}],
            "max_tokens": 2}  # fmt: skip
    direct, through = post(system.url, body), post(envoy.url, body)
    # The node read it all, and says it holds more tokens than the model's context: the same
    # answer both ways, the gateway's picked by tiergate (not the fallback's).
    for reply in (direct, through):
        assert reply.status_code == 400, reply.text[:300]
        assert reply.json()["error"]["code"] == "context_length_exceeded"
        assert "420007 in the messages" in reply.json()["error"]["message"]
    assert through.headers["x-tiergate-request-id"]
