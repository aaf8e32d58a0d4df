"""The server's one error type and its OpenAI error envelope.

Every failure a client can cause or observe is an `ApiError`: it carries the HTTP status and
the envelope fields, and is turned into a response in exactly one place (`error_response`).
The envelope is OpenAI's: ``{"error": {"message", "type", "code", "param"}}``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from starlette.responses import JSONResponse

__all__ = [
    "ApiError",
    "bad_request",
    "context_length_exceeded",
    "error_body",
    "error_response",
    "model_not_found",
]

_TYPE_BY_STATUS: dict[int, str] = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "invalid_request_error",
    405: "invalid_request_error",
    413: "invalid_request_error",
    415: "invalid_request_error",
    429: "rate_limit_error",
    503: "service_unavailable_error",
}


class ApiError(Exception):
    """An error reply: HTTP `status` plus the OpenAI envelope fields."""

    def __init__(
        self,
        status: int,
        message: str,
        *,
        code: str | None = None,
        param: str | None = None,
        error_type: str | None = None,
        headers: dict[str, str] | None = None,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.code = code
        self.param = param
        self.error_type = error_type or _TYPE_BY_STATUS.get(
            status, "server_error" if status >= 500 else "invalid_request_error"
        )
        self.headers = headers or {}


def bad_request(message: str, *, param: str | None = None, code: str | None = None) -> ApiError:
    """A 400 invalid_request_error."""
    return ApiError(400, message, param=param, code=code)


def model_not_found(model: str) -> ApiError:
    """A 404 for a model name this node does not serve."""
    return ApiError(
        404,
        f"The model `{model}` does not exist or you do not have access to it.",
        code="model_not_found",
        param="model",
    )


def context_length_exceeded(limit: int, prompt_tokens: int, max_tokens: int) -> ApiError:
    """A 400 for prompt plus requested output longer than the model's context."""
    return ApiError(
        400,
        f"This model's maximum context length is {limit} tokens. However, you requested "
        f"{prompt_tokens + max_tokens} tokens ({prompt_tokens} in the messages, "
        f"{max_tokens} in the completion). Please reduce the length of the messages or "
        "completion.",
        code="context_length_exceeded",
        param="messages",
    )


def error_body(error: ApiError) -> dict[str, Any]:
    """The envelope as a JSON-ready dict."""
    return {
        "error": {
            "message": error.message,
            "type": error.error_type,
            "code": error.code,
            "param": error.param,
        }
    }


def error_response(error: ApiError, headers: Mapping[str, str] | None = None) -> JSONResponse:
    """The HTTP response for `error`."""
    merged = {**(headers or {}), **error.headers}
    return JSONResponse(error_body(error), status_code=error.status, headers=merged)
