"""One reconciliation of one InferencePool: spec in, objects applied, status out.

Level-based: `reconcile` looks only at the pool as it is now and the cluster as it is now, so
running it again (a timer does, and kopf does after a restart) converges to the same objects
and the same status. The handlers are thin wrappers around it.

A spec the performance model cannot evaluate (or whose model does not fit) is one the router
drops too: the pool serves nothing. A spec it can evaluate but the operator refuses (a
background load the node would not start with, an image not allowed), or whose Deployment the
API server rejects, changes nothing in the cluster: pods of the previous spec run on and the
router keeps routing to them, so the status says both, that they serve and that the current
spec is not rolled out. So does a rollout that is not done (or is stuck) while old pods serve.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit

import kopf
from pydantic import ValidationError

from tiergate.common.validation import first_problem
from tiergate.pools import (
    GROUP,
    KIND,
    POOL_LABEL,
    Billing,
    Condition,
    Envelope,
    InferencePoolSpec,
    billed_price,
    label_selector,
    pool_selector_labels,
)
from tiergate.sim_nodes.catalogs import Catalog

from .images import ImagePolicy
from .kube import ApplyRejected, Cluster, PodAddress
from .render import (
    DEFAULT_POD_SETTINGS,
    GENERATION_ANNOTATION,
    PodSettings,
    pool_manifests,
    progress_deadline_s,
)
from .replicas_owner import ReplicasOverride, replicas_override
from .status import (
    Assessment,
    ConditionValue,
    assess,
    conditions,
    fits_message,
    not_rolled_out_conditions,
    pods_not_starting,
    pods_refused,
    previous_spec_conditions,
    replica_conditions,
    rollout,
    served_generation,
    written_condition,
)

__all__ = ["Outcome", "owner_reference", "reconcile"]

log = logging.getLogger("tiergate.operator")

Manifest = dict[str, Any]


@dataclass
class Outcome:
    """What a reconciliation decided: the status to write and what to tell people."""

    status: Manifest
    #: (reason, message) Warning events about the spec: posted when it changes, not on resync.
    warnings: list[tuple[str, str]] = field(default_factory=list)
    #: (reason, message) Warning events about something the status did not say before (the
    #: objects could not be applied): posted from any reconciliation, resyncs included.
    alerts: list[tuple[str, str]] = field(default_factory=list)
    permanent_error: str | None = None  # retrying the same spec cannot help
    #: A reconciliation of a newer generation of the pool applied its Deployment since this
    #: one's body was read: nothing was applied, and `status` (empty) is not to be written.
    superseded: bool = False
    #: Someone else set the pool's Deployment's replicas since the operator last applied
    #: them (an HPA aimed at the Deployment, `kubectl scale deployment`): this
    #: reconciliation set them back.
    override: ReplicasOverride | None = None


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
    generations: dict[Any, int | None] | None = None,
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
    # The autoscaler's timer owns status.autoscaling and the Autoscaling condition while
    # spec.autoscaling is set (kept here as the body has them); once it is removed the timer
    # stops, so clearing them falls to reconcile.
    autoscaled = bool((body.get("spec") or {}).get("autoscaling"))
    drop: list[Any] = [] if autoscaled else ["Autoscaling"]
    merged = conditions(
        previous, values, now=now, generation=generation, generations=generations, drop=drop
    )
    if not autoscaled and (old.get("autoscaling") is not None or _has_autoscaling(previous)):
        fields = {**fields, "autoscaling": None}  # a merge patch's null deletes it
    if "envelope" in fields:
        fields = {**fields, "billed": _billed(body, fields["envelope"])}
    return {
        "observedGeneration": generation,
        "conditions": [c.model_dump(by_alias=True, exclude_none=True) for c in merged],
        **fields,
    }


def _billed(body: Manifest, envelope: Manifest | None) -> Manifest | None:
    """status.billed: what tenants pay (spec.billing's price, else the envelope's cost); null
    (deleted) while there is no envelope, as the router then sends the pool nothing."""
    if envelope is None:
        return None
    try:
        billing = Billing.model_validate((body.get("spec") or {}).get("billing") or {})
        price = billed_price(billing, Envelope.model_validate(envelope))
    except ValidationError:
        return None
    return price.model_dump(by_alias=True)


def _has_autoscaling(previous: list[Condition]) -> bool:
    return any(c.type == "Autoscaling" for c in previous)


def reconcile(
    body: Manifest,
    cluster: Cluster,
    catalog: Catalog,
    images: ImagePolicy,
    now: Callable[[], str],
    *,
    pods: PodSettings = DEFAULT_POD_SETTINGS,
) -> Outcome:
    """Apply the pool's Deployment and Service (when it can run) and compute its status.
    `pods`: the operator's settings for every pool's pods."""
    meta = body["metadata"]
    name, namespace = meta["name"], meta["namespace"]
    try:
        spec = InferencePoolSpec.model_validate(body.get("spec") or {})
    except ValidationError as exc:
        return _invalid(body, f"spec: {first_problem(exc)}", now())
    if spec.endpoint is not None:
        return _hosted(body, spec, cluster, now())
    assessment = assess(spec, catalog)
    if assessment.envelope is None or assessment.layout is None:
        if assessment.problem is not None:
            return _invalid(body, assessment.problem, now())
        message = f"does not fit: {assessment.misfit}"
        values = {
            "Fits": ConditionValue("False", "ModelDoesNotFit", message),
            **not_rolled_out_conditions("ModelDoesNotFit", message),
        }
        status = _status(body, values, now(), envelope=None)
        return Outcome(status, warnings=[("ModelDoesNotFit", message)])
    invalid = assessment.problem is not None
    refusal = f"invalid spec: {assessment.problem}" if invalid else images.refusal(spec)
    if refusal is not None:
        # A spec the router routes (the performance model evaluates it) that the operator
        # will not roll out: nothing is applied.
        reason = "InvalidSpec" if invalid else "ImageNotAllowed"
        status = _previous_spec(body, spec, assessment, cluster, reason, refusal, now())
        return Outcome(status, warnings=[(reason, refusal)], permanent_error=refusal)
    manifests = pool_manifests(
        name,
        namespace,
        spec,
        images.engine_image(spec),
        assessment.layout,
        meta.get("generation"),
        settings=pods,
    )
    existing: dict[str, Manifest | None] = {}
    for manifest in manifests:  # all checked before any is applied
        kind, where = manifest["kind"], manifest["metadata"]
        existing[kind] = cluster.metadata(kind, where["namespace"], where["name"])
        taken = _someone_elses(manifest, existing[kind], meta.get("uid"))
        if taken is not None:
            return _blocked(body, spec, assessment, "NameTaken", taken, now())
    if _superseded(existing["Deployment"], meta):
        return Outcome({}, superseded=True)
    override = replicas_override(existing["Deployment"], name, spec.replicas)
    owner = owner_reference(body)
    applied: list[str] = []
    try:
        for manifest in manifests:
            manifest["metadata"]["ownerReferences"] = [owner]
            cluster.apply(manifest)
            applied.append(f"{manifest['kind']} {namespace}/{name}")
    except ApplyRejected as exc:
        # What is already running stays, and says how it does.
        if not applied:  # the Deployment is as before: its pods are the previous spec's
            status = _previous_spec(
                body, spec, assessment, cluster, "ApplyRejected", str(exc), now()
            )
            rejected = str(written_condition(status, "Progressing").get("message"))
        else:
            rejected = f"{exc} (applied before it: {', '.join(applied)})"
            status = observe(
                body, spec, assessment, cluster, now(), blocked=("ApplyRejected", rejected)
            )
        return _alerting(body, status, "ApplyRejected", rejected)
    return Outcome(observe(body, spec, assessment, cluster, now()), override=override)


def _someone_elses(manifest: Manifest, existing: Manifest | None, uid: str | None) -> str | None:
    """Why `manifest`'s object, if it exists (`existing`: its metadata), is not the pool's to
    apply; None when it is.

    The pool's own: controlled by an InferencePool of the pool's name (this one, or a deleted
    one of the same name whose objects garbage collection has not removed yet), or with no
    controller and the pool's label (orphaned by `kubectl delete --cascade=orphan`). Anything
    else belongs to someone else: server-side apply with force would take it over, and deleting
    the pool would then garbage-collect it.
    """
    kind, meta = manifest["kind"], manifest["metadata"]
    if existing is None:
        return None
    pool = meta["name"]
    whose = _whose(existing, pool, uid)
    if whose is None:
        return None
    return (
        f"{kind} {meta['namespace']}/{pool} already exists and is not this pool's ({whose}): "
        f"delete or rename it, or give the pool another name"
    )


def _superseded(deployment: Manifest | None, meta: Manifest) -> bool:
    """Whether this pool's Deployment (`deployment`: its metadata) was applied from a newer
    generation of it than `meta`'s: a resync that read the pool just before an edit, running
    beside the edit's handler, must not put the pods back to the spec before it. (The same
    name's Deployment of a deleted pool is another uid's: not newer, whatever its number.)"""
    if deployment is None:
        return False
    controllers = [r for r in deployment.get("ownerReferences") or [] if r.get("controller")]
    if not controllers or controllers[0].get("uid") != meta.get("uid"):
        return False
    applied, generation = _applied_generation(deployment), meta.get("generation")
    return applied is not None and isinstance(generation, int) and applied > generation


def _applied_generation(deployment: Manifest) -> int | None:
    """The pool's generation its Deployment was last applied from (None: not recorded)."""
    recorded = str((deployment.get("annotations") or {}).get(GENERATION_ANNOTATION, ""))
    return int(recorded) if recorded.isdigit() else None


