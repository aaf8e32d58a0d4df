"""Small raw-ASGI helpers: read a capped body, send JSON, send an error envelope.

The router is a raw ASGI app rather than a framework one: it is on every request's path, and
a few dict lookups are all the routing it needs.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Iterable, MutableMapping
from typing import Any

from tiergate.router.base.errors import RouterError
from tiergate.router.base.jsonbytes import dumps

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]

JSON_TYPE = (b"content-type", b"application/json")


class ClientGone(Exception):
    """The client disconnected before its request body arrived."""


def header_map(scope: Scope) -> dict[str, str]:
    """Request headers, names lower-cased (ASGI already does), values decoded as latin-1. A
    header sent more than once is one value, the values joined by ", " (RFC 9110 5.3), never
    the last one alone: two `Authorization` headers are then no key at all, where a proxy in
    front might have read the first and the router billed the second."""
    headers: dict[str, str] = {}
    for k, v in scope["headers"]:
        name, value = k.decode("latin-1"), v.decode("latin-1")
        headers[name] = f"{headers[name]}, {value}" if name in headers else value
    return headers


async def read_body(receive: Receive, headers: dict[str, str], limit: int) -> bytes:
    """The whole request body, refusing more than `limit` bytes with a 413."""
    declared = headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > limit:
        raise _too_large(limit)
    chunks: list[bytes] = []
    size = 0
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            raise ClientGone
        chunk = message.get("body", b"")
        size += len(chunk)
        if size > limit:
            raise _too_large(limit)
        chunks.append(chunk)
        if not message.get("more_body", False):
            return b"".join(chunks)


def _too_large(limit: int) -> RouterError:
    return RouterError(413, f"request body is larger than {limit} bytes", code="request_too_large")


def encode_headers(headers: dict[str, str]) -> list[tuple[bytes, bytes]]:
    return [(k.encode("latin-1"), v.encode("latin-1")) for k, v in headers.items()]


async def send_bytes(
    send: Send,
    status: int,
    body: bytes,
    headers: Iterable[tuple[bytes, bytes]] = (),
    content_type: tuple[bytes, bytes] = JSON_TYPE,
) -> None:
    raw = [content_type, (b"content-length", str(len(body)).encode()), *headers]
    await send({"type": "http.response.start", "status": status, "headers": raw})
    await send({"type": "http.response.body", "body": body})


async def send_json(
    send: Send, status: int, data: Any, headers: dict[str, str] | None = None
) -> None:
    body = dumps(data)
    await send_bytes(send, status, body, encode_headers(headers or {}))


async def send_error(send: Send, error: RouterError, headers: dict[str, str] | None = None) -> None:
    await send_json(send, error.status, error.envelope(), {**(headers or {}), **error.headers})
