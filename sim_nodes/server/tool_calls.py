"""Simulated tool calls: schema-conforming JSON arguments, malformed at the model's error rate.

A node whose model has `quality` q answers a tool request with valid arguments with
probability q and with malformed JSON (truncated, a missing closing brace, a trailing comma,
single quotes) otherwise. All randomness comes from the `random.Random` passed in, so a
seeded node (or a request `seed`) reproduces the same calls.
"""

from __future__ import annotations

import json
import random
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

__all__ = ["PlannedToolCall", "arguments_for_schema", "malform", "plan_tool_call"]

_MAX_DEPTH = 4
_SAMPLE_STRINGS = ("alpha", "main.py", "build the project", "tiergate", "us-east-1", "42")


@dataclass(frozen=True, slots=True)
class PlannedToolCall:
    """The call a reply will carry."""

    call_id: str
    name: str
    arguments: str
    malformed: bool


def plan_tool_call(
    name: str, schema: dict[str, Any] | None, quality: float, rng: random.Random
) -> PlannedToolCall:
    """A call of tool `name`: its arguments, malformed with probability 1 - quality."""
    call_id = "call_" + "".join(rng.choices("abcdefghijklmnopqrstuvwxyz0123456789", k=24))
    value = arguments_for_schema(schema or {"type": "object"}, rng)
    if not isinstance(value, dict):
        value = {"value": value}
    text = json.dumps(value)
    malformed = rng.random() >= quality
    if malformed:
        text = malform(text, rng)
    return PlannedToolCall(call_id, name, text, malformed)


def arguments_for_schema(schema: Any, rng: random.Random, depth: int = 0) -> Any:
    """A value conforming to a (subset of) JSON Schema: type, properties, required, enum,
    const, items, min/max bounds, anyOf/oneOf, default. Unknown shapes get a string."""
    if not isinstance(schema, dict):
        return "value"
    if "const" in schema:
        return schema["const"]
    enum = schema.get("enum")
    if isinstance(enum, list) and enum:
        return rng.choice(enum)
    for key in ("anyOf", "oneOf"):
        options = schema.get(key)
        if isinstance(options, list) and options:
            return arguments_for_schema(rng.choice(options), rng, depth + 1)
    kind = schema.get("type")
    if isinstance(kind, list):
        kinds = [k for k in kind if k != "null"] or ["null"]
        kind = rng.choice(kinds)
    if kind is None:
        kind = "object" if "properties" in schema else "string"
    if kind == "object":
        return _object(schema, rng, depth)
    if kind == "array":
        return _array(schema, rng, depth)
    if kind == "integer":
        low, high = _bounds(schema, 0, 100)
        return rng.randint(int(low), int(high))
    if kind == "number":
        low, high = _bounds(schema, 0.0, 100.0)
        return round(rng.uniform(low, high), 3)
    if kind == "boolean":
        return rng.random() < 0.5
    if kind == "null":
        return None
    return _string(schema, rng)


def malform(text: str, rng: random.Random) -> str:
    """`text` (a JSON object) broken so that no JSON parser accepts it."""
    how = rng.randrange(4)
    if how == 0 and len(text) > 2:
        # Truncated mid-way, as a reply cut off by a stop sequence would be.
        broken = text[: rng.randrange(1, len(text) - 1)]
    elif how == 1:
        broken = text[:-1]  # the closing brace is missing
    elif how == 2:
        broken = text[:-1] + ", }" if len(text) > 2 else "{,}"  # a trailing comma
    else:
        broken = text.replace('"', "'") if '"' in text else "{'"
    try:
        json.loads(broken)
    except ValueError:
        return broken
    return text[:-1]  # pragma: no cover - every branch above already breaks an object


def _object(schema: dict[str, Any], rng: random.Random, depth: int) -> dict[str, Any]:
    properties = schema.get("properties")
    if not isinstance(properties, dict) or depth >= _MAX_DEPTH:
        return {}
    required = schema.get("required")
    required_names: Sequence[Any] = required if isinstance(required, list) else []
    out: dict[str, Any] = {}
    for name, sub in properties.items():
        if name in required_names or rng.random() < 0.5:
            out[str(name)] = arguments_for_schema(sub, rng, depth + 1)
    return out


def _array(schema: dict[str, Any], rng: random.Random, depth: int) -> list[Any]:
    if depth >= _MAX_DEPTH:
        return []
    low = schema.get("minItems", 1)
    high = schema.get("maxItems", max(low, 3)) if isinstance(low, int) else 3
    low = low if isinstance(low, int) and low >= 0 else 1
    high = high if isinstance(high, int) and high >= low else low
    count = rng.randint(low, min(high, low + 3))
    return [arguments_for_schema(schema.get("items", {}), rng, depth + 1) for _ in range(count)]


def _bounds(schema: dict[str, Any], low: float, high: float) -> tuple[float, float]:
    lo = schema.get("minimum", schema.get("exclusiveMinimum", low))
    hi = schema.get("maximum", schema.get("exclusiveMaximum", None))
    lo = lo if isinstance(lo, int | float) and not isinstance(lo, bool) else low
    if not isinstance(hi, int | float) or isinstance(hi, bool):
        hi = max(lo + (high - low), lo)
    if "exclusiveMinimum" in schema and "minimum" not in schema:
        lo = lo + 1 if isinstance(lo, int) else lo + 1e-3
    if "exclusiveMaximum" in schema and "maximum" not in schema:
        hi = hi - 1 if isinstance(hi, int) else hi - 1e-3
    return (lo, hi) if hi >= lo else (lo, lo)


def _string(schema: dict[str, Any], rng: random.Random) -> str:
    min_length = schema.get("minLength", 0)
    max_length = schema.get("maxLength", None)
    text = rng.choice(_SAMPLE_STRINGS)
    if isinstance(min_length, int) and len(text) < min_length:
        text = text + "x" * (min_length - len(text))
    if isinstance(max_length, int) and max_length >= 0:
        text = text[:max_length]
    return text
