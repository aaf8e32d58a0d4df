"""`spec.autoscaling`: the CRD's schema and CEL rules and the pydantic model accept and refuse
the same specs, in the same words where a rule spans fields."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest
import yaml
from crd_helpers import generated_crd, problems, schema_of
from pydantic import ValidationError

from tiergate.common.validation import first_problem
from tiergate.pools import (
    DEFAULT_SCALE_DOWN_STABILIZATION_S,
    DEFAULT_TARGET_UTILIZATION,
    MIN_ABOVE_MAX,
    AutoscalingSpec,
    InferencePool,
    InferencePoolSpec,
)

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def crd() -> dict[str, Any]:
    return generated_crd()


def autoscaled(**autoscaling: Any) -> dict[str, Any]:
    """examples/batched.yaml with `spec.autoscaling` set to `autoscaling`."""
    obj = yaml.safe_load((ROOT / "examples" / "batched.yaml").read_text(encoding="utf-8"))
    obj = copy.deepcopy(obj)
    obj["spec"]["autoscaling"] = autoscaling
    return obj


def pydantic_problem(obj: dict[str, Any]) -> str | None:
    try:
        InferencePoolSpec.model_validate(obj["spec"])
    except ValidationError as exc:
        return first_problem(exc)
    return None


ACCEPTED = [
    {"minReplicas": 1, "maxReplicas": 4},
    {"minReplicas": 2, "maxReplicas": 2},
    {"minReplicas": 1, "maxReplicas": 1000, "targetUtilization": 1},
    {"minReplicas": 1, "maxReplicas": 4, "targetUtilization": 0.5, "scaleDownStabilizationS": 0},
    {"minReplicas": 1, "maxReplicas": 4, "scaleDownStabilizationS": 3600},
]

REFUSED = [
    ({"minReplicas": 5, "maxReplicas": 4}, MIN_ABOVE_MAX),
    ({"minReplicas": 0, "maxReplicas": 4}, "minReplicas"),
    ({"minReplicas": 1, "maxReplicas": 1001}, "maxReplicas"),
    ({"minReplicas": 1, "maxReplicas": 4, "targetUtilization": 0}, "targetUtilization"),
    ({"minReplicas": 1, "maxReplicas": 4, "targetUtilization": 1.5}, "targetUtilization"),
    ({"minReplicas": 1, "maxReplicas": 4, "scaleDownStabilizationS": -1}, "scaleDown"),
    ({"minReplicas": 1, "maxReplicas": 4, "scaleDownStabilizationS": 3601}, "scaleDown"),
    ({"maxReplicas": 4}, "minReplicas"),
    ({"minReplicas": 1}, "maxReplicas"),
]


@pytest.mark.parametrize("autoscaling", ACCEPTED, ids=str)
def test_sound_autoscaling_is_accepted_by_both(
    crd: dict[str, Any], autoscaling: dict[str, Any]
) -> None:
    obj = autoscaled(**autoscaling)
    assert problems(crd, obj) == []
    assert pydantic_problem(obj) is None


@pytest.mark.parametrize(("autoscaling", "word"), REFUSED, ids=str)
def test_bad_autoscaling_is_refused_by_both(
    crd: dict[str, Any], autoscaling: dict[str, Any], word: str
) -> None:
    obj = autoscaled(**autoscaling)
    found = problems(crd, obj)
    said = pydantic_problem(obj)
    assert found, "the API server would accept it"
    assert said is not None, "a pool file would accept it"
    assert word in said, said


def test_min_above_max_is_said_alike_by_cel_and_pydantic(crd: dict[str, Any]) -> None:
    obj = autoscaled(minReplicas=3, maxReplicas=2)
    assert problems(crd, obj) == [MIN_ABOVE_MAX]
    said = pydantic_problem(obj)
    assert said is not None and said.endswith(MIN_ABOVE_MAX), said
    assert said.startswith("autoscaling"), said  # names the field


def test_defaults_are_the_operators_and_stated_in_the_descriptions(crd: dict[str, Any]) -> None:
    spec = AutoscalingSpec(min_replicas=1, max_replicas=3)
    assert spec.utilization == DEFAULT_TARGET_UTILIZATION
    assert spec.stabilization_s == DEFAULT_SCALE_DOWN_STABILIZATION_S
    props = schema_of(crd)["properties"]["spec"]["properties"]["autoscaling"]["properties"]
    assert "default" not in props["targetUtilization"]
    assert f"Default: {DEFAULT_TARGET_UTILIZATION}" in props["targetUtilization"]["description"]
    assert (
        str(DEFAULT_SCALE_DOWN_STABILIZATION_S) in props["scaleDownStabilizationS"]["description"]
    )


def test_status_autoscaling_round_trips() -> None:
    obj = autoscaled(minReplicas=1, maxReplicas=4)
    obj["status"] = {
        "autoscaling": {
            "observedPods": 2,
            "observedRunning": 9,
            "observedWaiting": 1,
            "desiredReplicas": 3,
            "lastScaleTime": "2026-11-21T00:00:00Z",
            "lastScaleReason": "ScaledUp",
            "recommendations": [{"time": "2026-11-21T00:00:00Z", "replicas": 3}],
        },
        "conditions": [
            {"type": "Autoscaling", "status": "True", "reason": "ScaledUp",
             "message": "2 -> 3", "lastTransitionTime": "2026-11-21T00:00:00Z"},
        ],
    }  # fmt: skip
    pool = InferencePool.model_validate(obj)
    assert pool.status is not None and pool.status.autoscaling is not None
    assert pool.model_dump(by_alias=True, exclude_none=True)["status"] == obj["status"]
