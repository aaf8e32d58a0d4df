"""One ext_proc stream: one HTTP request passing through the gateway, served by the request
path that serves the router's own port (`Router.completion`), stage for stage.

Envoy's messages become what the request path reads: the request's headers, its body as ASGI
`http.request` messages, then `http.disconnect` once the stream has ended (the client left,
Envoy reset the stream, or the exchange is over), which ends any wait the request is in, as a
client's disconnect does on the router's own port. What the request path sends becomes Envoy's
answers: a refusal before the reply an ImmediateResponse (the OpenAI error envelope, its
status and headers), the reply's start the answer to the reply's headers, and the reply's body,
as the relay rewrote and billed it, the body Envoy passes on (full-duplex streaming: Envoy
forwards what the picker sends back). The pick itself goes out through `GatewayOpener`
(router/epp/pick.py) when the request path opens its upstream request.

A body ends at its end of stream or at the request's trailers; in buffered mode its one message
is all of it (the gateway marks it unended when trailers follow). A buffered body not picked
within `PICK_WITHIN_S` is refused here (router/epp/deadline.py), before the gateway's own
timeout would send it on unpicked.

A stream whose messages come out of order (a body before headers, a reply before the pick) is
a broken gateway or client: it ends with gRPC INVALID_ARGUMENT, and the request it carried
ends as a client that left.
"""

from __future__ import annotations

import asyncio
import logging
from collections import deque
from collections.abc import Callable
from typing import Any

from tiergate.router.base.asgi import ClientGone, Message
from tiergate.router.base.errors import RouterError
from tiergate.router.base.jsonbytes import dumps
from tiergate.router.config import MAX_REPLY_BYTES
from tiergate.router.endpoints.state import EndpointState
from tiergate.router.epp import protocol
from tiergate.router.epp.deadline import PICK_WITHIN_S
from tiergate.router.epp.pick import NEVER_FORWARDED, GatewayOpener, ReplyHead
from tiergate.router.handler import Router
from tiergate.router.request.ids import new_request_id
from tiergate.router.request.models import models_reply
from tiergate.router.upstream.disconnect import Timer
from tiergate.router.upstream.proxy import REQUEST_ID_HEADER

__all__ = ["GatewayStream", "ProtocolViolation", "End"]

log = logging.getLogger("tiergate.router")

DUPLEX = "FULL_DUPLEX_STREAMED"
BUFFERED = "BUFFERED"
#: A request the stream's end did not end within this long is cancelled (its waits all end
#: on a disconnect; this only bounds a bug's cost: the slot it holds).
ABANDON_AFTER_S = 60.0
#: Paths served, and whether each is the chat endpoint.
COMPLETION_PATHS = {"/v1/chat/completions": True, "/v1/completions": False}
#: Answered by the picker itself, as the router's port answers it: the names the pools serve.
MODELS_PATH = "/v1/models"


class ProtocolViolation(Exception):
    """The gateway's messages broke the ext_proc exchange's order."""


class End:
    """Put in the outbox after the last answer: the picker ends the stream."""


END = End()


