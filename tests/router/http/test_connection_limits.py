"""Slow, idle and surplus client connections against a real router on a loopback socket: each
is closed (or refused) by the router's own limits, and counted."""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, ExitStack
from pathlib import Path
from typing import Any

import httpx
import pytest
from connection_helpers import connect, read_until_closed, send_growing_head, status_of, trickling
from polling_helpers import until
from tenant_router_helpers import KEY, tenant_router

from tiergate.cli import main
from tiergate.router.config import ConfigError, parse_config
from tiergate.router.http.app import RouterApp

#: Real processes and servers, or seconds of work: left out of `make test-fast`.
pytestmark = pytest.mark.slow

Served = Callable[[Any], AbstractContextManager[str]]

QUICK = "headerTimeoutS: 0.5, bodyTimeoutS: 0.5, idleTimeoutS: 0.5"
CHAT = b"POST /v1/chat/completions HTTP/1.1\r\nhost: router\r\n"


@pytest.fixture
def router(served: Served, tmp_path: Path) -> Iterator[tuple[RouterApp, str]]:
    """A router whose client connections time out after half a second."""
    with tenant_router(
        served, tmp_path / "ledger.sqlite", tmp_path, budget="", router=f"connections: {{{QUICK}}}"
    ) as (app, url):
        yield app, url


def envelope(reply: bytes) -> dict[str, Any]:
    head, _, body = reply.partition(b"\r\n\r\n")
    assert b"connection: close" in head.lower(), head
    error: dict[str, Any] = json.loads(body)["error"]
    return error


def metric(app: RouterApp, sample: str) -> float:
    for line in app.metrics.exposition().decode().splitlines():
        if line.startswith(sample + " "):
            return float(line.rpartition(" ")[2])
    raise AssertionError(f"no sample {sample}")


def test_headers_sent_one_byte_at_a_time_are_cut_off_with_a_408(
    router: tuple[RouterApp, str],
) -> None:
    app, url = router
    with connect(url) as sock:
        sock.sendall(CHAT + b"x-slow: ")
        with trickling(sock, b"a"):  # a header that never ends, each byte resetting nothing
            reply = read_until_closed(sock)
    assert status_of(reply) == 408
    assert envelope(reply) == {
        "message": "request header not received within 0.5 s",
        "type": "invalid_request_error",
        "code": "request_timeout",
    }
    assert metric(app, 'tiergate_connection_timeouts_total{phase="header"}') == 1


def test_a_body_shorter_than_its_content_length_is_cut_off_with_a_408(
    router: tuple[RouterApp, str],
) -> None:
    app, url = router
    auth = f"authorization: {KEY['authorization']}\r\n".encode()
    with connect(url) as sock:
        sock.sendall(CHAT + auth + b"content-length: 1000\r\n\r\n" + b'{"model": ')
        reply = read_until_closed(sock)
    assert status_of(reply) == 408
    assert envelope(reply)["message"] == "request body not received within 0.5 s"
    assert metric(app, 'tiergate_connection_timeouts_total{phase="body"}') == 1


def test_a_body_nobody_reads_still_has_to_arrive_in_time(router: tuple[RouterApp, str]) -> None:
    """/healthz answers without reading the body: the body's deadline still closes the
    connection that keeps (not) sending it."""
    _, url = router
    with connect(url) as sock:
        sock.sendall(b"GET /healthz HTTP/1.1\r\nhost: router\r\ncontent-length: 1000\r\n\r\nab")
        with trickling(sock, b"c"):
            reply = read_until_closed(sock)
    assert status_of(reply) == 200 and reply.count(b"HTTP/1.1") == 1  # no 408 after a reply


@pytest.mark.parametrize("before", ["nothing", "a request", "blank lines"])
def test_an_idle_connection_is_closed(router: tuple[RouterApp, str], before: str) -> None:
    """Idle: a new connection that sends nothing, a kept-alive one after its reply, and one
    sending blank lines (bytes that begin no request, and used to disarm uvicorn's timer)."""
    _, url = router
    with connect(url) as sock:
        if before == "a request":
            sock.sendall(b"GET /healthz HTTP/1.1\r\nhost: router\r\n\r\n")
            reply = read_until_closed(sock)
            assert status_of(reply) == 200 and b"connection: close" not in reply.lower()
        elif before == "blank lines":
            with trickling(sock, b"\r\n"):
                assert read_until_closed(sock) == b""
        else:
            assert read_until_closed(sock) == b""


