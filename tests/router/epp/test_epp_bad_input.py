"""The picker under bad input: a malformed ext_proc stream, a gateway that resets the stream,
a client that leaves mid-stream, Envoy restarted mid-burst, a reply too large, a message the
picker fails on. Clear refusals, every slot freed, nothing billed twice, nothing served left
unbilled. The batched node decodes slowly (one A100), so a long stream is still running when
its client leaves."""

from __future__ import annotations

import asyncio
import json
import logging
import threading
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import AbstractContextManager
from pathlib import Path
from typing import Any

import grpc
import httpx
import pytest
from envoy.config.core.v3 import base_pb2
from envoy.service.ext_proc.v3 import external_processor_pb2 as ext
from envoy.service.ext_proc.v3 import external_processor_pb2_grpc as ext_grpc
from epp_system import DAVE, StandIn, System, chat, epp_system, node, picker_alone, slots_free
from picker_channel import aio_channel
from polling_helpers import until

from tiergate.router.epp.server import EppServer
from tiergate.router.epp.stream import GatewayStream

#: Real processes and servers: left out of `make test-fast`.
pytestmark = pytest.mark.slow

#: Tens of seconds of decoding on the batched node: only a client that leaves ends it early.
LONG = 5000
#: A stream's first event, with a token.
FIRST_TOKEN = (
    b'data: {"object": "chat.completion.chunk", '
    b'"choices": [{"index": 0, "delta": {"content": "hi"}}]}\n\n'
)


@pytest.fixture(scope="module")
def system(
    tmp_path_factory: pytest.TempPathFactory, served: Callable[[Any], AbstractContextManager[str]]
) -> Iterator[System]:
    nodes = {
        "coder-batched": [node(["coder"], accelerator="a100-40gb")],
        "coder-premium": [node(["coder"])],
        "spark": [node(["coder-spark"])],
    }
    with epp_system(served, tmp_path_factory.mktemp("epp-bad"), nodes=nodes) as running:
        yield running


def headers(path: str = "/v1/chat/completions", **extra: str) -> ext.ProcessingRequest:
    values = {":method": "POST", ":path": path, "content-type": "application/json",
              "authorization": DAVE["authorization"], **extra}  # fmt: skip
    return ext.ProcessingRequest(
        request_headers=ext.HttpHeaders(
            headers=base_pb2.HeaderMap(
                headers=[
                    base_pb2.HeaderValue(key=k, raw_value=v.encode()) for k, v in values.items()
                ]
            )
        )
    )


def body(data: bytes, end: bool = True) -> ext.ProcessingRequest:
    return ext.ProcessingRequest(request_body=ext.HttpBody(body=data, end_of_stream=end))


def reply_body(data: bytes, end: bool = True) -> ext.ProcessingRequest:
    return ext.ProcessingRequest(response_body=ext.HttpBody(body=data, end_of_stream=end))


def reply_headers(content_type: str = "application/json") -> ext.ProcessingRequest:
    values = {":status": "200", "content-type": content_type}
    return ext.ProcessingRequest(
        response_headers=ext.HttpHeaders(
            headers=base_pb2.HeaderMap(
                headers=[
                    base_pb2.HeaderValue(key=k, raw_value=v.encode()) for k, v in values.items()
                ]
            )
        )
    )


async def exchange(port: int, messages: list[ext.ProcessingRequest]) -> list[Any]:
    """Send `messages` on one Process stream and read every answer until it ends."""
    async with aio_channel("127.0.0.1", port) as channel:
        stub = ext_grpc.ExternalProcessorStub(channel)

        async def requests() -> AsyncIterator[ext.ProcessingRequest]:
            for message in messages:
                yield message

        return [answer async for answer in stub.Process(requests())]


