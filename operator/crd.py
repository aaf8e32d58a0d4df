"""The InferencePool CustomResourceDefinition, generated from the pydantic models.

`inference_pool_crd(catalog)` turns `InferencePool`'s JSON schema into the *structural*
OpenAPI v3 schema the API server wants: every `$ref` inlined, `Optional[X]` as an optional X,
`int | "auto"` as int-or-string with a CEL rule, JSON-Schema-2020 exclusive bounds in their
OpenAPI 3.0 form, no titles, defaults stated in descriptions (the operator applies them, so a
stored object never changes meaning when a default does), except `replicas: 1`, which the scale
subresource needs in the object. The pool's name is checked too: it names a Service. Rules
the schema alone cannot state are CEL `x-kubernetes-validations`, each with a message a person
understands; the list of SRAM accelerators comes from the catalog (an inline
`acceleratorProfile` is checked by its own `memoryKind` instead), and inline profiles get the
cross-field checks of their pydantic models that are cheap to state in CEL.

`tiergate crds` writes the result; tests fail when the committed YAML differs.
"""

from __future__ import annotations

import json
from typing import Any

from tiergate.common.tiers import DEFINITIONS, batch_cap_problem
from tiergate.pools import (
    ENGINES,
    GROUP,
    KIND,
    MIN_ABOVE_MAX,
    NAME_MAX,
    PLURAL,
    POOL_NAME,
    POOL_NAME_INVALID,
    POOL_NAME_TOO_LONG,
    VERSION,
    InferencePool,
    InferencePoolSpec,
)
from tiergate.pools.engines import (
    COMMAND_LINE_FIELDS,
    kv_dtype_problem,
    memory_kind_problem,
    models_with_weights,
    option_like_problem,
    weight_dtype_problem,
    weights_problem,
)
from tiergate.pools.hosted import (
    HOSTED_URL_PATTERN,
    HOSTED_URL_PROBLEM,
    POD_FIELDS,
    needs_accelerator_problem,
    needs_billing_problem,
    needs_context_problem,
    needs_secret_problem,
    pod_field_problem,
)
from tiergate.pools.rollout import MOST_PODS, PERCENT, ROLLOUT_STANDS_STILL, ROLLOUT_VALUE
from tiergate.sim_nodes.catalogs import Catalog
from tiergate.sim_nodes.tier_rules import accelerators_with, memory_problem

__all__ = [
    "engine_rules",
    "hosted_rules",
    "inference_pool_crd",
    "spec_rules",
    "structural",
    "tier_rules",
]

Schema = dict[str, Any]


def _resolve(node: Any, defs: Schema) -> Any:
    if isinstance(node, dict):
        if "$ref" in node:
            target = defs[node["$ref"].rsplit("/", 1)[-1]]
            merged = {**_resolve(target, defs), **{k: v for k, v in node.items() if k != "$ref"}}
            return _resolve(merged, defs)
        return {k: _resolve(v, defs) for k, v in node.items()}
    if isinstance(node, list):
        return [_resolve(v, defs) for v in node]
    return node


def _default_text(value: Any) -> str | None:
    if value is None or value == [] or value == {}:
        return None
    return json.dumps(value) if not isinstance(value, str) else value


def structural(node: Schema) -> Schema:
    """One pydantic (JSON Schema 2020) node, `$ref`s already resolved, as structural OpenAPI."""
    out: Schema = {}
    variants = node.get("anyOf")
    if variants is not None:
        kept = [v for v in variants if v.get("type") != "null"]
        if len(kept) == 1:  # Optional[X]: optional in the object, never null on the wire
            inner = structural(kept[0])
            out.update(inner)
        elif {v.get("type") for v in kept} == {"integer", "string"}:
            out["x-kubernetes-int-or-string"] = True
        else:
            raise ValueError(f"no structural form for anyOf {variants}")
    if "type" in node:
        out["type"] = node["type"]
    if "const" in node:
        out["enum"] = [node["const"]]
    for key in ("enum", "minimum", "maximum", "pattern", "maxLength", "minLength", "format"):
        if key in node:
            out[key] = node[key]
    for key, base in (("exclusiveMinimum", "minimum"), ("exclusiveMaximum", "maximum")):
        if key in node:
            out[base], out[key] = node[key], True
    if node.get("type") == "object" or "properties" in node:
        out["type"] = "object"
        props = node.get("properties", {})
        if props:
            out["properties"] = {name: structural(sub) for name, sub in props.items()}
        extra = node.get("additionalProperties")
        if isinstance(extra, dict):
            out["additionalProperties"] = structural(extra)
        if node.get("required"):
            out["required"] = list(node["required"])
    if node.get("type") == "array":
        out["items"] = structural(node["items"])
    description = node.get("description")
    default = _default_text(node.get("default"))
    if default is not None and description:
        description = f"{description.rstrip('.')}. Default: {default}."
    if description:
        out["description"] = " ".join(description.split())
    return out  # built from chosen keys only: titles and defaults never get in