@pytest.fixture
def keeping_router(served: Served, tmp_path: Path) -> Iterator[str]:
    """A router that keeps a connection alive a minute after a reply, and gives a request's
    head half a second."""
    settings = "connections: {headerTimeoutS: 0.5, idleTimeoutS: 60}"
    with tenant_router(
        served, tmp_path / "ledger.sqlite", tmp_path, budget="", router=settings
    ) as (_, url):
        yield url


@pytest.mark.parametrize("before", ["nothing", "blank lines"])
def test_a_new_connection_must_begin_its_request_within_the_head_s_time(
    keeping_router: str, before: str
) -> None:
    """A long keep-alive is for clients that sent a request: a connection that sends none is
    closed long before it (connection_helpers waits 15 s at most, the keep-alive is 60)."""
    with connect(keeping_router) as sock:
        if before == "blank lines":
            with trickling(sock, b"\r\n"):
                assert read_until_closed(sock) == b""
        else:
            assert read_until_closed(sock) == b""


def test_a_connection_kept_alive_after_a_reply_outlasts_the_head_s_time(
    keeping_router: str,
) -> None:
    with connect(keeping_router) as sock:
        sock.sendall(b"GET /healthz HTTP/1.1\r\nhost: router\r\n\r\n")
        head = sock.recv(65536)
        assert status_of(head) == 200
        sock.settimeout(2.0)  # four times the head's time: still open, as its client expects
        with pytest.raises(TimeoutError):
            sock.recv(1)
        sock.sendall(b"GET /healthz HTTP/1.1\r\nhost: router\r\nconnection: close\r\n\r\n")
        sock.settimeout(15.0)
        assert status_of(read_until_closed(sock)) == 200  # and it serves a second request


def test_a_head_that_keeps_growing_is_refused_with_a_431(router: tuple[RouterApp, str]) -> None:
    _, url = router
    with connect(url) as sock:
        reply = send_growing_head(sock, CHAT)
    assert status_of(reply) == 431
    assert envelope(reply)["code"] == "headers_too_large"


def test_past_the_cap_a_connection_is_refused_counted_and_logged_once(
    served: Served, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    settings = "connections: {maxConnections: 3, idleTimeoutS: 60, headerTimeoutS: 60}"
    with (
        tenant_router(served, tmp_path / "l.sqlite", tmp_path, budget="", router=settings) as (
            app,
            url,
        ),
        ExitStack() as held,
        caplog.at_level(logging.WARNING, logger="tiergate.router"),
    ):
        first = held.enter_context(connect(url))
        for _ in range(2):
            held.enter_context(connect(url))
        until(lambda: app.connections.open == 3, "the three connections were not admitted")
        for _ in range(4):
            with connect(url) as sock:
                reply = read_until_closed(sock)
            assert status_of(reply) == 503 and b"retry-after: 1" in reply
            assert envelope(reply)["code"] == "too_many_connections"
        assert metric(app, "tiergate_connections_refused_total") == 4
        assert metric(app, "tiergate_connections_open") == 3
        assert metric(app, "tiergate_connections_max") == 3
        lines = caplog.text.count("event=connection_limit_reached")
        assert 1 <= lines < 4  # at most one line every 10 s
        first.close()  # a connection leaves: a new one is served again
        until(lambda: app.connections.open == 2, "the closed connection was not counted out")
        assert httpx.get(url + "/healthz").status_code == 200


def test_a_cap_above_the_open_file_limit_stops_the_router_with_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    config = tmp_path / "router.yaml"
    config.write_text(
        f"router: {{ledgerPath: {tmp_path / 'l.sqlite'}, "
        "connections: {maxConnections: 1000000000}}\n"
        "pools: [{name: a, tier: batched, model: llama-3.1-8b, accelerator: h100-sxm}]\n"
    )
    assert main(["router", "--config", str(config), "--port", "0"]) == 2
    err = capsys.readouterr().err
    assert err.startswith(
        "tiergate router: error: router.connections.maxConnections is 1000000000, but the "
        "open-file limit ("
    )
    assert err.count("\n") == 1


@pytest.mark.parametrize(
    ("setting", "problem"),
    [
        ("headerTimeoutS: 0", "router.connections.headerTimeoutS"),
        ("idleTimeoutS: -1", "router.connections.idleTimeoutS"),
        ("maxConnections: 0", "router.connections.maxConnections"),
        ("bodyTimeout: 5", "router.connections.bodyTimeout"),
    ],
)
def test_bad_connection_settings_are_named(setting: str, problem: str) -> None:
    pools = "pools: [{name: a, tier: batched, model: llama-3.1-8b, accelerator: h100-sxm}]\n"
    with pytest.raises(ConfigError) as exc:
        parse_config(f"router: {{connections: {{{setting}}}}}\n{pools}")
    assert problem in str(exc.value)