class GatewayStream:
    """The state of one ext_proc stream; `feed` it Envoy's messages in order, send what
    comes out of `outbox`. `call_later` schedules the buffered pick's deadline (the event
    loop's, unless a test drives time itself)."""

    def __init__(
        self,
        router: Router,
        *,
        fallbacks: int,
        on_failure: Callable[[EndpointState], object],
        internal_error: Callable[[], None],
        max_reply_bytes: int = MAX_REPLY_BYTES,
        pick_within_s: float = PICK_WITHIN_S,
        call_later: Callable[[float, Callable[[], None]], Timer] | None = None,
    ) -> None:
        self.router = router
        self.outbox: asyncio.Queue[protocol.ProcessingResponse | End] = asyncio.Queue()
        self.subset: frozenset[str] | None = None
        self.opener = GatewayOpener(
            self,
            fallbacks=fallbacks,
            on_failure=on_failure,
            max_reply_bytes=max_reply_bytes,
            everywhere=lambda: router.view().endpoints(),
        )
        self.task: asyncio.Task[None] | None = None
        #: The request's id: the request path's, and on the picker's own refusals too.
        self.request_id = new_request_id()
        self.refusal: RouterError | None = None  # a pick not made in time (`_pick_overdue`)
        self.pick_within_s = pick_within_s
        self._call_later = call_later
        self._pick_deadline: Timer | None = None
        self._internal_error = internal_error
        self._buffered = False
        self._headers_seen = False
        self._body_ended = False
        self._body: deque[Message] = deque()
        self._body_ready = asyncio.Event()
        self._gone = False
        self._picked = False
        self._head: ReplyHead | None = None
        self._head_came = asyncio.Event()  # set by the reply's headers, or the stream's end
        self._reply_ended = False
        self._reply_closed = False  # the request path reads no more of the reply's body
        self._chunks: asyncio.Queue[tuple[bytes, bool]] = asyncio.Queue()
        self._refusal: Message | None = None
        self._refusal_body = b""
        self._finished = False
        self._half_closed = False
        self._after_pick: list[str] = []  # acks owed once the pick went out
        self._after_reply: list[str] = []  # acks owed once the reply's end went out

    # -- Envoy's messages in ------------------------------------------------------------------

    def feed(self, request: protocol.ProcessingRequest) -> None:
        """Take one of Envoy's messages; ProtocolViolation when it is out of order."""
        kind = protocol.phase(request)
        if kind == "request_headers":
            self._request_headers(request)
        elif kind == "request_body":
            if not self._headers_seen or self._body_ended:
                raise ProtocolViolation("a request body chunk outside the request")
            body = request.request_body
            if self._buffered:  # all of it, even unended (trailers follow)
                self._take_body(bytes(body.body), False)
                self._start_pick_deadline()
            else:
                self._take_body(bytes(body.body), not body.end_of_stream)
        elif kind == "request_trailers":
            if not self._headers_seen:
                raise ProtocolViolation("request trailers before the request's headers")
            if not self._body_ended:  # trailers end the body
                self._take_body(b"", False)
            if self._picked:
                self._emit(protocol.ack("request_trailers"))
            else:
                self._after_pick.append("request_trailers")
        elif kind == "response_headers":
            if not self._picked or self._head is not None:
                raise ProtocolViolation("a reply's headers before the pick, or twice")
            headers = protocol.headers_of(request.response_headers)
            try:
                status = int(headers.get(":status", ""))
            except ValueError:
                raise ProtocolViolation("a reply's headers without a status") from None
            plain = {k: v for k, v in headers.items() if not k.startswith(":")}
            self._head = ReplyHead(status, plain, protocol.served_of(request))
            self._head_came.set()
            if request.response_headers.end_of_stream:
                self._end_reply()
        elif kind == "response_body":
            if self._head is None or self._reply_ended:
                raise ProtocolViolation("a reply body chunk outside the reply")
            body = request.response_body
            self._reply_ended = bool(body.end_of_stream)
            if not self._reply_closed:
                self._chunks.put_nowait((bytes(body.body), self._reply_ended))
        elif kind == "response_trailers":
            if self._head is None:
                raise ProtocolViolation("reply trailers before the reply's headers")
            if not self._reply_ended:
                self._end_reply()
            if self._finished:
                self._emit(protocol.ack("response_trailers"))
            else:
                self._after_reply.append("response_trailers")
        else:
            raise ProtocolViolation("a message that carries no part of an HTTP exchange")

    def _request_headers(self, request: protocol.ProcessingRequest) -> None:
        if self._headers_seen:
            raise ProtocolViolation("a request's headers twice")
        self._headers_seen = True
        headers = protocol.headers_of(request.request_headers)
        self.subset = protocol.subset_of(request)
        request_mode, reply_mode = protocol.body_modes(request) or (DUPLEX, DUPLEX)
        self._buffered = request_mode == BUFFERED
        if request.request_headers.end_of_stream:
            self._take_body(b"", False)
        if request_mode not in (DUPLEX, BUFFERED) or reply_mode != DUPLEX:
            log.error("event=epp_misconfigured request_body_mode=%s response_body_mode=%s",
                      request_mode, reply_mode)  # fmt: skip
            self._refuse(_misconfigured(request_mode, reply_mode))
            return
        method, path = headers.get(":method", ""), headers.get(":path", "").partition("?")[0]
        if path == MODELS_PATH:  # as the router's port answers it
            if method not in ("GET", "HEAD"):
                allow = {"allow": "GET, HEAD"}
                message = f"method not allowed: {path} takes GET, HEAD"
                self._refuse(RouterError(405, message, code="method_not_allowed", headers=allow))
                return
            reply = models_reply(self.router.view(), hosted=False)  # the gateway's reach
            body = b"" if method == "HEAD" else dumps(reply)
            self._immediate_parts(200, {"content-type": "application/json"}, body, "models")
            return
        chat = COMPLETION_PATHS.get(path)
        if chat is None:
            self._refuse(RouterError(404, f"no route {path}", code="not_found"))
            return
        if method != "POST":
            allow = {"allow": "POST"}
            message = f"method not allowed: {path} takes POST"
            self._refuse(RouterError(405, message, code="method_not_allowed", headers=allow))
            return
        if self._buffered and not self._body_ended:
            # The body comes only after this. Not before the checks above, nor for a request
            # with no body: an acknowledged request goes on, unpicked, to the gateway's
            # fallback, while the refusal is on its way.
            self._emit(protocol.ack("request_headers"))
        scope = {
            "type": "http",
            "method": method,
            "path": path,
            "headers": [
                (k.encode("latin-1"), v.encode("latin-1"))
                for k, v in headers.items()
                if not k.startswith(":")
            ],
        }
        self.task = asyncio.create_task(self._serve(scope, chat), name="tiergate-epp-request")

    def _take_body(self, chunk: bytes, more: bool) -> None:
        self._body.append({"type": "http.request", "body": chunk, "more_body": more})
        self._body_ended = not more
        self._body_ready.set()

    def _end_reply(self) -> None:
        self._reply_ended = True
        if not self._reply_closed:
            self._chunks.put_nowait((b"", True))

    def _start_pick_deadline(self) -> None:
        call_later = self._call_later or asyncio.get_running_loop().call_later
        self._pick_deadline = call_later(self.pick_within_s, self._pick_overdue)

    def _stop_pick_deadline(self) -> None:
        if self._pick_deadline is not None:
            self._pick_deadline.cancel()
            self._pick_deadline = None

    def _pick_overdue(self) -> None:
        """The gateway's timeout for the pick is near: the request is refused here, and ends
        (as a client that left) once the stream has."""
        self._pick_deadline = None
        if self._picked or self._finished or self._gone:
            return
        log.warning(
            "event=epp_pick_overdue request_id=%s within_s=%g", self.request_id, self.pick_within_s
        )
        self.refusal = _pick_timeout(self.pick_within_s)
        self._refuse(self.refusal)

    def half_closed(self) -> None:
        """Envoy will send nothing more: the stream ends once the answers owed went out
        (at once if none are)."""
        self._half_closed = True
        if self._finished or self.task is None:
            self._emit(END)

    def ended(self) -> None:
        """The stream is over (Envoy closed or reset it, or the picker ended it): whatever
        the request waits for now ends as a client that left."""
        if self._gone:
            return
        self._gone = True
        self._stop_pick_deadline()
        self._body_ready.set()
        self._head_came.set()
        task = self.task
        if task is not None and not task.done():
            asyncio.get_running_loop().call_later(ABANDON_AFTER_S, task.cancel)

    # -- the request path's side -----------------------------------------------------------------

    async def _serve(self, scope: dict[str, Any], chat: bool) -> None:
        try:
            await self.router.completion(
                scope, self.receive, self.send, chat=chat, upstream=self.opener,
                request_id=self.request_id,
            )  # fmt: skip
        except Exception:
            self._internal_error()
            log.exception("event=internal_error path=%s via=epp", scope["path"])
        if not self._finished and not self._gone:  # a request path that said nothing
            self._refuse(RouterError(500, "internal router error", type="server_error",
                                     code="internal_error"))  # fmt: skip

    async def receive(self) -> Message:
        """The request's body, chunk by chunk, then `http.disconnect` once the stream ends."""
        while not self._body and not self._gone:
            self._body_ready.clear()
            await self._body_ready.wait()
        if self._body:
            return self._body.popleft()
        return {"type": "http.disconnect"}

    async def send(self, message: Message) -> None:
        """What the request path sends its client, as Envoy's answers."""
        if self._finished or self._gone:
            return
        if message["type"] == "http.response.start":
            if self._head is None:
                self._refusal = message  # no reply came through the gateway: it answers
                return
            self._answer_head(message)
            return
        body, more = bytes(message.get("body", b"")), bool(message.get("more_body", False))
        if self._refusal is not None:
            self._refusal_body += body
            if not more:
                self._immediate(self._refusal, self._refusal_body)
                await _let_the_answers_out()
            return
        if body or not more:
            self._emit(*protocol.streamed_body("response_body", body, not more))
        if not more:
            self._finished = True
            for part in self._after_reply:
                self._emit(protocol.ack(part))
            if self._half_closed:
                self._emit(END)
            await _let_the_answers_out()

    def _answer_head(self, message: Message) -> None:
        head = self._head
        assert head is not None
        headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in message["headers"]}
        if message["status"] != head.status:
            headers[":status"] = str(message["status"])
        # The body may be rewritten (its length with it): a length is set only when told.
        self._emit(protocol.reply_headers(headers, ("content-length",)))

    # -- the pick (GatewayOpener's gateway) ----------------------------------------------------

    def send_pick(self, destination: str, headers: dict[str, str], body: bytes) -> None:
        remove = [name for name in NEVER_FORWARDED if name not in headers]
        if self._buffered:
            self._emit(protocol.pick_in_body(destination, headers, remove, body))
        else:
            self._emit(protocol.pick_in_headers(destination, headers, remove))
            self._emit(*protocol.streamed_body("request_body", body, True))
        self._picked = True
        self._stop_pick_deadline()
        for part in self._after_pick:
            self._emit(protocol.ack(part))

    async def reply_head(self) -> ReplyHead:
        # An Event, not a future awaited through asyncio.shield: one hop of the loop fewer,
        # and the request's own cancellation leaves the stream's state alone.
        await self._head_came.wait()
        if self._head is None:  # the stream ended first
            raise ClientGone
        return self._head

    async def reply_chunk(self) -> tuple[bytes, bool]:
        return await self._chunks.get()

    def close_reply(self) -> None:
        self._reply_closed = True
        while not self._chunks.empty():
            self._chunks.get_nowait()

    # -- answers out -------------------------------------------------------------------------------

    def _emit(self, *responses: protocol.ProcessingResponse) -> None:
        for response in responses:
            self.outbox.put_nowait(response)

    def _refuse(self, error: RouterError) -> None:
        headers = {
            "content-type": "application/json",
            REQUEST_ID_HEADER: self.request_id,
            **error.headers,
        }
        self._immediate_parts(error.status, headers, dumps(error.envelope()), error.code)

    def _immediate(self, start: Message, body: bytes) -> None:
        headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in start["headers"]}
        headers.pop("content-length", None)
        self._immediate_parts(start["status"], headers, body, "tiergate")

    def _immediate_parts(
        self, status: int, headers: dict[str, str], body: bytes, details: str | None
    ) -> None:
        if self._finished:
            return
        self._finished = True
        self._stop_pick_deadline()
        self._emit(protocol.immediate(status, headers, body, details or "tiergate"), END)


async def _let_the_answers_out() -> None:
    """One turn of the loop, in which the servicer starts sending the reply's end: Envoy gets
    it while the request path's bookkeeping (accounting, releasing its slot) runs."""
    await asyncio.sleep(0)


def _pick_timeout(within_s: float) -> RouterError:
    """A request shed: its tier's queue is too long for its pick to be made in time. A 429,
    as the router's own port sheds (`tier_saturated`) and as Gateway API Inference Extension
    pickers shed; a 5xx would count against the gateway's availability."""
    return RouterError(
        429,
        f"no endpoint was picked within {within_s:g} s (the tier's queue is long); retry later",
        type="rate_limit_error",
        code="pick_timeout",
        headers={"Retry-After": "1"},
    )


def _misconfigured(request_mode: str, reply_mode: str) -> RouterError:
    return RouterError(
        500,
        "the gateway's ext_proc filter must send the request body FULL_DUPLEX_STREAMED (or "
        f"BUFFERED) and the response body FULL_DUPLEX_STREAMED; it sends {request_mode} and "
        f"{reply_mode}",
        type="server_error",
        code="gateway_misconfigured",
    )
