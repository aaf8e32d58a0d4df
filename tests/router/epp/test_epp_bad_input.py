"""The picker under bad input: a malformed ext_proc stream, a gateway that resets the stream,
a client that leaves mid-stream, Envoy restarted mid-burst. Clear refusals, every slot freed,
nothing billed twice, nothing served left unbilled. The batched node decodes slowly (one
A100), so a long stream is still running when its client leaves."""

from __future__ import annotations

import asyncio
import json
import threading
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import AbstractContextManager
from typing import Any

import grpc
import httpx
import pytest
from envoy.config.core.v3 import base_pb2
from envoy.service.ext_proc.v3 import external_processor_pb2 as ext
from envoy.service.ext_proc.v3 import external_processor_pb2_grpc as ext_grpc
from epp_system import DAVE, System, chat, epp_system, node, slots_free
from picker_channel import aio_channel
from polling_helpers import until

#: Real processes and servers: left out of `make test-fast`.
pytestmark = pytest.mark.slow

#: Tens of seconds of decoding on the batched node: only a client that leaves ends it early.
LONG = 5000


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


def reply_body(data: bytes) -> ext.ProcessingRequest:
    return ext.ProcessingRequest(response_body=ext.HttpBody(body=data, end_of_stream=True))


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
    until(lambda: len(system.rows([request_id])) == 1, "the reset request was not recorded")
    (row,) = system.rows([request_id])
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
