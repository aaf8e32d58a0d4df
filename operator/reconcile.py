"""One reconciliation of one InferencePool: spec in, objects applied, status out.

Level-based: `reconcile` looks only at the pool as it is now and the cluster as it is now, so
running it again (a timer does, and kopf does after a restart) converges to the same objects
and the same status. The handlers are thin wrappers around it.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from pydantic import ValidationError

from tiergate.sim_nodes.catalogs import Catalog
from tiergate.sim_nodes.validation import first_problem

from .api import Condition, InferencePoolSpec, label_selector, pool_selector_labels
from .kube import Cluster
from .render import deployment_manifest, service_manifest
from .status import (
    Assessment,
    ConditionValue,
    assess,
    conditions,
    fits_message,
    replica_conditions,
)

__all__ = ["Outcome", "owner_reference", "reconcile"]

log = logging.getLogger("tiergate.operator")

Manifest = dict[str, Any]


@dataclass
class Outcome:
    """What a reconciliation decided: the status to write and what to tell people."""

    status: Manifest
    warnings: list[tuple[str, str]] = field(default_factory=list)  # (reason, message) events
    permanent_error: str | None = None  # the spec is wrong: retrying cannot help


def owner_reference(body: Manifest) -> Manifest:
    meta = body["metadata"]
    return {
        "apiVersion": body["apiVersion"],
        "kind": body["kind"],
        "name": meta["name"],
        "uid": meta["uid"],
        "controller": True,
        "blockOwnerDeletion": True,
    }


def _status(
    body: Manifest,
    values: dict[Any, ConditionValue],
    now: str,
    **fields: Any,
) -> Manifest:
    old = body.get("status") or {}
    previous = []
    for raw in old.get("conditions") or []:
        try:
            previous.append(Condition.model_validate(raw))
        except ValidationError:
            continue  # someone wrote garbage: replace it
    generation = body["metadata"].get("generation")
    merged = conditions(previous, values, now=now, generation=generation)
    return {
        "observedGeneration": generation,
        "conditions": [c.model_dump(by_alias=True, exclude_none=True) for c in merged],
        **fields,
    }


def reconcile(
    body: Manifest,
    cluster: Cluster,
    catalog: Catalog,
    image: str,
    now: Callable[[], str],
) -> Outcome:
    """Apply the pool's Deployment and Service (when it can run) and compute its status."""
    meta = body["metadata"]
    name, namespace = meta["name"], meta["namespace"]
    try:
        spec = InferencePoolSpec.model_validate(body.get("spec") or {})
    except ValidationError as exc:
        return _invalid(body, f"spec: {first_problem(exc)}", now())
    assessment = assess(spec, catalog)
    if assessment.problem is not None:
        return _invalid(body, assessment.problem, now())
    if assessment.envelope is None or assessment.layout is None:
        message = f"does not fit: {assessment.misfit}"
        values = {
            "Fits": ConditionValue("False", "ModelDoesNotFit", message),
            "Ready": ConditionValue("False", "ModelDoesNotFit", message),
        }
        status = _status(body, values, now(), envelope=None)
        return Outcome(status, warnings=[("ModelDoesNotFit", message)])
    owner = owner_reference(body)
    for manifest in (
        deployment_manifest(name, namespace, spec, image, assessment.layout),
        service_manifest(name, namespace, spec),
    ):
        manifest["metadata"]["ownerReferences"] = [owner]
        cluster.apply(manifest)
    return Outcome(observe(body, spec, assessment, cluster, now()))


def observe(
    body: Manifest,
    spec: InferencePoolSpec,
    assessment: Assessment,
    cluster: Cluster,
    now: str,
) -> Manifest:
    """The status of a runnable pool from its Deployment's status."""
    meta = body["metadata"]
    deployment = cluster.deployment_status(meta["namespace"], meta["name"]) or {}
    ready = int(deployment.get("readyReplicas") or 0)
    updated = int(deployment.get("updatedReplicas") or 0)
    envelope = assessment.envelope
    fits = fits_message(spec, envelope) if envelope else f"{spec.model} fits"
    values: dict[Any, ConditionValue] = {
        "Fits": ConditionValue("True", "ModelFits", fits),
        **replica_conditions(
            assessment, spec.replicas, ready, updated, int(deployment.get("replicas") or 0)
        ),
    }
    selector = label_selector(pool_selector_labels(meta["name"]))
    return _status(
        body,
        values,
        now,
        replicas=int(deployment.get("replicas") or 0),
        readyReplicas=ready,
        envelope=envelope.model_dump(by_alias=True) if envelope else None,
        selector=selector,
    )


def _invalid(body: Manifest, problem: str, now: str) -> Outcome:
    message = f"invalid spec: {problem}"
    status = _status(body, {"Ready": ConditionValue("False", "InvalidSpec", message)}, now)
    return Outcome(status, warnings=[("InvalidSpec", message)], permanent_error=message)
