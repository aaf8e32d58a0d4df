"""The picker's ext_proc messages and its pick, without a gateway: what Envoy reads from them."""

from __future__ import annotations

import asyncio

import pytest
from envoy.config.core.v3 import base_pb2
from envoy.service.ext_proc.v3 import external_processor_pb2 as ext
from google.protobuf import struct_pb2

from tiergate.router.endpoints.state import EndpointState
from tiergate.router.epp import protocol
from tiergate.router.epp.pick import GatewayOpener, ReplyHead, address_of, in_subset
from tiergate.router.upstream.proxy import ReplyTooLarge, UpstreamUnavailable, WholeReplyTimeout


def endpoint(url: str) -> EndpointState:
    return EndpointState(url=url, pool="b", tier="batched", model="m", served_names=("m",))


def with_metadata(namespace: str, fields: dict[str, object]) -> ext.ProcessingRequest:
    request = ext.ProcessingRequest(request_headers=ext.HttpHeaders())
    struct = struct_pb2.Struct()
    struct.update(fields)
    request.metadata_context.filter_metadata[namespace].CopyFrom(struct)
    return request


def test_the_pick_is_in_the_header_and_the_metadata_alike() -> None:
    response = protocol.pick_in_headers(
        "10.0.0.1:8000", {"x-tiergate-request-id": "r1"}, ["authorization"]
    )
    common = response.request_headers.response
    headers = {h.header.key: h.header.raw_value for h in common.header_mutation.set_headers}
    assert headers["x-gateway-destination-endpoint"] == b"10.0.0.1:8000"
    lb = response.dynamic_metadata.fields["envoy.lb"].struct_value
    assert lb.fields["x-gateway-destination-endpoint"].string_value == "10.0.0.1:8000"
    assert common.clear_route_cache
    assert list(common.header_mutation.remove_headers) == ["authorization"]  # key stays here


def test_bodies_go_back_in_chunks_the_gateway_takes_ending_on_the_last() -> None:
    data = bytes(range(256)) * 700  # 179,200 bytes
    parts = protocol.streamed_body("response_body", data, True)
    streamed = [p.response_body.response.body_mutation.streamed_response for p in parts]
    assert b"".join(s.body for s in streamed) == data
    assert all(len(s.body) <= protocol.BODY_CHUNK_BYTES for s in streamed)
    assert [s.end_of_stream for s in streamed] == [False, False, True]
    (empty,) = protocol.streamed_body("request_body", b"", True)
    assert empty.request_body.response.body_mutation.streamed_response.end_of_stream


@pytest.mark.parametrize("value", [["10.0.0.1:8000", "10.0.0.2"], "10.0.0.1:8000, 10.0.0.2"])
def test_the_subset_hint_is_a_list_or_a_comma_separated_string(value: object) -> None:
    request = with_metadata(
        "envoy.lb.subset_hint", {"x-gateway-destination-endpoint-subset": value}
    )
    subset = protocol.subset_of(request)
    assert subset == {"10.0.0.1:8000", "10.0.0.2"}
    assert in_subset("10.0.0.1:8000", subset) and in_subset("10.0.0.2:9", subset)
    assert not in_subset("10.0.0.1:8001", subset)
    assert protocol.subset_of(ext.ProcessingRequest()) is None


def test_the_served_endpoint_comes_from_the_metadata_else_the_upstream_address() -> None:
    request = with_metadata("envoy.lb", {"x-gateway-destination-endpoint-served": "10.0.0.3:80"})
    assert protocol.served_of(request) == "10.0.0.3:80"
    request = ext.ProcessingRequest(response_headers=ext.HttpHeaders())
    request.attributes["envoy.filters.http.ext_proc"].update({"upstream.address": "10.0.0.4:80"})
    assert protocol.served_of(request) == "10.0.0.4:80"


def test_headers_are_read_from_raw_values() -> None:
    part = ext.HttpHeaders(
        headers=base_pb2.HeaderMap(
            headers=[
                base_pb2.HeaderValue(key=":path", raw_value=b"/v1/completions"),
                base_pb2.HeaderValue(key="X-Tiergate-Tier", value="premium"),
            ]
        )
    )
    assert protocol.headers_of(part) == {":path": "/v1/completions", "x-tiergate-tier": "premium"}