@pytest.mark.parametrize(
    "messages",
    [
        [reply_body(b"{}")],
        [body(b"{}")],
        [headers(), headers()],
        [ext.ProcessingRequest()],
        [headers(), body(json.dumps(chat(max_tokens=2)).encode()), reply_body(b"{}")],
    ],
    ids=["reply-first", "body-first", "headers-twice", "empty", "reply-before-its-headers"],
)
def test_a_malformed_ext_proc_stream_is_refused_and_holds_nothing(
    system: System, messages: list[ext.ProcessingRequest]
) -> None:
    with pytest.raises(grpc.aio.AioRpcError) as refused:
        asyncio.run(exchange(system.epp.port, messages))
    assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert refused.value.details()  # says what was out of order
    until(lambda: slots_free(system), "a malformed stream left a slot held")


def test_a_body_that_is_not_json_is_refused_at_the_picker(system: System) -> None:
    answers = asyncio.run(exchange(system.epp.port, [headers(), body(b"\x00 nope")]))
    (answer,) = answers
    refusal = answer.immediate_response
    assert refusal.status.code == 400
    assert json.loads(refusal.body)["error"]["code"] == "invalid_request"


def test_a_gateway_that_resets_the_stream_after_the_pick_frees_the_slot(system: System) -> None:
    async def pick_then_reset() -> str:
        async with aio_channel("127.0.0.1", system.epp.port) as channel:
            stub = ext_grpc.ExternalProcessorStub(channel)
            sent = asyncio.Event()

            async def requests() -> AsyncIterator[ext.ProcessingRequest]:
                yield headers()
                yield body(json.dumps(chat(max_tokens=LONG, stream=True)).encode())
                await sent.wait()  # the stream stays open until the client resets it

            call = stub.Process(requests())
            async for answer in call:
                if answer.HasField("request_headers"):
                    mutation = answer.request_headers.response.header_mutation
                    found = {h.header.key: h.header.raw_value for h in mutation.set_headers}
                    assert "x-gateway-destination-endpoint" in found
                    call.cancel()
                    return found["x-tiergate-request-id"].decode()
            raise AssertionError("no pick came")

    request_id = asyncio.run(pick_then_reset())
    until(lambda: slots_free(system), "the reset stream's slot was not released")
    row = system.final_row(request_id)
    assert (row["outcome"], row["http_status"]) == ("client_disconnect", 499)


def test_a_client_that_leaves_mid_stream_is_billed_once_for_what_it_got(
    system: System,
) -> None:
    envoy = system.envoy()
    with httpx.stream(
        "POST", envoy.url + "/v1/chat/completions", json=chat(max_tokens=LONG, stream=True),
        headers=DAVE, timeout=60,
    ) as r:  # fmt: skip
        assert r.status_code == 200
        request_id = r.headers["x-tiergate-request-id"]
        lines = r.iter_lines()
        got = sum(1 for _, line in zip(range(80), lines, strict=False) if line.startswith("data:"))
    assert got >= 30
    until(lambda: slots_free(system), "the stream's slot was not released")
    until(
        lambda: [r["outcome"] for r in system.rows([request_id])] == ["client_disconnect"],
        "the stream whose client left was not recorded once",
    )
    (row,) = system.rows([request_id])
    assert got <= row["completion_tokens"] < LONG  # what was relayed, not what was asked
    assert row["cost_usd"] > 0


