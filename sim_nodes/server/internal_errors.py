"""The last line of defence: an exception no route handled becomes a 500 in the OpenAI
envelope, and the connection stays usable.

Starlette's own outermost handler re-raises every exception after sending its 500, and uvicorn
then closes the connection; a client that kept it alive (a router's pool) sends its next
request, often another tenant's, into a closed socket. This middleware sits inside that
handler and never lets an exception reach it unless a response is half sent:

* before the response starts: the 500 envelope goes out and the connection is kept, as after
  any error reply (uvicorn discards a request body the route did not read);
* after the response ended (a hook that runs once the reply is out): only logged, since the
  client already has its whole reply;
* in the middle of a response: re-raised, so the server closes the connection; a reply cut
  short is how HTTP says it failed. (Event streams end with an error event instead, see
  `streaming`.)
"""

from __future__ import annotations

import logging

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from .errors import ApiError, error_response
from .logs import log_event, logger

__all__ = ["INTERNAL_ERROR", "InternalErrors", "log_internal_error"]

INTERNAL_ERROR = ApiError(500, "Internal error.", code="internal_error")


def log_internal_error(path: str, exc: BaseException, *, when: str) -> None:
    """One line naming the exception's type (never its message: it may quote the request);
    the traceback at debug level."""
    log_event("internal_error", level=logging.ERROR, path=path, error=type(exc).__name__, when=when)
    logger.debug("internal error", exc_info=exc)


class InternalErrors:
    """ASGI middleware: see the module docstring."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = ended = False

        async def tracking_send(message: Message) -> None:
            nonlocal started, ended
            if message["type"] == "http.response.start":
                started = True
            elif message["type"] == "http.response.body" and not message.get("more_body"):
                ended = True
            await send(message)

        try:
            await self.app(scope, receive, tracking_send)
        except Exception as exc:
            if ended:
                log_internal_error(scope["path"], exc, when="after_response")
                return
            if started:
                log_internal_error(scope["path"], exc, when="during_response")
                raise
            log_internal_error(scope["path"], exc, when="before_response")
            await error_response(INTERNAL_ERROR)(scope, receive, send)
