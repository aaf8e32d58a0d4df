"""One ext_proc stream driven message by message, with a stand-in for the request path: how a
body ends (trailers, buffered mode), the buffered pick's deadline, and a reply read no more."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
from typing import Any

import pytest
from envoy.config.core.v3 import base_pb2
from envoy.extensions.filters.http.ext_proc.v3 import processing_mode_pb2
from envoy.service.ext_proc.v3 import external_processor_pb2 as ext

from tiergate.router.base.asgi import ClientGone, Receive, Send, read_body
from tiergate.router.endpoints.state import EndpointState
from tiergate.router.epp.stream import End, GatewayStream, ProtocolViolation
from tiergate.router.upstream.proxy import ReplyTooLarge
from tiergate.router.upstream.reply import Opener

#: Long enough for any wait here on a loaded machine; only a wait that never ends reaches it.
HANG_S = 20.0
ENDPOINT_ADDRESS = "10.0.0.1:8000"


def headers(
    buffered: bool = False,
    end: bool = False,
    method: str = "POST",
    path: str = "/v1/chat/completions",
) -> ext.ProcessingRequest:
    values = {":method": method, ":path": path, "accept-encoding": "gzip"}
    request = ext.ProcessingRequest(
        request_headers=ext.HttpHeaders(
            headers=base_pb2.HeaderMap(
                headers=[
                    base_pb2.HeaderValue(key=k, raw_value=v.encode()) for k, v in values.items()
                ]
            ),
            end_of_stream=end,
        )
    )
    if buffered:
        modes = processing_mode_pb2.ProcessingMode
        request.protocol_config.request_body_mode = modes.BUFFERED
        request.protocol_config.response_body_mode = modes.FULL_DUPLEX_STREAMED
    return request


def body(data: bytes, end: bool) -> ext.ProcessingRequest:
    return ext.ProcessingRequest(request_body=ext.HttpBody(body=data, end_of_stream=end))


def trailers() -> ext.ProcessingRequest:
    trailer = base_pb2.HeaderValue(key="x-checksum", raw_value=b"1")
    return ext.ProcessingRequest(
        request_trailers=ext.HttpTrailers(trailers=base_pb2.HeaderMap(headers=[trailer]))
    )


def reply_headers() -> ext.ProcessingRequest:
    values = {":status": "200", "content-type": "application/json"}
    return ext.ProcessingRequest(
        response_headers=ext.HttpHeaders(
            headers=base_pb2.HeaderMap(
                headers=[
                    base_pb2.HeaderValue(key=k, raw_value=v.encode()) for k, v in values.items()
                ]
            )
        )
    )


def reply_body(data: bytes, end: bool) -> ext.ProcessingRequest:
    return ext.ProcessingRequest(response_body=ext.HttpBody(body=data, end_of_stream=end))


class RequestPath:
    """Stands in for `Router.completion`: reads the whole body, then does `then` with it."""

    def __init__(self, then: Callable[[RequestPath, bytes, Receive, Send, Opener], Any]) -> None:
        self.then = then
        self.bodies: list[bytes] = []
        self.body_read = asyncio.Event()
        self.done = asyncio.Event()
        self.seen: list[object] = []
        self.request_ids: list[str | None] = []

    async def completion(
        self, scope: Any, receive: Receive, send: Send, *, chat: bool, upstream: Opener,
        request_id: str | None = None,
    ) -> None:  # fmt: skip
        self.request_ids.append(request_id)
        try:
            self.bodies.append(await read_body(receive, {}, 1 << 20))
            self.body_read.set()
            await self.then(self, self.bodies[-1], receive, send, upstream)
        except ClientGone:
            self.seen.append("gone")
        finally:
            self.done.set()


async def refuse(path: RequestPath, data: bytes, receive: Receive, send: Send, _: Opener) -> None:
    """Answers at once, without a pick."""
    await send({"type": "http.response.start", "status": 400, "headers": []})
    await send({"type": "http.response.body", "body": b"{}"})


async def wait_for_the_stream_to_end(
    path: RequestPath, data: bytes, receive: Receive, send: Send, _: Opener
) -> None:
    """Waits (as for a slot in a tier's queue) until the stream ends."""
    while (await receive())["type"] != "http.disconnect":
        pass
    path.seen.append("disconnect")


async def pick_and_read_the_reply(
    path: RequestPath, data: bytes, receive: Receive, send: Send, upstream: Opener
) -> None:
    """Picks the one endpoint, reads its whole reply, and relays it (or a 502 for a reply too
    large, as the relay does)."""
    endpoint = EndpointState(
        url=f"http://{ENDPOINT_ADDRESS}", pool="b", tier="batched", model="m", served_names=("m",)
    )
    reply = await upstream.open([endpoint], "/v1/chat/completions", data, {})
    try:
        answer, status = await reply.read(), 200
    except ReplyTooLarge as exc:
        path.seen.append(exc)
        answer, status = b'{"error": "too large"}', 502
    finally:
        await reply.close()
    await send({"type": "http.response.start", "status": status, "headers": []})
    await send({"type": "http.response.body", "body": answer})


class Timer:
    """A timer the test fires itself."""

    def __init__(self, delay_s: float, callback: Callable[[], None]) -> None:
        self.delay_s, self.callback = delay_s, callback
        self.cancelled = False

    def cancel(self) -> None:
        self.cancelled = True


class Timers:
    """`call_later` for a test that drives time itself."""

    def __init__(self) -> None:
        self.scheduled: list[Timer] = []

    def call_later(self, delay_s: float, callback: Callable[[], None]) -> Timer:
        self.scheduled.append(Timer(delay_s, callback))
        return self.scheduled[-1]


def stream_for(path: RequestPath, **settings: Any) -> GatewayStream:
    settings.setdefault("fallbacks", 0)
    settings.setdefault("on_failure", lambda e: None)
    settings.setdefault("internal_error", lambda: None)
    return GatewayStream(path, **settings)


async def answered(stream: GatewayStream, count: int) -> None:
    """Until `count` answers are out (the request path's next steps send them)."""

    async def poll() -> None:
        while stream.outbox.qsize() < count:
            await asyncio.sleep(0)

    await asyncio.wait_for(poll(), HANG_S)


def drain(stream: GatewayStream) -> list[Any]:
    answers = []
    while not stream.outbox.empty():
        answers.append(stream.outbox.get_nowait())
    return answers


def kinds(answers: list[Any]) -> list[str]:
    return ["end" if isinstance(a, End) else str(a.WhichOneof("response")) for a in answers]


PAYLOAD = json.dumps({"model": "m", "messages": []}).encode()


async def test_request_trailers_end_a_streamed_body() -> None:
    path = RequestPath(refuse)
    stream = stream_for(path)
    for message in (headers(), body(PAYLOAD[:5], False), body(PAYLOAD[5:], False), trailers()):
        stream.feed(message)
    await asyncio.wait_for(path.done.wait(), HANG_S)
    assert path.bodies == [PAYLOAD]
    assert kinds(drain(stream)) == ["immediate_response", "end"]


async def test_a_buffered_body_is_whole_though_trailers_follow_it() -> None:
    """Envoy sends a buffered body unended when trailers follow: the trailers' answer goes
    out after the pick, which answers the body."""
    path = RequestPath(pick_and_read_the_reply)
    stream = stream_for(path)
    stream.feed(headers(buffered=True))
    stream.feed(body(PAYLOAD, False))
    await asyncio.wait_for(path.body_read.wait(), HANG_S)
    stream.feed(trailers())
    await answered(stream, 3)
    assert path.bodies == [PAYLOAD]
    # The headers' answer at once, the pick in the body's, the trailers' after it.
    assert kinds(drain(stream)) == ["request_headers", "request_body", "request_trailers"]
    stream.feed(reply_headers())
    stream.feed(reply_body(b"{}", True))
    await asyncio.wait_for(path.done.wait(), HANG_S)
    assert kinds(drain(stream)) == ["response_headers", "response_body"]


@pytest.mark.parametrize(
    ("method", "path", "end", "status"),
    [
        ("GET", "/v1/chat/completions", True, 405),
        ("POST", "/v1/embeddings", False, 404),
    ],
)
async def test_a_buffered_request_the_picker_answers_itself_is_never_acknowledged(
    method: str, path: str, end: bool, status: int
) -> None:
    """An acknowledged request goes on to the gateway's fallback, unpicked, while the answer
    is on its way: in buffered mode the headers are acknowledged only once the request is one
    the picker will pick for."""
    stream = stream_for(RequestPath(pick_and_read_the_reply))
    stream.feed(headers(buffered=True, end=end, method=method, path=path))
    await answered(stream, 1)
    (answer, *_) = drain(stream)
    assert kinds([answer]) == ["immediate_response"]
    assert answer.immediate_response.status.code == status


async def test_the_picker_asks_the_endpoint_for_an_uncompressed_reply() -> None:
    path = RequestPath(pick_and_read_the_reply)
    stream = stream_for(path)
    stream.feed(headers())
    stream.feed(body(PAYLOAD, True))
    await answered(stream, 1)
    pick = stream.outbox.get_nowait().request_headers.response.header_mutation
    sent = {h.header.key: h.header.raw_value for h in pick.set_headers}
    assert sent["accept-encoding"] == b"identity"  # not the client's gzip
    assert sent["x-gateway-destination-endpoint"] == ENDPOINT_ADDRESS.encode()
    stream.ended()
    await asyncio.wait_for(path.done.wait(), HANG_S)


async def test_a_buffered_body_not_picked_in_time_is_refused_by_the_picker() -> None:
    timers = Timers()
    path = RequestPath(wait_for_the_stream_to_end)
    stream = stream_for(path, pick_within_s=7.0, call_later=timers.call_later)
    stream.feed(headers(buffered=True))
    stream.feed(body(PAYLOAD, True))
    await asyncio.wait_for(path.body_read.wait(), HANG_S)
    (deadline,) = timers.scheduled
    assert deadline.delay_s == 7.0
    deadline.callback()
    answers = drain(stream)
    assert kinds(answers) == ["request_headers", "immediate_response", "end"]
    refusal = answers[1].immediate_response
    assert refusal.status.code == 429
    error = json.loads(refusal.body)["error"]
    assert (error["code"], error["type"]) == ("pick_timeout", "rate_limit_error")
    retry = {h.header.key.lower(): h.header.raw_value for h in refusal.headers.set_headers}
    assert retry["retry-after"] == b"1"
    # The request path's id, which its records use: the refusal names it.
    assert path.request_ids == [stream.request_id]
    assert retry["x-tiergate-request-id"] == stream.request_id.encode()
    stream.ended()  # as the servicer does once the stream is over
    await asyncio.wait_for(path.done.wait(), HANG_S)
    assert path.seen == ["disconnect"]  # the request stops waiting for its slot
    # The request path learns it was refused, not left by its client.
    refused = stream.opener.refusal
    assert refused is not None and refused.code == "pick_timeout"


async def test_a_pick_in_time_stops_the_deadline_and_a_streamed_body_has_none() -> None:
    timers = Timers()
    path = RequestPath(pick_and_read_the_reply)
    stream = stream_for(path, call_later=timers.call_later)
    stream.feed(headers(buffered=True))
    stream.feed(body(PAYLOAD, True))
    await answered(stream, 2)
    (deadline,) = timers.scheduled
    assert deadline.cancelled
    stream.ended()
    await asyncio.wait_for(path.done.wait(), HANG_S)

    path = RequestPath(refuse)
    duplex = stream_for(path, call_later=timers.call_later)
    duplex.feed(headers())
    duplex.feed(body(PAYLOAD, True))
    await asyncio.wait_for(path.done.wait(), HANG_S)
    assert len(timers.scheduled) == 1  # full-duplex: the gateway does not time the pick


async def test_a_reply_too_large_is_refused_and_the_rest_of_it_dropped() -> None:
    path = RequestPath(pick_and_read_the_reply)
    stream = stream_for(path, max_reply_bytes=100)
    stream.feed(headers())
    stream.feed(body(PAYLOAD, True))
    await answered(stream, 2)
    stream.feed(reply_headers())
    for _ in range(3):
        stream.feed(reply_body(b"x" * 60, False))
    await asyncio.wait_for(path.done.wait(), HANG_S)
    (too_large,) = path.seen
    assert isinstance(too_large, ReplyTooLarge) and too_large.limit == 100
    for _ in range(5):  # the rest still comes, and is not kept
        stream.feed(reply_body(b"x" * 1000, False))
    assert stream._chunks.empty()
    stream.feed(reply_body(b"x", True))
    with pytest.raises(ProtocolViolation):  # its end is still known
        stream.feed(reply_body(b"x", False))
    answers = drain(stream)
    head = next(a for a in answers if a.HasField("response_headers"))
    mutation = head.response_headers.response.header_mutation
    assert {h.header.key: h.header.raw_value for h in mutation.set_headers}[":status"] == b"502"