def spec_rules(catalog: Catalog) -> list[Schema]:
    """CEL rules on `spec` that span fields (the API server evaluates them on apply)."""
    return [
        *hosted_rules(catalog),
        *tier_rules(catalog),
        *engine_rules(catalog),
        *(
            {
                "rule": f"!has(self.{field}) || !has(self.{key}) || "
                f"self.{field}.name == self.{key}",
                "message": (
                    f"spec.{field}.name must equal spec.{key} "
                    "(the name the profile is registered under)"
                ),
                "fieldPath": f".{field}.name",
            }
            for field, key in (("modelProfile", "model"), ("acceleratorProfile", "accelerator"))
        ),
        {
            "rule": (
                "!has(self.tensorParallel) || !has(self.chips) || type(self.chips) != int || "
                "int(self.chips) % self.tensorParallel == 0"
            ),
            "message": "spec.tensorParallel must divide spec.chips",
            "fieldPath": ".tensorParallel",
        },
    ]


def hosted_rules(catalog: Catalog) -> list[Schema]:
    """A pool names its hardware or a hosted API (tiergate/pools/hosted.py), as CEL with the
    sentences pool files give."""
    listed = ", ".join(f"'{name}'" for name in sorted(catalog.models))
    return [
        {
            "rule": "has(self.endpoint) || has(self.accelerator)",
            "message": needs_accelerator_problem(),
            "fieldPath": ".accelerator",
        },
        *(
            {
                "rule": f"!has(self.endpoint) || !has(self.{field})",
                "message": pod_field_problem(field),
                "fieldPath": f".{field}",
            }
            for field in POD_FIELDS
        ),
        {
            "rule": "!has(self.endpoint) || "
            "(has(self.billing) && has(self.billing.outputPerMillionUsd))",
            "message": needs_billing_problem(),
            "fieldPath": ".billing",
        },
        {
            "rule": "!has(self.endpoint) || has(self.endpoint.maxContextTokens) || "
            f"self.model in [{listed}]",
            "message": needs_context_problem(catalog),
            "fieldPath": ".endpoint.maxContextTokens",
        },
    ]


#: Rules on spec.endpoint itself.
ENDPOINT_RULES: list[Schema] = [
    {
        # A raw string: CEL's quoted strings have no \s escape (the API server refuses it).
        "rule": f"self.url.matches(r'{HOSTED_URL_PATTERN}')",
        "message": HOSTED_URL_PROBLEM,
        "fieldPath": ".url",
    },
    {
        "rule": "has(self.apiKeySecretRef)",
        "message": needs_secret_problem(),
        "fieldPath": ".apiKeySecretRef",
    },
]


def tier_rules(catalog: Catalog) -> list[Schema]:
    """Each tier's rules (tiergate/common/tiers.py) as CEL, with the sentences pool files give. A
    hosted pool's hardware is the provider's business: no tier rule applies to it."""
    rules: list[Schema] = []
    for tier in DEFINITIONS.values():
        unless = f"has(self.endpoint) || self.tier != '{tier.name}' || "
        if tier.max_num_seqs is not None:
            rules.append(
                {
                    "rule": unless + "(has(self.batching) && has(self.batching.maxNumSeqs) && "
                    f"self.batching.maxNumSeqs <= {tier.max_num_seqs})",
                    "message": batch_cap_problem(tier.name),
                    "fieldPath": ".batching.maxNumSeqs",
                }
            )
        kind = tier.memory_kind
        if kind is not None:
            listed = ", ".join(f"'{name}'" for name in accelerators_with(catalog, kind))
            rules.append(
                {
                    "rule": unless + f"(has(self.acceleratorProfile) ? "
                    f"self.acceleratorProfile.memoryKind == '{kind}' : "
                    f"self.accelerator in [{listed}])",
                    "message": memory_problem(tier.name, catalog),
                    "fieldPath": ".accelerator",
                }
            )
    return rules


