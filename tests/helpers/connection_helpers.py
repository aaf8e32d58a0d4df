"""Raw client sockets for the connection-limit tests: a slow or idle client is what they test,
which no HTTP client library can be made to be (a uniquely named module: conftest names
clash)."""

from __future__ import annotations

import socket
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from urllib.parse import urlsplit

from tiergate.common.limited_protocol import MAX_HEAD_BYTES

#: The longest a test waits for the server to close a connection before it fails.
CLOSE_WITHIN_S = 15.0


def connect(url: str) -> socket.socket:
    """A TCP connection to the server at `url`, reads timing out after `CLOSE_WITHIN_S`."""
    parts = urlsplit(url)
    sock = socket.create_connection((parts.hostname, parts.port), timeout=CLOSE_WITHIN_S)
    return sock


def read_until_closed(sock: socket.socket) -> bytes:
    """Everything the server sends until it closes the connection; fails if it has not closed
    it within `CLOSE_WITHIN_S` of the last byte."""
    received = bytearray()
    while True:
        try:
            chunk = sock.recv(65536)
        except ConnectionResetError:
            return bytes(received)
        except TimeoutError:
            raise AssertionError(
                f"the server kept the connection open; it sent {bytes(received)[:200]!r}"
            ) from None
        if not chunk:
            return bytes(received)
        received += chunk


@contextmanager
def trickling(sock: socket.socket, byte: bytes, every_s: float = 0.05) -> Iterator[None]:
    """Send `byte` every `every_s` from a thread (a slow client) until the block ends or the
    connection fails."""
    stop = threading.Event()

    def trickle() -> None:
        while not stop.wait(every_s):
            try:
                sock.send(byte)
            except OSError:
                return

    thread = threading.Thread(target=trickle, daemon=True)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join(5)


def send_growing_head(sock: socket.socket, head: bytes) -> bytes:
    """Send `head` and then a header value that keeps growing, four times the longest head a
    server takes (`limited_protocol.MAX_HEAD_BYTES`); the reply the server closed with."""
    sock.sendall(head + b"x-big: ")
    try:
        for _ in range(4 * MAX_HEAD_BYTES // 4096):
            sock.sendall(b"a" * 4096)
    except OSError:
        pass  # closed by the server while the client was still sending: as it should be
    return read_until_closed(sock)


def status_of(reply: bytes) -> int:
    """The status code of the HTTP response at the start of `reply`."""
    assert reply.startswith(b"HTTP/1.1 "), reply[:200]
    return int(reply[9:12])