def test_only_plain_ip_endpoints_can_be_picked_for_a_gateway() -> None:
    assert address_of(endpoint("http://10.0.0.1:8000")) == "10.0.0.1:8000"
    assert address_of(endpoint("http://[fd00::1]:8000")) == "[fd00::1]:8000"
    assert address_of(endpoint("https://10.0.0.1:8000")) is None
    assert address_of(endpoint("http://node.example:8000")) is None
    assert address_of(endpoint("http://10.0.0.1:8000/prefix")) is None


class _Gateway:
    """The ext_proc stream's side of the pick, recorded."""

    subset: frozenset[str] | None = None

    def __init__(self, served: str) -> None:
        self.picks: list[str] = []
        self.served = served
        self.closed = False

    def send_pick(self, destination: str, headers: dict[str, str], body: bytes) -> None:
        self.picks.append(destination)

    async def reply_head(self) -> ReplyHead:
        return ReplyHead(200, {"content-type": "application/json"}, self.served)

    async def reply_chunk(self) -> tuple[bytes, bool]:
        return b"{}", True

    def close_reply(self) -> None:
        self.closed = True


def test_fallbacks_follow_the_pick_in_order_and_the_served_one_is_the_reply() -> None:
    a, b, c = (endpoint(f"http://10.0.0.{i}:80") for i in (1, 2, 3))
    failed: list[EndpointState] = []
    gateway = _Gateway(served="10.0.0.2:80")
    opener = GatewayOpener(gateway, fallbacks=1, on_failure=failed.append)
    reply = asyncio.run(opener.open([a, b, c], "/v1/completions", b"{}", {}))
    assert gateway.picks == ["10.0.0.1:80,10.0.0.2:80"]
    assert reply.endpoint is b and reply.attempts == 2 and failed == [a]
    assert (a.inflight, b.inflight) == (0, 1)
    asyncio.run(reply.close())
    assert b.inflight == 0
    assert gateway.closed  # what is left of its body is dropped as it comes


class _Status(_Gateway):
    """The gateway's own answer in the endpoint's stead."""

    def __init__(self, served: str, status: int) -> None:
        super().__init__(served)
        self.status = status

    async def reply_head(self) -> ReplyHead:
        return ReplyHead(self.status, {"content-type": "text/plain"}, self.served)


@pytest.mark.parametrize(
    ("status", "whole", "error", "counted"),
    [
        # The route's timeout on a whole reply: a long generation on a busy endpoint.
        (504, True, WholeReplyTimeout, False),
        # A stream's headers come at once: one that sent none in the route's time hung.
        (504, False, UpstreamUnavailable, True),
        (503, True, UpstreamUnavailable, True),
        (502, False, UpstreamUnavailable, True),
    ],
)
def test_the_gateway_s_own_failure_statuses_say_whose_fault_it_was(
    status: int, whole: bool, error: type[Exception], counted: bool
) -> None:
    a = endpoint("http://10.0.0.1:80")
    failed: list[EndpointState] = []
    opener = GatewayOpener(_Status("10.0.0.1:80", status), on_failure=failed.append)
    with pytest.raises(error) as raised:
        asyncio.run(opener.open([a], "/v1/completions", b"{}", {}, whole=whole))
    assert failed == ([a] if counted else [])
    assert a.inflight == 0
    if status == 504 and whole:
        assert raised.value.status == 504 and "in the gateway's time" in str(raised.value)


class _LongReply(_Gateway):
    """A reply of ten 60-byte chunks."""

    chunks_left = 10

    async def reply_chunk(self) -> tuple[bytes, bool]:
        self.chunks_left -= 1
        return b"x" * 60, self.chunks_left == 0


def test_a_whole_reply_past_its_limit_is_refused_as_it_arrives() -> None:
    gateway = _LongReply(served="10.0.0.1:80")
    opener = GatewayOpener(gateway, max_reply_bytes=100)

    async def read() -> bytes:
        reply = await opener.open([endpoint("http://10.0.0.1:80")], "/v1/completions", b"", {})
        return await reply.read()

    with pytest.raises(ReplyTooLarge) as refused:
        asyncio.run(read())
    assert refused.value.limit == 100
    assert gateway.chunks_left == 8  # the rest is not read


def test_a_header_value_given_as_text_is_taken_as_its_utf8_bytes() -> None:
    part = ext.HttpHeaders(
        headers=base_pb2.HeaderMap(headers=[base_pb2.HeaderValue(key="x-name", value="J\u20acrg")])
    )
    assert protocol.headers_of(part)["x-name"].encode("latin-1") == "J\u20acrg".encode()
