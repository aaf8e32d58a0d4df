"""How deeply the free-form JSON in a request may nest: tool schemas and earlier tool calls.

Those are the only parts of a request the schema does not shape, and the node serialises them
again (a tool's definition counts towards the prompt's tokens). Serialisers have depth limits
of their own (pydantic's stops near 255 levels), so a limit well under all of them is checked
when the request is validated: a schema nested too deeply is the request's fault, a 400 that
names the field, never an error from deep inside the reply.
"""

from __future__ import annotations

from typing import Annotated, Any

from pydantic import AfterValidator

__all__ = [
    "MAX_BODY_CONTAINERS",
    "MAX_BODY_NESTING",
    "MAX_NESTING",
    "JsonObject",
    "body_shape_problem",
    "nesting_depth",
]

#: Levels of objects and arrays a free-form value may nest, counting the value itself. Far
#: above real tool schemas (OpenAI's structured outputs allow 10 levels of objects).
MAX_NESTING = 64
#: Levels a whole request body may nest. Python's json reader gives up near 1,000 (its
#: recursion limit), orjson near 1,024: a body is refused well below both, by the router and
#: the node alike, in the same words.
MAX_BODY_NESTING = 512
#: Arrays and objects a whole request body may hold. A 4 MiB body of empty arrays holds 1.3
#: million, and reading them (their depth, each message, each prompt) took seconds of a
#: worker's CPU per request; real bodies hold thousands (a long agent transcript with content
#: parts, a hundred tool schemas).
MAX_BODY_CONTAINERS = 50_000


def nesting_depth(value: Any, stop_after: int = MAX_NESTING) -> int:
    """Levels of objects and arrays in `value` (0 for a scalar), walked without recursion;
    counting stops once the depth exceeds `stop_after`."""
    deepest = 0
    stack: list[tuple[Any, int]] = [(value, 1)]
    while stack:
        item, depth = stack.pop()
        if not isinstance(item, dict | list):
            continue
        deepest = max(deepest, depth)
        if deepest > stop_after:
            break
        children = item.values() if isinstance(item, dict) else item
        stack.extend((child, depth + 1) for child in children if isinstance(child, dict | list))
    return deepest


def body_shape_problem(raw: bytes, body: Any) -> str | None:
    """What is wrong with the shape of the request body `body` (read from `raw`): nesting
    deeper than `MAX_BODY_NESTING`, or more than `MAX_BODY_CONTAINERS` arrays and objects;
    None when neither. Only a body with that many brackets can be either, and counting them
    is cheap: most bodies are never walked, and a walk stops at either limit."""
    if raw.count(b"[") + raw.count(b"{") <= MAX_BODY_NESTING:
        return None
    containers = 0
    stack: list[tuple[Any, int]] = [(body, 1)] if isinstance(body, dict | list) else []
    while stack:
        item, depth = stack.pop()
        containers += 1
        if depth > MAX_BODY_NESTING:
            return f"nests arrays or objects more than {MAX_BODY_NESTING} levels deep"
        if containers > MAX_BODY_CONTAINERS:
            return f"holds more than {MAX_BODY_CONTAINERS:,} arrays and objects"
        children = item.values() if isinstance(item, dict) else item
        stack.extend((child, depth + 1) for child in children if isinstance(child, dict | list))
    return None


def _not_too_deep(value: dict[str, Any]) -> dict[str, Any]:
    if nesting_depth(value) > MAX_NESTING:
        raise ValueError(f"it nests more than {MAX_NESTING} levels of objects and arrays")
    return value


#: A JSON object of at most `MAX_NESTING` levels.
JsonObject = Annotated[dict[str, Any], AfterValidator(_not_too_deep)]
