"""Hosted pools' rules: a pool names its hardware or a hosted API, a hosted pool states its
price and names none of the pods' fields. Pool files (pydantic) and `kubectl apply` (the CRD's
CEL rules) refuse the same pools with the same sentence."""

from __future__ import annotations

import copy
from typing import Any

import pytest
from crd_helpers import assert_refused_alike, generated_crd, problems, schema_of
from pydantic import ValidationError

from tiergate.common.validation import first_problem
from tiergate.pools import InferencePoolSpec
from tiergate.pools.hosted import (
    HOSTED_URL_PROBLEM,
    POD_FIELDS,
    needs_accelerator_problem,
    needs_billing_problem,
    needs_context_problem,
    needs_secret_problem,
    pod_field_problem,
)
from tiergate.sim_nodes.catalogs import default_catalog

CATALOG = default_catalog()
ENDPOINT = {
    "url": "https://api.example.com/v1",
    "model": "provider-model",
    "apiKeySecretRef": {"name": "provider", "key": "api-key"},
}
BILLING = {"outputPerMillionUsd": 2.5, "inputPerMillionUsd": 0.5}


@pytest.fixture(scope="module")
def crd() -> dict[str, Any]:
    return generated_crd()


def pool(**spec: Any) -> dict[str, Any]:
    return {
        "apiVersion": "tiergate.dev/v1alpha1",
        "kind": "InferencePool",
        "metadata": {"name": "p"},
        "spec": {"tier": "batched", "model": "llama-3.1-8b", **spec},
    }


def hosted(**spec: Any) -> dict[str, Any]:
    return pool(**{"endpoint": ENDPOINT, "billing": BILLING, **spec})


POD_FIELD_VALUES: dict[str, Any] = {
    "accelerator": "h100-sxm",
    "chips": 1,
    "tensorParallel": 1,
    "weightDtype": "fp8",
    "kvDtype": "fp8",
    "batching": {"maxNumSeqs": 8},
    "engine": "sim",
    "modelSource": "/w",
    "template": {"image": "x"},
    "rollout": {"maxSurge": 0},
    "slo": {"ttftMs": 100},
    "workload": {"outputTokens": 10},
    "huggingFaceTokenSecretRef": {"name": "hf", "key": "token"},
}

CASES: list[tuple[str, dict[str, Any], str | None]] = [
    ("hosted", hosted(), None),
    ("hosted on the wafer-scale tier", hosted(tier="wafer-scale"), None),
    ("hosted premium, no batch cap", hosted(tier="premium"), None),
    ("no accelerator, no endpoint", pool(), needs_accelerator_problem()),
    ("hosted without billing", pool(endpoint=ENDPOINT), needs_billing_problem()),
    ("hosted with only an input price",
     pool(endpoint=ENDPOINT, billing={"inputPerMillionUsd": 1}), needs_billing_problem()),
    ("hosted without a key", hosted(endpoint={**ENDPOINT, "apiKeySecretRef": None}),
     needs_secret_problem()),
    ("hosted model not in the catalog", hosted(model="gpt-x"), needs_context_problem(CATALOG)),
    ("hosted model not in the catalog, context given",
     hosted(model="gpt-x", endpoint={**ENDPOINT, "maxContextTokens": 128000}), None),
    ("ftp url", hosted(endpoint={**ENDPOINT, "url": "ftp://api.example.com"}),
     HOSTED_URL_PROBLEM),
    ("url with credentials",
     hosted(endpoint={**ENDPOINT, "url": "https://user:pw@api.example.com/v1"}),
     HOSTED_URL_PROBLEM),
    ("url with a query", hosted(endpoint={**ENDPOINT, "url": "https://api.example.com/v1?a=b"}),
     HOSTED_URL_PROBLEM),
    *(
        (f"hosted with {field}", hosted(**{field: value}), pod_field_problem(field))
        for field, value in POD_FIELD_VALUES.items()
    ),
]  # fmt: skip


def pydantic_says(obj: dict[str, Any]) -> str | None:
    spec = {k: v for k, v in copy.deepcopy(obj["spec"]).items()}
    if isinstance(spec.get("endpoint"), dict):
        spec["endpoint"] = {k: v for k, v in spec["endpoint"].items() if v is not None}
    try:
        InferencePoolSpec.model_validate(spec)
    except ValidationError as exc:
        return first_problem(exc)
    return None


def kubectl_says(crd: dict[str, Any], obj: dict[str, Any]) -> list[str]:
    obj = copy.deepcopy(obj)
    endpoint = obj["spec"].get("endpoint")
    if isinstance(endpoint, dict):
        obj["spec"]["endpoint"] = {k: v for k, v in endpoint.items() if v is not None}
    return problems(crd, obj)


@pytest.mark.parametrize(("obj", "expected"), [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_pool_files_and_kubectl_apply_refuse_the_same_hosted_pools_alike(
    crd: dict[str, Any], obj: dict[str, Any], expected: str | None
) -> None:
    assert_refused_alike(pydantic_says(obj), kubectl_says(crd, obj), expected)


def test_every_pod_field_is_refused_beside_an_endpoint(crd: dict[str, Any]) -> None:
    spec = schema_of(crd)["properties"]["spec"]
    stated = {r["message"] for r in spec["x-kubernetes-validations"]}
    for field in POD_FIELDS:
        assert field in spec["properties"], field  # a field that exists
        assert pod_field_problem(field) in stated, field
    assert set(POD_FIELDS) | {"tier", "model", "servedModelName", "aliases", "replicas",
                              "endpoint", "billing"} == set(spec["properties"])  # fmt: skip


def test_a_hosted_pool_is_described_by_its_endpoint() -> None:
    spec = InferencePoolSpec.model_validate(hosted(servedModelName="chat")["spec"])
    assert spec.hosted and spec.endpoint is not None
    assert spec.endpoint.url == "https://api.example.com/v1"
    assert spec.billing.output_per_million_usd == 2.5
    assert spec.names == ("chat",)
