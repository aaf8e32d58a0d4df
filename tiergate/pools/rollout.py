"""`spec.rollout` of an InferencePool: how its pods are replaced when what they run changes.

The operator writes it into the pool's Deployment as its rolling update (`maxSurge`,
`maxUnavailable`); left out, Kubernetes' defaults hold (25% each: a one-replica pool starts its
new pod beside the old one and stops the old one once the new one is ready). A GPU pool on
nodes with no spare accelerator never gets that extra pod scheduled: `maxSurge: 0` with
`maxUnavailable: 1` replaces its pods one at a time in place, a replica short meanwhile.
Changing it restarts no pod.
"""

from __future__ import annotations

import re
from typing import Annotated, Any

from pydantic import BeforeValidator, Field, WithJsonSchema, model_validator
from pydantic_core import PydanticCustomError

from .base import Api

__all__ = [
    "MOST_PODS",
    "PERCENT",
    "ROLLOUT_STANDS_STILL",
    "ROLLOUT_VALUE",
    "RolloutSpec",
    "is_zero",
]

#: A share of spec.replicas, as a Deployment takes it: a whole percent from 0% to 100%.
PERCENT = r"^(100|[1-9]?[0-9])%$"
#: Said alike by the CRD's CEL rules and the pydantic model.
ROLLOUT_VALUE = (
    "a number of pods (0 or more) or a percent of spec.replicas (0% to 100%), e.g. 1 or 25%"
)
ROLLOUT_STANDS_STILL = (
    "spec.rollout: maxSurge and maxUnavailable cannot both be 0: a rollout could replace no pod"
)
#: A Deployment's counts are int32.
MOST_PODS = 2**31 - 1


def _pods_or_percent(value: Any) -> int | str:
    if isinstance(value, bool) or not isinstance(value, (int, str)):
        raise PydanticCustomError("rollout_value", ROLLOUT_VALUE)
    if isinstance(value, int) and not 0 <= value <= MOST_PODS:
        raise PydanticCustomError("rollout_value", ROLLOUT_VALUE)
    if isinstance(value, str) and re.fullmatch(PERCENT, value) is None:
        raise PydanticCustomError("rollout_value", ROLLOUT_VALUE)
    return value


PodsOrPercent = Annotated[
    int | str,
    BeforeValidator(_pods_or_percent),
    WithJsonSchema({"anyOf": [{"type": "integer"}, {"type": "string"}]}),
]


def is_zero(value: int | str | None) -> bool:
    """Whether a set maxSurge or maxUnavailable lets no pod through (0, 0%)."""
    return value == 0 or value == "0%"


class RolloutSpec(Api):
    """How the pool's pods are replaced when what they run changes (the Deployment's
    rolling update)."""

    max_surge: PodsOrPercent | None = Field(
        default=None,
        description="Pods a rollout may start beyond spec.replicas: a number, or a percent of "
        "spec.replicas rounded up. Kubernetes' default: 25%. 0 where no node has a spare "
        "accelerator for the extra pod.",
    )
    max_unavailable: PodsOrPercent | None = Field(
        default=None,
        description="Pods a rollout may stop before their replacements are ready: a number, or "
        "a percent of spec.replicas rounded down. Kubernetes' default: 25%. With maxSurge 0, "
        "1 replaces the pods one at a time.",
    )

    @model_validator(mode="after")
    def _moves(self) -> RolloutSpec:
        if is_zero(self.max_surge) and is_zero(self.max_unavailable):
            raise PydanticCustomError("rollout_rule", ROLLOUT_STANDS_STILL)
        return self

    def strategy(self) -> dict[str, Any]:
        """The Deployment's `strategy`, with the fields set (the others Kubernetes' own)."""
        update = self.model_dump(by_alias=True, exclude_none=True)
        return {"type": "RollingUpdate", "rollingUpdate": update}
