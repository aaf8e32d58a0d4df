"""A node's or a hosted API's refusal of a request (its 4xx), as the client is to see it.

A node's OpenAI error envelope passes as it is (vLLM's says what the request got wrong). SGLang
writes its error's fields at the top level (`{"object": "error", "message": ...}`, as vLLM once
did): they are put in an envelope, so that OpenAI's clients read the message. A body that is
neither (an HTML 404 page, a proxy's text) becomes an envelope that says only the status.

A hosted API's refusal is told in the pool's names.

A provider's error envelope may name its own model ("The model `gpt-x-2026` does not exist"),
which the client never asked for and must not learn: the client asked for one of the pool's
names. The envelope goes back with the provider's model replaced by the name the client asked
for, in every string of its `error` object (message, param, code); anything else about it is the
provider's and passes as it is. A body that is no OpenAI error envelope becomes one that says
only the status, since nothing in it can be vouched for.
"""

from __future__ import annotations

import json
from typing import Any

from tiergate.router.endpoints.hosted import in_pool_names

__all__ = ["hosted_refusal", "node_refusal"]


def node_refusal(body: bytes, status: int) -> bytes:
    """`body`, a node's non-2xx reply, as the client is to see it (see the module)."""
    if _error_of(body) is not None:
        return body
    try:
        data: Any = json.loads(body)
    except (ValueError, UnicodeDecodeError):
        data = None
    if isinstance(data, dict) and data.get("object") == "error":
        error = {key: data.get(key) for key in ("message", "type", "param", "code")}
        if isinstance(error["message"], str):
            return json.dumps({"error": error}).encode()
    return _envelope(status, "the serving node")


def hosted_refusal(body: bytes, status: int, provider_model: str, client_model: str) -> bytes:
    """`body`, a provider's non-2xx reply, as the client is to see it (see the module)."""
    found = _error_of(body)
    if found is None:
        return _envelope(status, "the hosted API")
    data, error = found
    in_pool_names(error, provider_model, client_model)
    return json.dumps(data).encode()


def _error_of(body: bytes) -> tuple[dict[str, Any], dict[str, Any]] | None:
    """The reply and its `error` object, if it is an OpenAI error envelope (an object whose
    `error` has a string `message`)."""
    try:
        data: Any = json.loads(body)
    except (ValueError, UnicodeDecodeError):
        return None
    error = data.get("error") if isinstance(data, dict) else None
    if not isinstance(error, dict) or not isinstance(error.get("message"), str):
        return None
    return data, error


def _envelope(status: int, who: str) -> bytes:
    kind = "invalid_request_error" if 400 <= status < 500 else "server_error"
    message = f"{who} refused the request (HTTP {status}) without an OpenAI error"
    return json.dumps({"error": {"message": message, "type": kind, "code": None}}).encode()