def _whose(existing: Manifest, pool: str, uid: str | None) -> str | None:
    """Whose an object of the pool's name is, by its metadata; None: the pool's own."""
    controllers = [r for r in existing.get("ownerReferences") or [] if r.get("controller")]
    if not controllers:
        if (existing.get("labels") or {}).get(POOL_LABEL) == pool:
            return None
        return "it has no controller"
    ref = controllers[0]
    if ref.get("kind") == KIND and str(ref.get("apiVersion", "")).startswith(f"{GROUP}/"):
        if ref.get("name") == pool or ref.get("uid") == uid:
            return None
    return f"it is controlled by {ref.get('kind')} {ref.get('name')}"


def _blocked(
    body: Manifest,
    spec: InferencePoolSpec,
    assessment: Assessment,
    reason: str,
    message: str,
    now: str,
) -> Outcome:
    """A pool that fits, whose objects the operator may not apply."""
    envelope = assessment.envelope
    fits = fits_message(spec, envelope) if envelope else f"{spec.model} fits"
    values = {
        "Fits": ConditionValue("True", "ModelFits", fits),
        **not_rolled_out_conditions(reason, message),
    }
    status = _status(
        body, values, now, envelope=envelope.model_dump(by_alias=True) if envelope else None
    )
    return _alerting(body, status, reason, message)


