"""The routing policy as a JSON schema, for the Helm chart's values.schema.json.

Each plugin's `type` is one of the registered types, and its parameters are checked against
that type's own model (pydantic's schema, camelCase keys), so `helm install` refuses an unknown
type or a bad parameter, naming it, before a router pod starts with a policy it cannot build.
Two plugins of one name are left to the router, which refuses them at start.
`tools/chart_schema.py` writes it into the chart; a chart test checks the two agree.
"""

from __future__ import annotations

from typing import Any

from tiergate.router.policy import registry
from tiergate.router.policy.base import PluginKind

__all__ = ["policy_json_schema"]


def _without_titles(node: Any) -> Any:
    """pydantic's schema minus its generated `title`s (noise in a values schema)."""
    if isinstance(node, dict):
        return {k: _without_titles(v) for k, v in node.items() if k != "title"}
    if isinstance(node, list):
        return [_without_titles(v) for v in node]
    return node


def _plugins(kind: PluginKind) -> dict[str, Any]:
    """A `{name, type, parameters[, weight]}` entry of `kind`; each type's parameters are
    checked under an if/then on the type, so an error names the parameter, not every type."""
    types = registry.known_types(kind)
    properties: dict[str, Any] = {
        "name": {"type": "string", "description": "Default: the type."},
        "type": {"enum": types},
        "parameters": {"type": "object"},
    }
    if kind == "scorer":
        properties["weight"] = {"type": "number", "exclusiveMinimum": 0, "maximum": 1e6}
    per_type = []
    for name in types:
        parameters = registry.plugin_type(name, kind, name).parameters
        per_type.append(
            {
                "if": {"properties": {"type": {"const": name}}},
                "then": {
                    "properties": {
                        "parameters": _without_titles(parameters.model_json_schema(by_alias=True))
                    }
                },
            }
        )
    return {
        "type": "object",
        "additionalProperties": False,
        "required": ["type"],
        "properties": properties,
        "allOf": per_type,
    }


def policy_json_schema() -> dict[str, Any]:
    """`router.policy` of the chart's values: filters, weighted scorers and a picker."""
    return {
        "type": "object",
        "additionalProperties": False,
        "description": "The router's endpoint-picking policy (README: Routing policy); "
        "empty: the default.",
        "properties": {
            "filters": {"type": "array", "items": _plugins("filter")},
            "scorers": {"type": "array", "items": _plugins("scorer")},
            "picker": _plugins("picker"),
        },
    }