def engine_rules(catalog: Catalog) -> list[Schema]:
    """Each engine's rules (tiergate/pools/engines.py) as CEL, with the sentences pool files
    give."""
    rules: list[Schema] = []
    for engine in ENGINES.values():
        # spec.engine's default (sim) is the operator's to apply: absent means sim.
        unless = f"!has(self.engine) || self.engine != '{engine.name}' || "
        kind = engine.memory_kind
        if kind is not None:
            listed = ", ".join(f"'{name}'" for name in accelerators_with(catalog, kind))
            rules.append(
                {
                    "rule": unless + "(has(self.acceleratorProfile) ? "
                    f"self.acceleratorProfile.memoryKind == '{kind}' : "
                    f"self.accelerator in [{listed}])",
                    "message": memory_kind_problem(engine.name, catalog),
                    "fieldPath": ".engine",
                }
            )
        if engine.loads_weights:
            listed = ", ".join(f"'{name}'" for name in models_with_weights(catalog))
            rules.append(
                {
                    "rule": unless + "((has(self.modelSource) || (has(self.modelProfile) ? "
                    f"has(self.modelProfile.huggingFaceId) : self.model in [{listed}])) && "
                    "(!has(self.speculativeDecoding) || "
                    f"self.speculativeDecoding.draftModel in [{listed}]))",
                    "message": weights_problem(engine.name, catalog),
                    "fieldPath": ".model",
                }
            )
        if engine.weight_dtypes is not None:
            listed = ", ".join(f"'{d}'" for d in engine.weight_dtypes)
            rules.append(
                {
                    "rule": unless + "has(self.modelSource) || !has(self.weightDtype) || "
                    f"self.weightDtype in [{listed}]",
                    "message": weight_dtype_problem(engine.name),
                    "fieldPath": ".weightDtype",
                }
            )
        if engine.kv_dtypes is not None:
            listed = ", ".join(f"'{d}'" for d in engine.kv_dtypes)
            rules.append(
                {
                    "rule": unless + f"!has(self.kvDtype) || self.kvDtype in [{listed}]",
                    "message": kv_dtype_problem(engine.name),
                    "fieldPath": ".kvDtype",
                }
            )
    return rules


#: The checks of `ModelProfile` / `Accelerator` validators worth failing `kubectl apply` for
#: (the operator still runs the full validation and reports the rest as InvalidSpec).
MODEL_PROFILE_RULES: list[Schema] = [
    {
        "rule": "self.heads % self.kvHeads == 0",
        "message": "modelProfile.heads must be a multiple of modelProfile.kvHeads",
        "fieldPath": ".kvHeads",
    },
    {
        # double(): a whole number in YAML must compare like the fraction it stands for
        "rule": "double(self.activeParamsB) <= double(self.totalParamsB)",
        "message": "modelProfile.activeParamsB must not exceed modelProfile.totalParamsB",
        "fieldPath": ".activeParamsB",
    },
]
ACCELERATOR_PROFILE_RULES: list[Schema] = [
    {
        "rule": "'bf16' in self.peakTflops",
        "message": "acceleratorProfile.peakTflops needs a bf16 entry",
        "fieldPath": ".peakTflops",
    },
]

AUTOSCALING_RULES: list[Schema] = [
    {
        "rule": "self.minReplicas <= self.maxReplicas",
        "message": MIN_ABOVE_MAX,
        "fieldPath": ".minReplicas",
    },
]

#: spec.rollout's fields (int-or-string: the schema says no more) and the pair.
_ROLLOUT_FIELD_RULE = {
    "rule": f"type(self) == int ? int(self) >= 0 && int(self) <= {MOST_PODS} : "
    f"string(self).matches('{PERCENT}')",
    "message": ROLLOUT_VALUE,
}
_ROLLOUT_RULES: list[Schema] = [
    {
        "rule": "!(has(self.maxSurge) && has(self.maxUnavailable) && "
        + " && ".join(
            f"(type(self.{f}) == int ? int(self.{f}) == 0 : string(self.{f}) == '0%')"
            for f in ("maxSurge", "maxUnavailable")
        )
        + ")",
        "message": ROLLOUT_STANDS_STILL,
    }
]

_CHIPS_RULE = {
    "rule": "type(self) == int ? int(self) >= 1 : self == 'auto'",
    "message": 'chips must be a positive integer or "auto"',
}


def _command_line_rules(props: Schema) -> None:
    """A rule on each of COMMAND_LINE_FIELDS (on each item of a list): no leading '-'. On the
    items rather than `self.all(...)` on the list, which the API server would cost as a
    list of unbounded length and refuse."""
    for field in COMMAND_LINE_FIELDS:
        *parents, last = field.split(".")
        node = props
        for parent in parents:
            node = node[parent]["properties"]
        target = node[last]
        if target.get("type") == "array":
            target = target["items"]
        target.setdefault("x-kubernetes-validations", []).append(
            {"rule": "!self.startsWith('-')", "message": option_like_problem(field)}
        )


