"""Plugin types by kebab-case name, and building a plugin from `{name, type, parameters}`.

Each plugin module registers its class with `@register("queue-depth-scorer", Params)`; the
package imports every built-in module, so importing `tiergate.router.policy` fills the registry.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, TypeVar

from pydantic import ValidationError

from tiergate.router.policy.base import Parameters, Plugin, PluginContext, PluginKind

__all__ = [
    "PluginType",
    "PolicyConfigError",
    "build_plugin",
    "known_types",
    "plugin_type",
    "register",
    "validate_parameters",
]

_KEBAB = re.compile(r"^[a-z][a-z0-9]*(-[a-z0-9]+)*$")

PluginT = TypeVar("PluginT", bound=Plugin)


class PolicyConfigError(ValueError):
    """A routing policy configuration that cannot be built; the message names the plugin."""


@dataclass(frozen=True, slots=True)
class PluginType:
    """A registered plugin type."""

    type_name: str
    kind: PluginKind
    parameters: type[Parameters]
    cls: type[Plugin]


_REGISTRY: dict[str, PluginType] = {}


def register(
    type_name: str, parameters: type[Parameters]
) -> Callable[[type[PluginT]], type[PluginT]]:
    """Class decorator registering a plugin type under `type_name` (kebab-case, unique)."""
    if not _KEBAB.match(type_name):
        raise ValueError(f"plugin type name {type_name!r} is not kebab-case")

    def decorate(cls: type[PluginT]) -> type[PluginT]:
        if type_name in _REGISTRY and _REGISTRY[type_name].cls is not cls:
            raise ValueError(f"plugin type {type_name!r} is already registered")
        cls.type_name = type_name
        _REGISTRY[type_name] = PluginType(type_name, cls.kind, parameters, cls)
        return cls

    return decorate


def known_types(kind: PluginKind | None = None) -> list[str]:
    """Registered type names (of one kind, if given), sorted."""
    return sorted(t.type_name for t in _REGISTRY.values() if kind is None or t.kind == kind)


def plugin_type(type_name: str, kind: PluginKind, plugin_name: str) -> PluginType:
    """The registered `type_name`, checked to be a `kind`; PolicyConfigError otherwise."""
    found = _REGISTRY.get(type_name)
    if found is None:
        raise PolicyConfigError(
            f"{kind} {plugin_name!r}: unknown type {type_name!r}; "
            f"known {kind} types: {', '.join(known_types(kind))}"
        )
    if found.kind != kind:
        raise PolicyConfigError(
            f"{kind} {plugin_name!r}: type {type_name!r} is a {found.kind}, not a {kind}; "
            f"known {kind} types: {', '.join(known_types(kind))}"
        )
    return found


def validate_parameters(
    found: PluginType, plugin_name: str, parameters: Mapping[str, Any]
) -> Parameters:
    """`parameters` validated by the type's model; PolicyConfigError naming the plugin."""
    try:
        return found.parameters.model_validate(dict(parameters))
    except ValidationError as exc:
        problems = "; ".join(
            f"{'.'.join(str(part) for part in error['loc']) or '(parameters)'}: {error['msg']}"
            for error in exc.errors()
        )
        raise PolicyConfigError(
            f"{found.kind} {plugin_name!r} (type {found.type_name!r}): bad parameters: {problems}"
        ) from None


def build_plugin(
    kind: PluginKind,
    name: str,
    type_name: str,
    parameters: Mapping[str, Any],
    context: PluginContext,
) -> Plugin:
    """A plugin instance from its configuration; PolicyConfigError naming it on any problem."""
    found = plugin_type(type_name, kind, name)
    validated = validate_parameters(found, name, parameters)
    return found.cls(name, validated, context)
