"""Who set a pool's Deployment's replicas besides the operator.

The operator applies each pool's Deployment with server-side apply, `spec.replicas` included,
and applies it again whenever the Deployment changes. A HorizontalPodAutoscaler aimed at the
Deployment (not the pool), or `kubectl scale deployment`, then fights it: each sets the
replicas, the operator sets them back a moment later, and pods start and stop for nothing.

The API server records who last set each field (`metadata.managedFields`), so the operator
can tell: an entry of another manager owning `f:spec.f:replicas`, written no earlier than the
operator's own apply, set them since. (The operator's forced apply takes the field back, so
the entry loses it until the next override.)
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from tiergate.pools import API_VERSION, KIND

from .render import FIELD_MANAGER

__all__ = ["ReplicasOverride", "replicas_override"]


@dataclass(frozen=True, slots=True)
class ReplicasOverride:
    """Another manager set the replicas of a pool's Deployment: who, through what, when;
    and what the operator set them back to."""

    manager: str
    subresource: str | None  # "scale": through the scale subresource (HPAs, kubectl scale)
    time: str  # as the API server wrote it ("" when it did not)
    pool: str
    replicas: int  # the pool's spec.replicas

    @property
    def message(self) -> str:
        pool, replicas = self.pool, self.replicas
        how = f" through its {self.subresource} subresource" if self.subresource else ""
        return (
            f"{self.manager} set Deployment {pool}'s replicas{how}; the operator keeps them "
            f"at the pool's spec.replicas ({replicas}) and set them back. Scale the "
            f"InferencePool instead: kubectl scale inferencepool/{pool} --replicas=N, "
            "spec.autoscaling, or a HorizontalPodAutoscaler whose scaleTargetRef is the pool "
            f"(kind {KIND}, apiVersion {API_VERSION})"
        )


def replicas_override(
    deployment: Mapping[str, Any] | None, pool: str, replicas: int
) -> ReplicasOverride | None:
    """The latest manager other than the operator that set the replicas of `pool`'s
    Deployment (`deployment`: its metadata) no earlier than the operator's last apply did;
    None: none. `replicas`: the pool's spec.replicas, which the operator applies."""
    if not deployment:
        return None
    own_time = ""
    others: list[ReplicasOverride] = []
    for entry in deployment.get("managedFields") or []:
        if not isinstance(entry, Mapping) or not _sets_replicas(entry):
            continue
        manager, time = str(entry.get("manager") or "(unnamed)"), str(entry.get("time") or "")
        if manager == FIELD_MANAGER:
            own_time = max(own_time, time)
            continue
        subresource = entry.get("subresource")
        how = str(subresource) if subresource else None
        others.append(ReplicasOverride(manager, how, time, pool, replicas))
    # RFC 3339 times in UTC, as the API server writes them, order as strings.
    later = [o for o in others if o.time >= own_time]
    return max(later, key=lambda o: o.time) if later else None


def _sets_replicas(entry: Mapping[str, Any]) -> bool:
    spec = (entry.get("fieldsV1") or {}).get("f:spec")
    return isinstance(spec, Mapping) and "f:replicas" in spec