def _spec_schema(catalog: Catalog, schema: Schema) -> Schema:
    spec: Schema = schema["properties"]["spec"]
    props = spec["properties"]
    props["chips"]["x-kubernetes-validations"] = [_CHIPS_RULE]
    props["modelProfile"]["x-kubernetes-validations"] = MODEL_PROFILE_RULES
    props["acceleratorProfile"]["x-kubernetes-validations"] = ACCELERATOR_PROFILE_RULES
    props["autoscaling"]["x-kubernetes-validations"] = AUTOSCALING_RULES
    props["endpoint"]["x-kubernetes-validations"] = ENDPOINT_RULES
    rollout = props["rollout"]
    rollout["x-kubernetes-validations"] = _ROLLOUT_RULES
    for field in ("maxSurge", "maxUnavailable"):
        rollout["properties"][field]["x-kubernetes-validations"] = [_ROLLOUT_FIELD_RULE]
    _command_line_rules(props)
    spec["x-kubernetes-validations"] = spec_rules(catalog)
    # The one default the schema states: the scale subresource (kubectl scale, an HPA) reads
    # .spec.replicas and fails on a pool that left it out.
    props["replicas"]["default"] = InferencePoolSpec.model_fields["replicas"].default
    return spec


#: The pool's name becomes its Deployment's and Service's, and a label value: a Service name
#: is a DNS-1035 label (a letter first, at most 63 characters). Refused here, at apply, rather
#: than by the operator's apply of the Service, long after the pool was accepted.
NAME_RULES = [
    {"rule": f"self.metadata.name.size() <= {NAME_MAX}", "message": POOL_NAME_TOO_LONG},
    {"rule": f"self.metadata.name.matches('{POOL_NAME}')", "message": POOL_NAME_INVALID},
]


def _status_schema(schema: Schema) -> Schema:
    status: Schema = schema["properties"]["status"]
    conditions = status["properties"]["conditions"]
    conditions["x-kubernetes-list-type"] = "map"
    conditions["x-kubernetes-list-map-keys"] = ["type"]
    return status


def inference_pool_crd(catalog: Catalog) -> Schema:
    """The whole CRD object, ready to dump as YAML."""
    raw = InferencePool.model_json_schema(by_alias=True)
    resolved = _resolve({k: v for k, v in raw.items() if k != "$defs"}, raw.get("$defs", {}))
    schema = structural(resolved)
    root: Schema = {
        "type": "object",
        "description": schema["description"],
        "properties": {
            "apiVersion": {"type": "string", "description": "tiergate.dev/v1alpha1"},
            "kind": {"type": "string", "description": KIND},
            "metadata": {"type": "object"},
            "spec": _spec_schema(catalog, schema),
            "status": _status_schema(schema),
        },
        "required": ["spec"],
        "x-kubernetes-validations": NAME_RULES,
    }
    columns = [
        ("Tier", "string", ".spec.tier", 0),
        ("Model", "string", ".spec.model", 0),
        ("Accelerator", "string", ".spec.accelerator", 0),
        ("Replicas", "integer", ".spec.replicas", 0),
        ("Ready", "integer", ".status.readyReplicas", 0),
        ("Tok/s", "number", ".status.envelope.tokensPerSecondPerStream", 0),
        ("$/Mtok", "number", ".status.envelope.costPerMillionOutputTokensUSD", 0),
        ("Billed$/Mtok", "number", ".status.billed.outputPerMillionUsd", 0),
        ("Age", "date", ".metadata.creationTimestamp", 0),
        ("Status", "string", '.status.conditions[?(@.type=="Ready")].reason', 0),
        ("ModelProfile", "string", ".status.envelope.modelSource", 1),
        ("AcceleratorProfile", "string", ".status.envelope.acceleratorSource", 1),
        ("Desired", "integer", ".status.autoscaling.desiredReplicas", 1),
    ]
    return {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {
            "name": f"{PLURAL}.{GROUP}",
            "labels": {"app.kubernetes.io/part-of": "tiergate"},
        },
        "spec": {
            "group": GROUP,
            "scope": "Namespaced",
            "names": {
                "kind": KIND,
                "listKind": f"{KIND}List",
                "plural": PLURAL,
                "singular": KIND.lower(),
                "shortNames": ["ipool"],
                "categories": ["tiergate"],
            },
            "versions": [
                {
                    "name": VERSION,
                    "served": True,
                    "storage": True,
                    "schema": {"openAPIV3Schema": root},
                    "subresources": {
                        "status": {},
                        "scale": {
                            "specReplicasPath": ".spec.replicas",
                            "statusReplicasPath": ".status.replicas",
                            "labelSelectorPath": ".status.selector",
                        },
                    },
                    "additionalPrinterColumns": [
                        {"name": n, "type": t, "jsonPath": p, **({"priority": pr} if pr else {})}
                        for n, t, p, pr in columns
                    ],
                }
            ],
        },
    }
