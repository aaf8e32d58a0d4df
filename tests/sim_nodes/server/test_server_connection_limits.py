"""`tiergate sim-node` keeps the router's connection limits (the same uvicorn protocol): a slow
head or body gets a 408, an idle connection is closed, one past the cap gets a 503."""

from __future__ import annotations

import socket
import time
from collections.abc import Iterator
from urllib.parse import urlsplit

import pytest
from process_helpers import start_sim_node

from tiergate.cli import main

QUICK = ["--header-timeout-s", "0.5", "--body-timeout-s", "0.5", "--idle-timeout-s", "0.5"]


@pytest.fixture(scope="module")
def node(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, int]]:
    """A sim-node process with half-second timeouts and room for two connections."""
    log = tmp_path_factory.mktemp("node") / "node.log"
    flags = ["--model", "llama-3.1-8b", "--accelerator", "h100-sxm", "--max-connections", "2"]
    process = start_sim_node(log, *flags, *QUICK)
    try:
        parts = urlsplit(process.url)
        yield parts.hostname or "", parts.port or 0
    finally:
        process.stop()


def exchange(address: tuple[str, int], data: bytes) -> bytes:
    """Send `data`, then read until the node closes the connection (failing after 15 s)."""
    with socket.create_connection(address, timeout=15) as sock:
        sock.sendall(data)
        received = bytearray()
        while chunk := sock.recv(65536):
            received += chunk
        return bytes(received)


def test_a_slow_head_and_a_short_body_get_408s(node: tuple[str, int]) -> None:
    head = exchange(node, b"POST /v1/chat/completions HTTP/1.1\r\nhost: node\r\nx-slow: ")
    assert head.startswith(b"HTTP/1.1 408 ") and b'"request_timeout"' in head
    body = exchange(
        node, b"POST /v1/chat/completions HTTP/1.1\r\nhost: node\r\ncontent-length: 99\r\n\r\n{"
    )
    assert body.startswith(b"HTTP/1.1 408 ") and b"request body not received" in body


def test_an_idle_connection_is_closed_and_one_past_the_cap_refused(
    node: tuple[str, int],
) -> None:
    with socket.create_connection(node, timeout=15), socket.create_connection(node, timeout=15):
        refused = exchange(node, b"")  # both slots taken (until their idle timeout)
    assert refused.startswith(b"HTTP/1.1 503 ") and b'"too_many_connections"' in refused
    # Once the node has seen those two go: a slot again, closed once idle, without a reply.
    deadline = time.monotonic() + 15
    while (reply := exchange(node, b"")).startswith(b"HTTP/1.1 503 "):
        assert time.monotonic() < deadline, "the closed connections still count"
    assert reply == b""


def test_a_cap_above_the_open_file_limit_is_one_line_exit_2(
    capsys: pytest.CaptureFixture[str],
) -> None:
    argv = ["sim-node", "--model", "llama-3.1-8b", "--accelerator", "h100-sxm",
            "--max-connections", str(10**9)]  # fmt: skip
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith("tiergate sim-node: error: --max-connections is 1000000000, but ")
    assert err.count("\n") == 1
