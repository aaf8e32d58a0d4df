"""Clients that hold connections instead of sending requests, against a real router process
with one-second connection timeouts: heads and bodies sent a byte at a time (slowloris), a
Content-Length larger than what is sent, connections that send nothing, heads that never end,
bytes that are not HTTP. Each is cut off by the router's own limits, with the OpenAI error
envelope where there is a reply, and a stream accepted before it ends whole.

The connection cap, with the process's open-file limit, is
tests/router/http/test_connection_fd_limit.py (a real router process filled to its cap); the
sim node's own limits are
tests/sim_nodes/server/test_server_connection_limits.py (a real sim-node process).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import ExitStack

import httpx
import pytest
from adversarial_helpers import (
    Pool,
    System,
    as_response,
    assert_refused,
    assert_serves,
    in_flight_stream,
    metric,
    running_system,
)
from connection_helpers import connect, read_until_closed, send_growing_head, trickling
from polling_helpers import until

#: Real processes and servers, or seconds of work: left out of `make test-fast`.
pytestmark = pytest.mark.slow

QUICK = "connections: {headerTimeoutS: 1, bodyTimeoutS: 1, idleTimeoutS: 1}"
CHAT = b"POST /v1/chat/completions HTTP/1.1\r\nhost: router\r\ncontent-type: application/json\r\n"


@pytest.fixture(scope="module")
def system(tmp_path_factory: pytest.TempPathFactory) -> Iterator[System]:
    tmp = tmp_path_factory.mktemp("connections")
    with running_system(tmp, [Pool("b", "batched", "coder")], router=QUICK) as running:
        yield running


def timeouts(system: System, phase: str) -> float:
    return metric(system, f'tiergate_connection_timeouts_total{{phase="{phase}"}}')


def test_a_head_sent_a_byte_at_a_time_is_cut_off_with_a_408(system: System) -> None:
    before = timeouts(system, "header")
    with in_flight_stream(system, {}, "coder"), connect(system.url) as sock:
        sock.sendall(CHAT + b"x-slow: ")
        with trickling(sock, b"a"):  # a header that never ends, each byte resetting nothing
            reply = read_until_closed(sock)
    error = assert_refused(as_response(reply), 408, "request_timeout", system)
    assert error["message"] == "request header not received within 1 s"
    assert timeouts(system, "header") == before + 1
    assert_serves(system, {}, "coder")


@pytest.mark.parametrize("trickle", [False, True], ids=["stops", "trickles"])
def test_a_body_short_of_its_content_length_is_cut_off_with_a_408(
    system: System, trickle: bool
) -> None:
    before = timeouts(system, "body")
    with in_flight_stream(system, {}, "coder"), connect(system.url) as sock:
        sock.sendall(CHAT + b"content-length: 100000\r\n\r\n" + b'{"model": "coder", "x": "')
        with ExitStack() as slowly:
            if trickle:
                slowly.enter_context(trickling(sock, b"a"))
            reply = read_until_closed(sock)
    error = assert_refused(as_response(reply), 408, "request_timeout", system)
    assert error["message"] == "request body not received within 1 s"
    assert timeouts(system, "body") == before + 1
    assert_serves(system, {}, "coder")


def test_a_head_that_keeps_growing_is_refused_with_a_431(system: System) -> None:
    with in_flight_stream(system, {}, "coder"), connect(system.url) as sock:
        reply = send_growing_head(sock, CHAT)
    assert_refused(as_response(reply), 431, "headers_too_large", system)
    assert_serves(system, {}, "coder")


def test_hundreds_of_connections_that_send_nothing_are_all_closed(system: System) -> None:
    """The attack that exhausted the router's file descriptors: idle connections by the
    hundred, each closed without a reply once idle; then the router serves as before."""
    with in_flight_stream(system, {}, "coder"), ExitStack() as held:
        idle = [held.enter_context(connect(system.url)) for _ in range(300)]
        replies = [read_until_closed(sock) for sock in idle]
    assert replies == [b""] * 300
    until(lambda: metric(system, "tiergate_connections_open") == 0,
          "the closed connections still count")  # fmt: skip
    assert_serves(system, {}, "coder")


def test_a_kept_alive_connection_left_idle_is_closed(system: System) -> None:
    with connect(system.url) as sock:
        sock.sendall(b"GET /healthz HTTP/1.1\r\nhost: router\r\n\r\n")
        reply = read_until_closed(sock)  # the reply, then nothing: closed once idle
    assert reply.startswith(b"HTTP/1.1 200 ") and reply.count(b"HTTP/1.1") == 1


#: Bytes the HTTP parser refuses before the router sees a request.
NOT_HTTP = [
    pytest.param(CHAT + b"x-tiergate-tier: premium\x7f\r\n\r\n", id="a control byte in a value"),
    pytest.param(CHAT + b"authorization: Bearer k\x00\r\n\r\n", id="a NUL in a value"),
    pytest.param(CHAT + b"x bad: 1\r\n\r\n", id="a blank in a header name"),
    pytest.param(CHAT + b"x-a: 1\r\n folded\r\n\r\n", id="a folded header line"),
    pytest.param(
        CHAT + b"transfer-encoding: chunked\r\ncontent-length: 5\r\n\r\n0\r\n\r\n",
        id="both a Transfer-Encoding and a Content-Length",
    ),  # fmt: skip
    pytest.param(CHAT + b"content-length: -1\r\n\r\n", id="a negative Content-Length"),
    pytest.param(b"POST /v1/chat/completions HTTP/9.9\r\nhost: r\r\n\r\n", id="HTTP/9.9"),
    pytest.param(b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03" + bytes(32), id="TLS"),
]


@pytest.mark.parametrize("request_bytes", NOT_HTTP)
def test_bytes_that_are_not_http_are_a_400_and_the_router_serves_on(
    system: System, request_bytes: bytes
) -> None:
    with in_flight_stream(system, {}, "coder"), connect(system.url) as sock:
        sock.sendall(request_bytes)
        reply = read_until_closed(sock)
    assert reply.startswith(b"HTTP/1.1 400 "), reply
    assert b"Traceback" not in reply
    assert_serves(system, {}, "coder")


@pytest.mark.parametrize("request_bytes", NOT_HTTP)
def test_bytes_that_are_not_http_are_refused_with_the_error_envelope(
    system: System, request_bytes: bytes
) -> None:
    with connect(system.url) as sock:
        sock.sendall(request_bytes)
        reply = read_until_closed(sock)
    assert_refused(as_response(reply), 400, "invalid_request", system)


def test_the_router_counts_every_connection_out(system: System) -> None:
    """After the attacks above, none of their connections is still counted open."""
    until(lambda: metric(system, "tiergate_connections_open") == 0,
          "connections still counted")  # fmt: skip
    assert httpx.get(system.url + "/readyz", timeout=10).status_code == 200
