"""A tool call checked against the tool's JSON schema: is a cascade's first reply usable?

Kept apart from router/request/cascade.py with nothing but jsonschema, because it is what the
checking worker process imports (router/request/check_worker.py).
"""

from __future__ import annotations

import json
from typing import Any

from jsonschema import Draft202012Validator
from jsonschema.exceptions import SchemaError
from referencing import Registry
from referencing.exceptions import Unresolvable

__all__ = ["tool_call_problem", "tool_calls"]

#: Tool schemas come from clients: a `$ref` resolves inside the schema or not at all. By default
#: jsonschema fetches remote references with a blocking urlopen, which would stall the event
#: loop for as long as the named host likes and make the router fetch any URL a client names.
_NO_REMOTE_REFS: Registry = Registry()


def tool_call_problem(reply: dict[str, Any], request: dict[str, Any]) -> str | None:
    """Why the reply's tool call is unusable, or None when it is fine (or there is none to
    check). Arguments must be JSON matching the called tool's `parameters` schema.

    The reason goes into the log, so it names the kind of problem and the schema keyword
    that failed, never a value: arguments and tool names are the model's output.
    Validation can take as long as the client's schema likes: the router runs this in a
    worker process with a deadline (router/request/tool_check.py), never on the event loop.
    """
    offered = request.get("tools")
    # Tools that are not a list of functions with string names (a node let them through)
    # offer nothing to check a call against.
    tools = {
        t["function"]["name"]: t["function"].get("parameters") or {}
        for t in (offered if isinstance(offered, list) else ())
        if isinstance(t, dict)
        and isinstance(t.get("function"), dict)
        and isinstance(t["function"].get("name"), str)
    }
    if not tools:
        return None
    calls = tool_calls(reply)
    if calls is None:
        return "the reply has no message"
    for call in calls:
        function = call.get("function") if isinstance(call, dict) else None
        if not isinstance(function, dict):
            return "a tool call without a function"
        name = function.get("name")
        if not isinstance(name, str) or name not in tools:
            return "a call to a tool the request does not offer"
        try:
            arguments = json.loads(function.get("arguments") or "")
        except (ValueError, TypeError):
            return "tool call arguments that are not valid JSON"
        validator = Draft202012Validator(tools[name], registry=_NO_REMOTE_REFS)
        try:
            error = next(iter(validator.iter_errors(arguments)), None)
        except (SchemaError, Unresolvable):
            # The client's schema is broken, or refers outside itself: not the model's fault.
            return None
        if error is not None:
            return f"tool call arguments that do not match the tool's schema ({error.validator})"
    return None


def tool_calls(reply: dict[str, Any]) -> list[Any] | None:
    """The reply's first choice's tool calls ([] for none); None when it has no message."""
    try:
        message = reply["choices"][0]["message"]
    except (KeyError, IndexError, TypeError):
        return None
    calls = message.get("tool_calls") if isinstance(message, dict) else None
    # No calls: the model chose to answer in text, nothing malformed to escalate.
    return calls if isinstance(calls, list) else []