def _previous_spec(
    body: Manifest,
    spec: InferencePoolSpec,
    assessment: Assessment,
    cluster: Cluster,
    reason: str,
    message: str,
    now: str,
) -> Manifest:
    """The status of a pool whose current spec is not applied (`reason`, `message`): pods of an
    earlier spec run on, and then Ready says how they serve (about the generation they were
    made from) and Progressing why this one is not rolled out."""
    meta = body["metadata"]
    envelope = assessment.envelope
    fits = fits_message(spec, envelope) if envelope else f"{spec.model} fits"
    values: dict[Any, ConditionValue] = {"Fits": ConditionValue("True", "ModelFits", fits)}
    generations: dict[Any, int | None] = {}
    fields: dict[str, Any] = {
        "envelope": envelope.model_dump(by_alias=True) if envelope else None,
    }
    serving = _serving_deployment(cluster, meta)
    if serving is None:
        values.update(not_rolled_out_conditions(reason, message))
    else:
        ready, total, generation = serving
        values.update(previous_spec_conditions(ready, total, reason, message))
        generations["Ready"] = generation
        selector = label_selector(pool_selector_labels(meta["name"]))
        fields.update(replicas=total, readyReplicas=ready, selector=selector)
    return _status(body, values, now, generations, **fields)


def _serving_deployment(cluster: Cluster, meta: Manifest) -> tuple[int, int, int | None] | None:
    """(ready, total, generation) of the pool's own Deployment while some of its pods are
    ready; generation: the pool's, that it was last applied from (None: not recorded)."""
    name, namespace = meta["name"], meta["namespace"]
    existing = cluster.metadata("Deployment", namespace, name)
    if existing is None or _whose(existing, name, meta.get("uid")) is not None:
        return None
    deployment = rollout(cluster.deployment_status(namespace, name))
    if deployment.ready == 0:
        return None
    return deployment.ready, max(deployment.ready, deployment.total), _applied_generation(existing)


def _alerting(body: Manifest, status: Manifest, reason: str, message: str) -> Outcome:
    """A permanent failure to apply: alerted once, when the pool's status did not say it yet
    (the resync timer finds it again every RESYNC_S, and applies once it is mended)."""
    progressing = written_condition(body.get("status") or {}, "Progressing")
    said = progressing.get("reason") == reason and str(progressing.get("message")).endswith(message)
    return Outcome(status, alerts=[] if said else [(reason, message)], permanent_error=message)