def test_envoy_restarted_mid_burst_bills_nothing_twice(system: System) -> None:
    first = system.envoy()
    results: list[tuple[int, str | None, dict[str, Any] | None]] = []
    lock = threading.Lock()

    def client(url: str, stream: bool) -> None:
        try:
            options = {"include_usage": True} if stream else None
            body = chat(max_tokens=60, stream=stream, stream_options=options)
            r = httpx.post(url + "/v1/chat/completions", headers=DAVE, timeout=120, json=body)
            usage = None
            if r.status_code == 200 and not stream:
                usage = r.json()["usage"]
            with lock:
                results.append((r.status_code, r.headers.get("x-tiergate-request-id"), usage))
        except httpx.HTTPError:
            with lock:
                results.append((0, None, None))

    def burst(url: str) -> list[threading.Thread]:
        threads = [threading.Thread(target=client, args=(url, i % 2 == 0)) for i in range(8)]
        for t in threads:
            t.start()
        return threads

    before = system.app.router.budgets
    threads = burst(first.url)
    queues = system.app.router.admission.queues
    until(lambda: "batched" in queues and queues["batched"].active > 0, "nothing in flight")
    first.process.kill()  # mid-burst: its streams to the picker are reset
    first.process.wait(30)
    second = system.envoy()
    threads += burst(second.url)
    for t in threads:
        t.join(120)
    until(lambda: slots_free(system), "a slot was left held after the restart")
    served = [(rid, usage) for status, rid, usage in results if status == 200 and rid]
    assert len(served) >= 8  # the second Envoy's burst, at least
    rows = [r for r in system.rows() if r["tenant"] == "dave"]
    ids = [r["request_id"] for r in rows]
    assert len(ids) == len(set(ids)), "a request has two rows"
    by_id = {r["request_id"]: r for r in rows}
    for rid, usage in served:  # every reply a client has whole is billed as it says
        assert by_id[rid]["outcome"] == "ok"
        if usage is not None:
            assert by_id[rid]["completion_tokens"] == usage["completion_tokens"]
    status = asyncio.run(before.current(system.app.router.tenants.tenants["dave"], None))
    assert status.spent_usd == pytest.approx(sum(r["cost_usd"] for r in rows), rel=1e-9)


def test_a_whole_reply_larger_than_max_reply_bytes_gets_502_at_the_picker(
    served: Callable[[Any], AbstractContextManager[str]], tmp_path: Path
) -> None:
    """As on the router's own port: the client gets 502 `bad_upstream_reply`, and the rest of
    the reply, which the gateway still sends, is dropped."""
    message = {"role": "assistant", "content": "x" * (1 << 20)}
    choice = {"index": 0, "finish_reason": "stop", "message": message}
    usage = {"prompt_tokens": 5, "completion_tokens": 2}
    reply = json.dumps({"object": "chat.completion", "choices": [choice], "usage": usage}).encode()

    async def too_large(port: int) -> list[Any]:
        async with aio_channel("127.0.0.1", port) as channel:
            outbox: asyncio.Queue[ext.ProcessingRequest | None] = asyncio.Queue()
            for message in (headers(), body(json.dumps(chat(max_tokens=2)).encode())):
                outbox.put_nowait(message)

            async def requests() -> AsyncIterator[ext.ProcessingRequest]:
                while (message := await outbox.get()) is not None:
                    yield message

            answers = []
            async for answer in ext_grpc.ExternalProcessorStub(channel).Process(requests()):
                answers.append(answer)
                if answer.HasField("request_body"):  # the pick is out: the endpoint replies
                    outbox.put_nowait(reply_headers())
                    for at in range(0, len(reply), 60_000):
                        end = at + 60_000 >= len(reply)
                        outbox.put_nowait(reply_body(reply[at : at + 60_000], end))
                    outbox.put_nowait(None)
            return answers

    with epp_system(served, tmp_path, router="maxReplyBytes: 65536") as system:
        answers = asyncio.run(too_large(system.epp.port))
        until(lambda: slots_free(system), "the refused reply's slot was not released")
        (row,) = system.rows()
    (head,) = [a.response_headers.response for a in answers if a.HasField("response_headers")]
    status = {h.header.key: h.header.raw_value for h in head.header_mutation.set_headers}
    assert status[":status"] == b"502"
    sent = b"".join(a.response_body.response.body_mutation.streamed_response.body
                    for a in answers if a.HasField("response_body"))  # fmt: skip
    assert json.loads(sent)["error"]["code"] == "bad_upstream_reply"
    assert (row["outcome"], row["http_status"]) == ("upstream_error", 502)


class _FailingStream(GatewayStream):
    """A stream with a bug: it fails on a reply's headers, with a key in its message."""

    def feed(self, request: ext.ProcessingRequest) -> None:
        if request.HasField("response_headers"):
            raise RuntimeError(DAVE["authorization"])
        super().feed(request)


class _FailingPicker(EppServer):
    def stream(self) -> GatewayStream:
        return _FailingStream(self.router, fallbacks=0, on_failure=lambda e: None,
                              internal_error=self._internal_error)  # fmt: skip


