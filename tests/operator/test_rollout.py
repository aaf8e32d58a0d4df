"""spec.rollout: how a pool's pods are replaced. Pool files (pydantic) and `kubectl apply` (the
CRD's CEL rules) refuse the same values with the same sentence; the pool's Deployment gets the
rolling update it says, and nothing when it says nothing (Kubernetes' defaults)."""

from __future__ import annotations

from typing import Any

import pytest
from crd_helpers import assert_refused_alike, generated_crd, problems, pydantic_says

from tiergate.operator.render import deployment_manifest
from tiergate.operator.status import assess
from tiergate.pools import InferencePoolSpec
from tiergate.pools.rollout import ROLLOUT_STANDS_STILL, ROLLOUT_VALUE
from tiergate.sim_nodes.catalogs import default_catalog


@pytest.fixture(scope="module")
def crd() -> dict[str, Any]:
    return generated_crd()


def pool(**rollout: Any) -> dict[str, Any]:
    return {
        "apiVersion": "tiergate.dev/v1alpha1",
        "kind": "InferencePool",
        "metadata": {"name": "p"},
        "spec": {"tier": "batched", "model": "llama-3.1-8b", "accelerator": "h100-sxm",
                 "rollout": rollout},
    }  # fmt: skip


CASES: list[tuple[str, dict[str, Any], str | None]] = [
    ("in place, one at a time", pool(maxSurge=0, maxUnavailable=1), None),
    ("percents", pool(maxSurge="0%", maxUnavailable="100%"), None),
    ("surge only", pool(maxSurge=2), None),
    ("no surge, unavailable left to Kubernetes (25%)", pool(maxSurge=0), None),
    ("nothing said", pool(), None),
    ("both 0", pool(maxSurge=0, maxUnavailable=0), ROLLOUT_STANDS_STILL),
    ("both 0%", pool(maxSurge="0%", maxUnavailable="0%"), ROLLOUT_STANDS_STILL),
    ("0 and 0%", pool(maxSurge=0, maxUnavailable="0%"), ROLLOUT_STANDS_STILL),
    ("negative", pool(maxSurge=-1), ROLLOUT_VALUE),
    ("past int32", pool(maxUnavailable=2**31), ROLLOUT_VALUE),
    ("over 100%", pool(maxUnavailable="101%"), ROLLOUT_VALUE),
    ("a fraction of a percent", pool(maxSurge="2.5%"), ROLLOUT_VALUE),
    ("a number written as a string", pool(maxSurge="1"), ROLLOUT_VALUE),
    ("a leading zero", pool(maxSurge="05%"), ROLLOUT_VALUE),
]


@pytest.mark.parametrize(("obj", "expected"), [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_pool_files_and_kubectl_apply_refuse_the_same_rollouts_alike(
    crd: dict[str, Any], obj: dict[str, Any], expected: str | None
) -> None:
    assert_refused_alike(pydantic_says(obj), problems(crd, obj), expected)


def deployment(**spec: Any) -> dict[str, Any]:
    parsed = InferencePoolSpec.model_validate(
        {"tier": "batched", "model": "llama-3.1-8b", "accelerator": "h100-sxm", **spec}
    )
    layout = assess(parsed, default_catalog()).layout
    assert layout is not None
    return deployment_manifest("p", "ns", parsed, "img", layout)["spec"]


def test_the_deployment_rolls_out_as_the_pool_says() -> None:
    in_place = deployment(engine="vllm", rollout={"maxSurge": 0, "maxUnavailable": 1})
    assert in_place["strategy"] == {
        "type": "RollingUpdate",
        "rollingUpdate": {"maxSurge": 0, "maxUnavailable": 1},
    }
    surge = deployment(rollout={"maxSurge": "50%"})
    assert surge["strategy"] == {"type": "RollingUpdate", "rollingUpdate": {"maxSurge": "50%"}}
    # Said nothing: nothing applied, so Kubernetes' defaults hold (and a rollout the pool
    # stops saying goes back to them: the operator's apply no longer owns the field).
    assert "strategy" not in deployment()
    assert "strategy" not in deployment(rollout=None)
