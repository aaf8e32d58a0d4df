"""Server-sent events: the response class that streams them and cancels on disconnect.

`EventStreamResponse` sends each chunk as soon as its iterator yields it and watches the
connection at the same time; when the client goes away it stops iterating, closes the
iterator and calls `on_close` (the engine request is cancelled there, freeing its KV cache).
An exception from the iterator ends the stream with an error event (and no ``[DONE]``), as
an aborted generation does: the client is told, and its connection stays usable.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Callable
from typing import Any

from pydantic import BaseModel
from starlette.responses import Response
from starlette.types import Receive, Scope, Send

from .errors import error_body
from .internal_errors import INTERNAL_ERROR, log_internal_error

__all__ = ["DONE", "EventStreamResponse", "sse_data", "sse_json"]

DONE = b"data: [DONE]\n\n"


def sse_data(model: BaseModel) -> bytes:
    """One SSE event carrying `model` as JSON."""
    return b"data: " + model.__pydantic_serializer__.to_json(model) + b"\n\n"


def sse_json(data: dict[str, Any]) -> bytes:
    """One SSE event carrying a plain JSON object (error events)."""
    return b"data: " + json.dumps(data, separators=(",", ":")).encode() + b"\n\n"


_ERROR_EVENT = sse_json(error_body(INTERNAL_ERROR))


class EventStreamResponse(Response):
    """A ``text/event-stream`` response fed by an async iterator of ready-made events.

    A watcher task reads the connection; on ``http.disconnect`` it calls `on_disconnect`
    (which must make the iterator end soon, e.g. by cancelling the engine request) and the
    send loop stops at the next event. Cancellation is explicit rather than by cancelling
    the sending task: a task that never blocks (events already queued) would not notice.
    """

    media_type = "text/event-stream"

    def __init__(
        self,
        events: AsyncIterator[bytes],
        *,
        headers: dict[str, str] | None = None,
        on_disconnect: Callable[[], None] | None = None,
        on_close: Callable[[], None] | None = None,
    ) -> None:
        self._events = events
        self._on_disconnect = on_disconnect
        self._on_close = on_close
        self._gone = False
        self.status_code = 200
        self.background = None
        extra = {"cache-control": "no-cache", "x-accel-buffering": "no", **(headers or {})}
        self.init_headers(extra)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        watcher = asyncio.create_task(self._watch(receive))
        try:
            await self._stream(send, scope["path"])
        except OSError:
            pass  # the client went away while we were sending; nothing left to tell it
        finally:
            watcher.cancel()
            aclose = getattr(self._events, "aclose", None)
            if aclose is not None:
                await aclose()
            if self._on_close is not None:
                self._on_close()

    async def _watch(self, receive: Receive) -> None:
        while (await receive())["type"] != "http.disconnect":
            pass
        self._gone = True
        if self._on_disconnect is not None:
            self._on_disconnect()

    async def _stream(self, send: Send, path: str) -> None:
        await send(
            {"type": "http.response.start", "status": self.status_code, "headers": self.raw_headers}
        )
        events = aiter(self._events)
        while not self._gone:
            try:
                event = await anext(events)
            except StopAsyncIteration:
                break
            except Exception as exc:  # a bug while replying: say so, and end the reply cleanly
                log_internal_error(path, exc, when="during_stream")
                await send({"type": "http.response.body", "body": _ERROR_EVENT, "more_body": True})
                break
            await send({"type": "http.response.body", "body": event, "more_body": True})
        if not self._gone:
            await send({"type": "http.response.body", "body": b"", "more_body": False})
