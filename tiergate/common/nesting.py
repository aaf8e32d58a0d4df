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

__all__ = ["MAX_BODY_NESTING", "MAX_NESTING", "JsonObject", "body_too_deep", "nesting_depth"]

#: Levels of objects and arrays a free-form value may nest, counting the value itself. Far
#: above real tool schemas (OpenAI's structured outputs allow 10 levels of objects).
MAX_NESTING = 64
#: Levels a whole request body may nest. Python's json reader gives up near 1,000 (its
#: recursion limit), orjson near 1,024: a body is refused well below both, by the router and
#: the node alike, in the same words.
MAX_BODY_NESTING = 512


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


def body_too_deep(raw: bytes, body: Any) -> bool:
    """Whether the request body `body` (read from `raw`) nests deeper than `MAX_BODY_NESTING`.
    Only a body with that many brackets can, and counting them is cheap: most bodies are
    never walked."""
    if raw.count(b"[") + raw.count(b"{") <= MAX_BODY_NESTING:
        return False
    return nesting_depth(body, MAX_BODY_NESTING) > MAX_BODY_NESTING


def _not_too_deep(value: dict[str, Any]) -> dict[str, Any]:
    if nesting_depth(value) > MAX_NESTING:
        raise ValueError(f"it nests more than {MAX_NESTING} levels of objects and arrays")
    return value


#: A JSON object of at most `MAX_NESTING` levels.
JsonObject = Annotated[dict[str, Any], AfterValidator(_not_too_deep)]