def observe(
    body: Manifest,
    spec: InferencePoolSpec,
    assessment: Assessment,
    cluster: Cluster,
    now: str,
    blocked: tuple[str, str] | None = None,
) -> Manifest:
    """The status of a runnable pool from its Deployment's status. `blocked`: (reason,
    message) why the spec is not (wholly) rolled out, said by Progressing instead of the
    counts, and by Ready too when the Deployment has no pod yet."""
    meta = body["metadata"]
    deployment = rollout(cluster.deployment_status(meta["namespace"], meta["name"]))
    envelope = assessment.envelope
    fits = fits_message(spec, envelope) if envelope else f"{spec.model} fits"
    failing, starting = None, False
    if deployment.ready < max(spec.replicas, deployment.total):  # why are the others not?
        pods = _pods(cluster, meta["namespace"], meta["name"])
        waiting = [p for p in pods or [] if not p.ready]
        problems = {p.name: p.problem for p in waiting if p.problem is not None}
        failing = pods_not_starting(problems) or pods_refused(deployment)
        starting = bool(waiting) and all(_on_its_way(p, progress_deadline_s(spec)) for p in waiting)
    values: dict[Any, ConditionValue] = {
        "Fits": ConditionValue("True", "ModelFits", fits),
        **replica_conditions(
            assessment, spec.replicas, deployment, failing, pods_starting=starting
        ),
    }
    generations: dict[Any, int | None] = {}
    if values["Ready"].reason == "ServingPreviousSpec":
        generations["Ready"] = served_generation(body.get("status") or {})
    if blocked is not None:
        reason, message = blocked
        values["Progressing"] = ConditionValue("False", reason, message)
        if deployment.total == 0:
            values["Ready"] = ConditionValue("False", reason, message)
    selector = label_selector(pool_selector_labels(meta["name"]))
    return _status(
        body,
        values,
        now,
        generations,
        replicas=deployment.total,
        readyReplicas=deployment.ready,
        envelope=envelope.model_dump(by_alias=True) if envelope else None,
        selector=selector,
    )


def _pods(cluster: Cluster, namespace: str, pool: str) -> list[PodAddress] | None:
    """The pool's pods; None when they cannot be listed now (the status says what the
    Deployment says, none is taken to be starting, and the next resync looks again)."""
    try:
        return cluster.pool_pods(namespace, pool)
    except kopf.TemporaryError as exc:
        log.info("event=pods_unlisted pool=%s/%s error=%s", namespace, pool, exc)
        return None


def _on_its_way(pod: PodAddress, deadline_s: int) -> bool:
    """A pod not ready that is starting, not stuck, and younger than the Deployment's progress
    deadline (a pod waiting longer for its volume, image or startup probe is not coming)."""
    young = pod.age_s is not None and pod.age_s < deadline_s
    return pod.starting and pod.problem is None and young


def _hosted(body: Manifest, spec: InferencePoolSpec, cluster: Cluster, now: str) -> Outcome:
    """A pool a provider's API serves: no pods (a Deployment and Service of the pool's from
    before it was hosted are deleted), and an envelope that states its price."""
    meta = body["metadata"]
    name, namespace = meta["name"], meta["namespace"]
    for kind in ("Deployment", "Service"):
        existing = cluster.metadata(kind, namespace, name)
        if existing is not None and _whose(existing, name, meta.get("uid")) is None:
            cluster.delete(kind, namespace, name)
    endpoint = spec.endpoint
    assert endpoint is not None
    where = f"{endpoint.model} at {urlsplit(endpoint.url).hostname}"
    if spec.replicas == 0:
        ready = ConditionValue(
            "False", "ScaledToZero", "replicas is 0: the router sends it nothing"
        )
    else:
        ready = ConditionValue("True", "Hosted", f"served by {where}; the router checks it by "
                               "its replies")  # fmt: skip
    values: dict[Any, ConditionValue] = {
        "Fits": ConditionValue("True", "Hosted", f"served by {where}: no pods"),
        "Ready": ready,
        "Progressing": ConditionValue("False", "Settled", "a hosted pool has no pods to roll out"),
        "Degraded": ConditionValue("False", "AsExpected", f"served by {where}"),
    }
    envelope = Envelope(
        basis="stated",
        cost_per_million_output_tokens_usd=spec.billing.output_per_million_usd or 0.0,
        cost_per_million_input_tokens_usd=spec.billing.input_per_million_usd,
    )
    status = _status(
        body,
        values,
        now,
        replicas=None,
        readyReplicas=None,
        selector=None,
        envelope=envelope.model_dump(by_alias=True),  # nulls: a predicted envelope's figures go
    )
    return Outcome(status)


def _invalid(body: Manifest, problem: str, now: str) -> Outcome:
    message = f"invalid spec: {problem}"
    values = {
        "Fits": ConditionValue("Unknown", "InvalidSpec", message),
        **not_rolled_out_conditions("InvalidSpec", message),
    }
    status = _status(body, values, now, envelope=None)
    return Outcome(status, warnings=[("InvalidSpec", message)], permanent_error=message)
