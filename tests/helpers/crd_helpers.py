"""The InferencePool CRD as the API server validates it: the generated OpenAPI schema, then
its CEL rules (tests of the CRD and of anything that writes InferencePools use it)."""

from __future__ import annotations

import copy
from typing import Any

import celpy
import jsonschema
import yaml
from pydantic import ValidationError

from tiergate.common.validation import first_problem
from tiergate.operator.commands.crds_cmd import render
from tiergate.pools import InferencePoolSpec


def generated_crd() -> dict[str, Any]:
    """The CRD the API models generate."""
    loaded: dict[str, Any] = yaml.safe_load(render())
    return loaded


def schema_of(crd: dict[str, Any]) -> dict[str, Any]:
    return crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]


def walk(node: Any, path: str = "") -> list[tuple[str, dict[str, Any]]]:
    out = []
    if isinstance(node, dict):
        out.append((path, node))
        for key, sub in node.get("properties", {}).items():
            out += walk(sub, f"{path}.{key}")
        if "items" in node:
            out += walk(node["items"], f"{path}[]")
        if isinstance(node.get("additionalProperties"), dict):
            out += walk(node["additionalProperties"], f"{path}{{}}")
    return out


def _strip(node: Any) -> Any:
    if isinstance(node, dict):
        return {k: _strip(v) for k, v in node.items() if not k.startswith("x-kubernetes")}
    if isinstance(node, list):
        return [_strip(v) for v in node]
    return node


def problems(crd: dict[str, Any], obj: dict[str, Any]) -> list[str]:
    """What the API server would refuse `obj` for: schema errors, then failed CEL rules."""
    schema = schema_of(crd)
    validator = jsonschema.Draft4Validator(_strip(schema))  # OpenAPI 3.0 bounds are draft 4's
    found = [e.message for e in validator.iter_errors(obj)]
    env = celpy.Environment()
    for path, node in walk(schema):
        value: Any = obj
        for key in [p for p in path.split(".") if p]:
            value = value.get(key) if isinstance(value, dict) else None
        if value is None:
            continue
        for rule in node.get("x-kubernetes-validations", []):
            program = env.program(env.compile(rule["rule"]))
            try:
                held = program.evaluate({"self": celpy.json_to_cel(value)})
            except celpy.CELEvalError:
                # A field the rule reads is missing: the schema has refused the object already.
                assert found, f"CEL rule {rule['rule']!r} failed on a schema-valid object"
                continue
            if not held:
                found.append(rule["message"])
    return found


def pydantic_says(obj: dict[str, Any]) -> str | None:
    """What the API models say of a pool's spec (the CRD's rules in words), or None."""
    try:
        InferencePoolSpec.model_validate(copy.deepcopy(obj["spec"]))
    except ValidationError as exc:
        return first_problem(exc)
    return None


def assert_refused_alike(said: str | None, found: list[str], expected: str | None) -> None:
    """What a pool file (`said`: pydantic's first problem) and `kubectl apply` (`found`: the
    CRD's) say of one pool: both nothing, or both the `expected` sentence."""
    if expected is None:
        assert said is None, said
        assert found == [], found
    else:
        assert said is not None and said.endswith(expected), said
        assert expected in found, found
