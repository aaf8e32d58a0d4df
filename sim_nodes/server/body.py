"""Reading a request body safely: size cap, UTF-8, JSON, and then the pydantic schema.

Every way a body can be wrong ends as an `ApiError` (413 for too large, 400 otherwise), never
as an exception the client would see as a 500. The size cap is checked against
Content-Length up front and against the bytes actually received (chunked uploads).
"""

from __future__ import annotations

import json
from typing import Any, TypeVar

from pydantic import BaseModel, ValidationError
from starlette.requests import ClientDisconnect, Request

from tiergate.common.nesting import MAX_BODY_NESTING, body_shape_problem

from .errors import ApiError, bad_request

__all__ = ["read_json_object", "validate_body"]

M = TypeVar("M", bound=BaseModel)

TOO_DEEP = f"The request body nests arrays or objects more than {MAX_BODY_NESTING} levels deep."


async def read_json_object(request: Request, max_bytes: int) -> dict[str, Any]:
    """The body as a JSON object, at most `max_bytes` long."""
    declared = request.headers.get("content-length")
    if declared is not None:
        try:
            length = int(declared)
        except ValueError:
            raise bad_request("Invalid Content-Length header.") from None
        if length > max_bytes:
            raise _too_large(max_bytes)
    chunks: list[bytes] = []
    received = 0
    try:
        async for chunk in request.stream():
            received += len(chunk)
            if received > max_bytes:
                raise _too_large(max_bytes)
            chunks.append(chunk)
    except ClientDisconnect:
        raise ApiError(400, "Client disconnected while sending the body.") from None
    raw = b"".join(chunks)
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise bad_request(f"Request body is not valid UTF-8 (byte {exc.start}).") from None
    try:
        data = json.loads(text, parse_constant=_reject_constant)
    except RecursionError:
        raise bad_request(TOO_DEEP) from None
    except ValueError:
        raise bad_request(
            "We could not parse the JSON body of your request. The body must be a JSON object."
        ) from None
    problem = body_shape_problem(raw, data)
    if problem is not None:
        raise bad_request(f"The request body {problem}.")
    if not isinstance(data, dict):
        raise bad_request("The request body must be a JSON object.")
    return data


def validate_body(model: type[M], data: dict[str, Any]) -> M:
    """`data` as `model`, or a 400 naming the first offending field."""
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        first = exc.errors(include_url=False)[0]
        param = _param(first["loc"])
        if first["type"] == "missing":
            message = f"Missing required parameter: '{param}'."
        elif first["type"] == "value_error":  # our own validators: without pydantic's prefix
            message = f"Invalid value for '{param}': {first['ctx']['error']}."
        else:
            message = f"Invalid value for '{param}': {first['msg']}."
        code = "missing_required_parameter" if first["type"] == "missing" else "invalid_value"
        raise bad_request(message, param=param, code=code) from None


def _param(loc: tuple[int | str, ...]) -> str | None:
    """The dotted field path of an error, without pydantic's union-member tags
    (``prompt.str``, ``tool_choice.NamedToolChoice``): our field names are snake_case."""
    parts: list[str] = []
    for part in loc:
        if isinstance(part, str) and (part in _TYPE_TAGS or "[" in part or part[:1].isupper()):
            break
        parts.append(str(part))
    return ".".join(parts) or None


_TYPE_TAGS = frozenset({"str", "int", "float", "bool", "list", "dict", "none"})


def _reject_constant(name: str) -> Any:
    raise ValueError(f"{name} is not valid JSON")


def _too_large(max_bytes: int) -> ApiError:
    return ApiError(413, f"Request body larger than {max_bytes} bytes.", code="request_too_large")