class _Waits(StandIn):
    """A request path that waits until its stream is gone."""

    def __init__(self) -> None:
        self.started, self.gone = asyncio.Event(), asyncio.Event()

    async def completion(self, scope: Any, receive: Any, send: Any, **_: Any) -> None:
        self.started.set()
        while (await receive())["type"] != "http.disconnect":
            pass
        self.gone.set()


async def test_a_message_the_picker_fails_on_is_logged_counted_and_ends_the_stream(
    caplog: pytest.LogCaptureFixture,
) -> None:
    errors: list[None] = []
    caplog.set_level(logging.INFO, logger="tiergate.router")
    waits = _Waits()
    async with picker_alone(_FailingPicker, router=waits,
                            internal_error=lambda: errors.append(None)) as picker:  # fmt: skip
        async with aio_channel("127.0.0.1", picker.port, tls=False) as channel:
            stub = ext_grpc.ExternalProcessorStub(channel)

            async def failing() -> AsyncIterator[ext.ProcessingRequest]:
                yield reply_headers()

            with pytest.raises(grpc.aio.AioRpcError) as failed:
                _ = [answer async for answer in stub.Process(failing())]
            assert failed.value.code() == grpc.StatusCode.INTERNAL
            assert errors == [None]
            (line,) = [r.getMessage() for r in caplog.records if "internal_error" in r.message]
            assert "phase=response_headers error=RuntimeError" in line
            assert DAVE["authorization"] not in caplog.text

            caplog.clear()
            ended = asyncio.Event()

            async def reset() -> AsyncIterator[ext.ProcessingRequest]:
                yield headers()
                await ended.wait()

            call = stub.Process(reset())
            await asyncio.wait_for(waits.started.wait(), 20)
            call.cancel()  # a stream the gateway resets: quiet, and no internal error
            ended.set()
            await asyncio.wait_for(waits.gone.wait(), 20)
    assert errors == [None]
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING]


def test_a_stream_that_ends_mid_reply_is_a_client_that_left_not_an_endpoint_failure(
    system: System,
) -> None:
    """Envoy ends the picker's stream the same way when the endpoint dies mid-reply and when
    the client leaves: both are recorded as a client that left, and neither counts against
    the endpoint (a client that stops a stream must not eject a healthy one)."""

    async def reply_cut_short() -> tuple[str, str]:
        async with aio_channel("127.0.0.1", system.epp.port) as channel:
            outbox: asyncio.Queue[ext.ProcessingRequest | None] = asyncio.Queue()
            for message in (headers(), body(json.dumps(chat(max_tokens=20, stream=True)).encode())):
                outbox.put_nowait(message)

            async def requests() -> AsyncIterator[ext.ProcessingRequest]:
                while (message := await outbox.get()) is not None:
                    yield message

            call = ext_grpc.ExternalProcessorStub(channel).Process(requests())
            async for answer in call:
                if answer.HasField("request_headers"):  # the pick: the endpoint starts
                    mutation = answer.request_headers.response.header_mutation
                    pick = {h.header.key: h.header.raw_value.decode() for h in mutation.set_headers}
                    outbox.put_nowait(reply_headers("text/event-stream"))
                    outbox.put_nowait(reply_body(FIRST_TOKEN, False))
                if answer.HasField("response_body"):  # relayed; then the stream ends, as
                    outbox.put_nowait(None)  # Envoy ends it: half-closed, then reset
                    call.cancel()
                    break
            return pick["x-gateway-destination-endpoint"], pick["x-tiergate-request-id"]

    endpoints = {e.url.removeprefix("http://"): e for e in system.app.router.view().endpoints()}
    before = {url: e.consecutive_failures for url, e in endpoints.items()}
    picked, request_id = asyncio.run(reply_cut_short())
    until(lambda: slots_free(system), "the cut-short reply's slot was not released")
    row = system.final_row(request_id)
    assert (row["outcome"], row["http_status"]) == ("client_disconnect", 499)
    assert endpoints[picked].consecutive_failures == before[picked]
