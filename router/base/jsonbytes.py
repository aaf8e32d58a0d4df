"""JSON to and from bytes on the request path: orjson where it can, Python's `json` where it
will not.

orjson is much faster than `json` on the request path, but refuses some of what `json` takes:
- it writes nesting up to 254 levels deep (it reads up to 1,024), and no integer beyond 64
  bits: `dumps` falls back to `json` for those;
- it reads no `NaN` or `Infinity` and no unpaired surrogate escape, which `json` writes (a
  node in Python may send a `-Infinity` logprob): `loads_reply` falls back to `json` for a
  node's reply, and the reply is then written back with `json` too, as the node wrote it.
Request bodies are read with orjson alone: the router refuses what JSON (RFC 8259) refuses
(router/request/body.py).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import orjson


def dumps(value: Any) -> bytes:
    """Compact JSON. ValueError for a value nested deeper than Python's recursion limit."""
    try:
        return orjson.dumps(value)
    except orjson.JSONEncodeError:
        return _json_dumps(value)


def loads_reply(raw: bytes) -> tuple[Any, Callable[[Any], bytes]]:
    """A node's JSON reply, and the `dumps` that writes it back as the node wrote it.
    ValueError if it is not JSON, even by Python's measure, or nests too deeply to read."""
    try:
        return orjson.loads(raw), dumps
    except orjson.JSONDecodeError:
        try:
            return json.loads(raw), _json_dumps
        except RecursionError:
            raise ValueError("nested too deeply") from None


def _json_dumps(value: Any) -> bytes:
    try:
        return json.dumps(value, separators=(",", ":")).encode()
    except RecursionError:
        raise ValueError("nested too deeply") from None
