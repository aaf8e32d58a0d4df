"""The router's one error type and its OpenAI error envelope.

Every stage raises `RouterError` with the HTTP status and OpenAI error `type`/`code`; the app
maps it to `{"error": {"message", "type", "code", "param"}}` once.
"""

from __future__ import annotations

from typing import Any


class RouterError(Exception):
    """A request the router refuses, with what the client needs to know."""

    def __init__(
        self,
        status: int,
        message: str,
        *,
        type: str = "invalid_request_error",
        code: str | None = None,
        param: str | None = None,
        headers: dict[str, str] | None = None,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.type = type
        self.code = code
        self.param = param
        self.headers = headers or {}

    def envelope(self) -> dict[str, Any]:
        return {
            "error": {
                "message": self.message,
                "type": self.type,
                "code": self.code,
                "param": self.param,
            }
        }
