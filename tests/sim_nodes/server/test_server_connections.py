"""A kept-alive connection survives every error: the next request on it is served.

A router keeps connections to a node open and sends any tenant's next request down them, so
a node that closes one after an error reply fails a request that did nothing wrong. These
tests talk to a node served by uvicorn on a real socket, over one `http.client` connection
(which reconnects only if the server said `Connection: close`). Failures the node has no
bug for are injected by replacing one of its parts for one request.
"""

from __future__ import annotations

import http.client
import json
from collections.abc import AsyncIterator, Iterator
from contextlib import closing
from typing import Any

import pytest
from sim_server_helpers import chat, nested, node_config, serve
from starlette.applications import Starlette

from tiergate.sim_nodes.server import app as app_module
from tiergate.sim_nodes.server import create_app
from tiergate.sim_nodes.server.internal_errors import InternalErrors

POISON = "please fail"  # the message content that makes an injected failure fire


class Connection:
    """One HTTP/1.1 connection to the node; fails a test if it had to be reopened."""

    def __init__(self, app: Starlette, host: str, port: int) -> None:
        self.app = app
        self.http = http.client.HTTPConnection(host, port, timeout=30)

    def post(self, body: dict[str, Any]) -> tuple[int, dict[str, str], bytes]:
        sock = self.http.sock
        self.http.request(
            "POST",
            "/v1/chat/completions",
            body=json.dumps(body),
            headers={"content-type": "application/json"},
        )
        if sock is not None:
            assert self.http.sock is sock, "the connection was reopened"
        response = self.http.getresponse()
        headers = {k.lower(): v for k, v in response.getheaders()}
        assert headers.get("connection") != "close"
        return response.status, headers, response.read()


@pytest.fixture
def connection() -> Iterator[Connection]:
    app = create_app(node_config())
    with serve(app) as (host, port):
        conn = Connection(app, host, port)
        try:
            yield conn
        finally:
            conn.http.close()


def events(raw: bytes) -> list[Any]:
    data = [line[6:] for line in raw.decode().splitlines() if line.startswith("data: ")]
    return [d if d == "[DONE]" else json.loads(d) for d in data]


def served_after(connection: Connection) -> None:
    status, _, body = connection.post(chat(max_tokens=2))
    assert status == 200, body
    assert json.loads(body)["usage"]["completion_tokens"] == 2


def test_a_too_deep_tool_schema_is_a_400_and_the_connection_serves_on(
    connection: Connection,
) -> None:
    served_after(connection)  # the connection is open and kept alive
    status, _, body = connection.post(
        chat(tools=[{"type": "function", "function": {"name": "f", "parameters": nested(300)}}])
    )
    assert status == 400
    assert json.loads(body)["error"]["param"] == "tools.0.function.parameters"
    served_after(connection)


def test_an_unexpected_error_before_the_reply_is_a_500_envelope_on_a_kept_connection(
    connection: Connection, monkeypatch: pytest.MonkeyPatch
) -> None:
    real = app_module.plan_chat

    def plan_chat(request: Any, ctx: Any) -> Any:
        if request.messages[0].content == POISON:
            raise RuntimeError("a bug")
        return real(request, ctx)

    monkeypatch.setattr(app_module, "plan_chat", plan_chat)
    served_after(connection)
    status, headers, body = connection.post(chat(POISON))
    assert status == 500 and headers["content-type"] == "application/json"
    assert json.loads(body)["error"] == {
        "message": "Internal error.",
        "type": "server_error",
        "code": "internal_error",
        "param": None,
    }
    served_after(connection)


def test_an_unexpected_error_mid_stream_ends_it_with_an_error_event(
    connection: Connection, monkeypatch: pytest.MonkeyPatch
) -> None:
    real = app_module.stream_events

    async def stream_events(plan: Any, *args: Any, **kwargs: Any) -> AsyncIterator[bytes]:
        sent = 0
        async for event in real(plan, *args, **kwargs):
            yield event
            sent += 1
            if sent == 2:
                raise RuntimeError("a bug")

    monkeypatch.setattr(app_module, "stream_events", stream_events)
    served_after(connection)
    status, _, body = connection.post(chat(stream=True, max_tokens=20))
    assert status == 200
    got = events(body)
    assert len(got) == 3 and "[DONE]" not in got
    assert got[-1]["error"]["code"] == "internal_error"
    served_after(connection)


def test_an_unexpected_error_after_the_reply_is_logged_and_the_connection_kept(
    connection: Connection, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    served_after(connection)
    status, _, body = connection.post(chat(stream=True, max_tokens=2))
    assert status == 200 and events(body)[-1] == "[DONE]"

    def observe_request(**fields: Any) -> None:
        raise RuntimeError("a bug in the metrics")

    # Counting a stream's request runs once its last byte is out.
    monkeypatch.setattr(connection.app.state.node.metrics, "observe_request", observe_request)
    status, _, body = connection.post(chat(stream=True, max_tokens=2))
    assert status == 200 and events(body)[-1] == "[DONE]"
    monkeypatch.undo()
    served_after(connection)
    assert "event=internal_error" in caplog.text and "when=after_response" in caplog.text


def test_a_reply_half_sent_when_the_error_comes_is_cut_short_not_passed_off_as_whole() -> None:
    """The one case the connection cannot be kept: the client must see the reply fail."""

    async def half_then_bug(scope: dict[str, Any], receive: Any, send: Any) -> None:
        # The request read whole first, as the node's handlers do: a connection closed with
        # request bytes still arriving is reset, and the reset may overtake the reply's bytes.
        while (await receive()).get("more_body"):
            pass
        headers = [(b"content-type", b"application/json"), (b"content-length", b"100")]
        await send({"type": "http.response.start", "status": 200, "headers": headers})
        await send({"type": "http.response.body", "body": b'{"id":', "more_body": True})
        raise RuntimeError("a bug")

    async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] == "lifespan":
            while (await receive())["type"] != "lifespan.shutdown":
                await send({"type": "lifespan.startup.complete"})
            await send({"type": "lifespan.shutdown.complete"})
            return
        await InternalErrors(half_then_bug)(scope, receive, send)

    with serve(app) as (host, port):
        with closing(http.client.HTTPConnection(host, port, timeout=30)) as conn:
            conn.request("POST", "/v1/chat/completions", body=b"{}")
            response = conn.getresponse()
            with pytest.raises(http.client.IncompleteRead):
                response.read()
