"""A hosted API's refusal of a request (its 4xx), told in the pool's names.

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

__all__ = ["hosted_refusal"]


def hosted_refusal(body: bytes, status: int, provider_model: str, client_model: str) -> bytes:
    """`body`, a provider's non-2xx reply, as the client is to see it (see the module)."""
    try:
        data: Any = json.loads(body)
    except (ValueError, UnicodeDecodeError):
        data = None
    error = data.get("error") if isinstance(data, dict) else None
    if not isinstance(error, dict) or not isinstance(error.get("message"), str):
        return _envelope(status)
    for field, value in error.items():
        if isinstance(value, str) and provider_model:
            error[field] = value.replace(provider_model, client_model)
    return json.dumps(data).encode()


def _envelope(status: int) -> bytes:
    kind = "invalid_request_error" if 400 <= status < 500 else "server_error"
    message = f"the hosted API refused the request (HTTP {status}) without an OpenAI error"
    return json.dumps({"error": {"message": message, "type": kind, "code": None}}).encode()
