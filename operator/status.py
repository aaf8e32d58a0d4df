"""An InferencePool's status: what the spec predicts and how its replicas are doing.

Pure functions. `assess` runs the performance model on a spec and says whether the pool can
exist at all (`SpecProblem`: unknown names, impossible layouts; `DoesNotFit`: the model or its
KV cache does not fit the chips, with the numbers) or what it will deliver (`Envelope`).
Messages name an inline profile as such, and say when it shadows a catalog entry: a reader of
`kubectl describe` must not mistake a team's own figures for the catalog's.
`replica_conditions` reads the pool's Deployment (`rollout`) as `kubectl rollout status` does:
not done before its controller has observed its spec, and stuck past its progress deadline.
`conditions` merges new condition values into the old list the Kubernetes way:
`lastTransitionTime` changes only when a condition's status does. `rebase_conditions` carries
one writer's changes onto the list as another writer has left it since.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from dataclasses import dataclass
from typing import Any, Literal

from tiergate.pools import Condition, ConditionType, Envelope, InferencePoolSpec, Layout, predict
from tiergate.pools.engines import batching_problem, spans_nodes_problem
from tiergate.sim_nodes.catalogs import Catalog, CatalogError
from tiergate.sim_nodes.engine import Background, Engine, EngineCapacityError
from tiergate.sim_nodes.perf import Deployment, PerfConfigError, profile_label

__all__ = [
    "Assessment",
    "ConditionValue",
    "Rollout",
    "assess",
    "conditions",
    "fits_message",
    "not_rolled_out_conditions",
    "pods_not_starting",
    "pods_refused",
    "previous_spec_conditions",
    "rebase_conditions",
    "replica_conditions",
    "rollout",
    "served_generation",
    "written_condition",
]

Status = Literal["True", "False", "Unknown"]


@dataclass(frozen=True, slots=True)
class ConditionValue:
    status: Status
    reason: str
    message: str


@dataclass(frozen=True, slots=True)
class Assessment:
    """What the performance model says about a spec."""

    envelope: Envelope | None  # None: the performance model cannot evaluate the spec
    layout: Layout | None = None  # the replica the envelope describes (set with it)
    # Spec errors the schema cannot catch: without an envelope, the model cannot evaluate the
    # spec (unknown model...); with one, the model can but the node would not start with it
    # (its background load).
    problem: str | None = None
    misfit: str | None = None  # the model does not fit: the numbers
    slo_misses: tuple[str, ...] = ()

    @property
    def runnable(self) -> bool:
        return self.envelope is not None and self.problem is None


def fits_message(spec: InferencePoolSpec, envelope: Envelope) -> str:
    """The Fits condition's message: which model fits how many of which chips."""
    model = profile_label(spec.model, envelope.model_source)
    accelerator = profile_label(spec.accelerator or "", envelope.accelerator_source)
    return f"{model} fits {envelope.chips} x {accelerator}"


def assess(spec: InferencePoolSpec, catalog: Catalog) -> Assessment:
    try:
        performance = predict(spec, spec.workload, catalog)
    except (CatalogError, PerfConfigError) as exc:
        return Assessment(None, problem=str(exc))
    result = performance.result
    if not result.fits:
        d = performance.deployment
        model = profile_label(spec.model, performance.model_source)
        accelerator = profile_label(spec.accelerator or "", performance.accelerator_source)
        where = f"{model} on {d.chips} x {accelerator} ({spec.weight_dtype} weights)"
        return Assessment(None, misfit=f"{where}: {result.reason}")
    envelope = performance.envelope()
    problem = (
        _spans_nodes(spec, performance.deployment)
        or _engine_batching(spec, performance.deployment)
        or _background_problem(spec, performance.deployment)
    )
    if problem is not None:
        return Assessment(envelope, performance.layout(), problem=problem)
    misses: list[str] = []
    if spec.slo is not None:
        ttft_ms = 1e3 * round(result.ttft_s, 4)  # as the envelope says it
        if spec.slo.ttft_ms is not None and ttft_ms > spec.slo.ttft_ms:
            misses.append(f"TTFT {ttft_ms:.0f} ms > target {spec.slo.ttft_ms:g} ms")
        if spec.slo.tpot_ms is not None:
            tpot_ms = 1e3 / round(result.output_tokens_per_s_per_stream, 2)
            if tpot_ms > spec.slo.tpot_ms:
                misses.append(f"TPOT {tpot_ms:.1f} ms > target {spec.slo.tpot_ms:g} ms")
    return Assessment(envelope, performance.layout(), slo_misses=tuple(misses))


def _spans_nodes(spec: InferencePoolSpec, deployment: Deployment) -> str | None:
    """Why a real engine's replica cannot be scheduled on one node, or None."""
    return spans_nodes_problem(
        spec.engine,
        spec.accelerator or "",
        deployment.chips,
        deployment.accelerator.chips_per_system,
    )


def _engine_batching(spec: InferencePoolSpec, deployment: Deployment) -> str | None:
    """Why the pool's engine would refuse its batch limits at start, or None."""
    b = spec.batching
    return batching_problem(
        spec.engine,
        b.max_num_seqs,
        b.max_batched_tokens,
        b.chunked_prefill,
        spec.model,
        deployment.model.max_context_tokens,
    )


def _background_problem(spec: InferencePoolSpec, deployment: Deployment) -> str | None:
    """Why the node would refuse to start with the spec's background load (it must leave a
    batch slot and KV cache for requests), asked of the node's own engine; None if it would
    start. Otherwise the pods crash-loop with the reason in their log only."""
    bg = spec.background
    if bg is None or not bg.sequences:
        return None
    try:
        load = Background(
            bg.sequences, bg.context_tokens, bg.turn_input_tokens, bg.turn_output_tokens
        )
        Engine(deployment, spec.batching.to_batching(), background=load)
    except EngineCapacityError as exc:
        return f"background: {exc}"
    return None


@dataclass(frozen=True, slots=True)
class Rollout:
    """How a pool's Deployment is doing, as its status says."""

    ready: int = 0  # ready pods of any template
    updated: int = 0  # pods of the current template
    total: int = 0  # pods of every template
    #: The Deployment's controller has not acted on its current spec yet (status
    #: observedGeneration below metadata.generation): the counts are about the spec before.
    unobserved: bool = False
    #: Why the Deployment gave up waiting (its Progressing condition's message, with reason
    #: ProgressDeadlineExceeded): the current template's pods do not become ready. None: it
    #: did not.
    stuck: str | None = None
    #: The Deployment's controller is still waiting, within its progress deadline, for the
    #: current template's pods to become available (Progressing=True, any reason but
    #: NewReplicaSetAvailable): its pods are starting (a real engine loads weights for
    #: minutes), not failing yet.
    starting: bool = False
    #: Why the Deployment's controller cannot create the pods it wants (its ReplicaFailure
    #: condition's message: a ResourceQuota exceeded, a LimitRange or an admission webhook
    #: refusing them). None: it can. Such pods never exist, so no pod says why.
    refused: str | None = None


def rollout(deployment: Mapping[str, Any] | None) -> Rollout:
    """The Rollout of a Deployment's `status`, given with its `metadata.generation` as
    `generation` (as `Cluster.deployment_status` returns them); None or {}: no Deployment, or
    no status yet. Without `generation` the status is taken as observed."""
    deployment = deployment or {}
    generation = _count(deployment.get("generation"))
    observed = _count(deployment.get("observedGeneration"))
    unobserved = deployment.get("generation") is not None and observed < generation
    stuck, starting, refused = None, False, None
    for condition in deployment.get("conditions") or []:
        if not isinstance(condition, Mapping):
            continue
        if condition.get("type") == "ReplicaFailure" and condition.get("status") == "True":
            refused = str(condition.get("message") or condition.get("reason") or "FailedCreate")
        # A stale Progressing condition may speak of the template before.
        if condition.get("type") == "Progressing" and not unobserved:
            status, reason = condition.get("status"), condition.get("reason")
            if status == "False" and reason == "ProgressDeadlineExceeded":
                stuck = str(condition.get("message") or "ProgressDeadlineExceeded")
            starting = status == "True" and reason != "NewReplicaSetAvailable"
    return Rollout(
        ready=_count(deployment.get("readyReplicas")),
        updated=_count(deployment.get("updatedReplicas")),
        total=_count(deployment.get("replicas")),
        unobserved=unobserved,
        stuck=stuck,
        starting=starting,
        refused=refused,
    )


def _count(value: Any) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) else 0


def replica_conditions(
    assessment: Assessment,
    desired: int,
    deployment: Rollout,
    failing: str | None = None,
    *,
    pods_starting: bool = False,
) -> dict[ConditionType, ConditionValue]:
    """Ready / Progressing / Degraded of a runnable pool from its Deployment's rollout.

    A rollout is settled, as `kubectl rollout status` has it, when the Deployment's controller
    has acted on its current spec, that spec's pods are all there and ready, and no old pod is
    left: while an old pod serves beside a new one that never becomes ready, `ready` alone
    would call it done. Until then, ready pods include the previous spec's, so Ready says
    ServingPreviousSpec (about the generation they run: the caller sets it). Past the
    Deployment's progress deadline the rollout is stuck: not progressing, and degraded.
    `failing`: why pods cannot start (`pods_not_starting`), said by Degraded first.
    `pods_starting`: every pod not ready is on its way, none for longer than the Deployment's
    progress deadline (a scale-up from zero, or pods replaced, whose real engines load their
    weights): starting, not degraded, though the Deployment's controller counts no rollout."""
    d = deployment
    old = d.total - d.updated
    counts = f"{d.updated}/{desired} replicas updated, {d.ready} ready" + (
        f", {old} of the previous spec still running" if old > 0 else ""
    )
    if desired == 0:  # nothing serves: the router has no endpoint of the pool
        ready_value = ConditionValue("False", "ScaledToZero", "replicas is 0: no replica serves")
    elif d.ready < desired:
        ready_value = ConditionValue(
            "False", "ReplicasNotReady", f"{d.ready}/{desired} replicas ready"
        )
    elif old > 0 or d.unobserved:
        ready_value = ConditionValue(
            "True", "ServingPreviousSpec", f"{d.ready}/{desired} replicas ready, pods of the "
            "previous spec among them; the current spec is not wholly rolled out: see Progressing",
        )  # fmt: skip
    elif assessment.slo_misses:
        misses = "; ".join(assessment.slo_misses)
        ready_value = ConditionValue(
            "True", "SloAtRisk", f"serving, but predicted to miss: {misses}"
        )
    else:
        ready_value = ConditionValue("True", "Serving", f"{d.ready}/{desired} replicas ready")
    if d.unobserved:
        progressing = ConditionValue(
            "True", "RollingOut", "waiting for the Deployment's controller to observe its new "
            f"spec; {d.ready}/{desired} replicas ready meanwhile",
        )  # fmt: skip
    elif d.stuck is not None:
        progressing = ConditionValue(
            "False", "RolloutStuck", f"stopped at the Deployment's progress deadline "
            f"({d.stuck}): {counts}",
        )  # fmt: skip
    elif d.ready >= desired and d.updated >= desired and old <= 0:
        progressing = ConditionValue("False", "Settled", counts)
    else:
        progressing = ConditionValue("True", "RollingOut", counts)
    if failing is not None:
        degraded = ConditionValue(
            "True", "PodsCannotStart", f"{d.ready}/{desired} replicas ready; {failing}"
        )
    elif desired > 0 and d.ready == 0 and d.updated >= desired and d.starting:
        degraded = ConditionValue(
            "False", "Starting", f"0/{desired} replicas ready: the pods are starting; a rollout "
            "that makes no progress is stuck at the Deployment's progress deadline",
        )  # fmt: skip
    elif desired > 0 and d.ready == 0 and d.stuck is None and pods_starting:
        degraded = ConditionValue(
            "False", "Starting", f"0/{desired} replicas ready: the pods are starting (none has "
            "passed its startup probe yet); one still starting past the Deployment's progress "
            "deadline makes the pool NoReplicaReady",
        )  # fmt: skip
    elif desired > 0 and d.ready == 0 and d.updated >= desired:
        # Rolled out, yet nothing serves: the pods lost their readiness, or never had it.
        degraded = ConditionValue("True", "NoReplicaReady", f"{d.ready}/{desired} replicas ready")
    elif d.stuck is not None:
        degraded = ConditionValue(
            "True", "RolloutStuck", f"the new spec's pods are not becoming ready: {counts}"
        )
    else:
        degraded = ConditionValue("False", "AsExpected", f"{d.ready}/{desired} replicas ready")
    return {"Ready": ready_value, "Progressing": progressing, "Degraded": degraded}


#: How much of a pod's problem a condition quotes (an image pull's message can be long).
PROBLEM_CHARS = 300


def pods_not_starting(problems: Mapping[str, str]) -> str | None:
    """What Degraded says of pods that cannot start (`problems`: pod name -> why); None when
    none is stuck."""
    if not problems:
        return None
    name = min(problems)
    told = f"pod {name} cannot start: {problems[name]}"
    if len(told) > PROBLEM_CHARS:
        told = told[: PROBLEM_CHARS - 3] + "..."
    others = len(problems) - 1
    return told + (f" (and {others} more pod{'s' if others > 1 else ''})" if others else "")


def pods_refused(deployment: Rollout) -> str | None:
    """What Degraded says of pods the Deployment cannot create (`Rollout.refused`); None when
    it can."""
    if deployment.refused is None:
        return None
    told = f"the Deployment cannot create its pods: {deployment.refused}"
    return told if len(told) <= PROBLEM_CHARS else told[: PROBLEM_CHARS - 3] + "..."


def previous_spec_conditions(
    ready: int, total: int, reason: str, refusal: str
) -> dict[ConditionType, ConditionValue]:
    """Ready / Progressing / Degraded of a pool whose current spec is refused (`reason`,
    `refusal`) while `ready` of `total` pods of an earlier spec run on. The router routes to
    them still (it reads the pool's spec and pods, not its conditions), so Ready says how they
    serve, and Progressing that the current spec is not rolled out, and why."""
    counts = f"{ready}/{total} replicas of the previous spec ready"
    serving = ready >= total
    return {
        "Ready": ConditionValue(
            "True" if serving else "False",
            "ServingPreviousSpec" if serving else "ReplicasNotReady",
            f"{counts}; the current spec is not rolled out ({reason}): see Progressing",
        ),
        "Progressing": ConditionValue(
            "False", reason, f"not rolled out: {refusal}; what ran before runs on"
        ),
        "Degraded": ConditionValue("False", "AsExpected", counts),
    }


def not_rolled_out_conditions(reason: str, message: str) -> dict[ConditionType, ConditionValue]:
    """Ready, Progressing and Degraded of a pool whose spec cannot be rolled out (the
    router does not route to it either): none of them may keep an earlier spec's word."""
    return {
        "Ready": ConditionValue("False", reason, message),
        "Progressing": ConditionValue("False", reason, "not rolled out: " + message),
        "Degraded": ConditionValue("Unknown", reason, "not rolled out: " + message),
    }


def written_condition(status: Mapping[str, Any], kind: ConditionType) -> Mapping[str, Any]:
    """The condition `kind` of a status as written (empty: none)."""
    for condition in status.get("conditions") or []:
        if isinstance(condition, Mapping) and condition.get("type") == kind:
            return condition
    return {}


def served_generation(status: Mapping[str, Any]) -> int | None:
    """The generation whose pods serve while the rollout of the current one is not done: the
    one Ready was about the last time it was True (None: unknown)."""
    ready = written_condition(status, "Ready")
    generation = ready.get("observedGeneration") if ready.get("status") == "True" else None
    return generation if isinstance(generation, int) else None


def conditions(
    previous: list[Condition],
    values: dict[ConditionType, ConditionValue],
    *,
    now: str,
    generation: int | None,
    generations: Mapping[ConditionType, int | None] | None = None,
    drop: Collection[ConditionType] = (),
) -> list[Condition]:
    """`previous` with `values` applied; a condition's transition time moves only when its
    status does. Conditions not in `values` are kept as they are, unless named in `drop`
    (their feature is gone from the spec). Each is about `generation` unless `generations`
    names another for it (Ready, while pods of an earlier spec serve)."""
    by_type = {c.type: c for c in previous if c.type not in drop}
    generations = generations or {}
    for kind, value in values.items():
        old = by_type.get(kind)
        changed = old is None or old.status != value.status
        by_type[kind] = Condition(
            type=kind,
            status=value.status,
            reason=value.reason,
            message=value.message,
            last_transition_time=now if changed or old is None else old.last_transition_time,
            observed_generation=generations.get(kind, generation),
        )
    return [by_type[k] for k in ORDER if k in by_type]


#: The order conditions are written in.
ORDER: tuple[ConditionType, ...] = ("Ready", "Fits", "Progressing", "Degraded", "Autoscaling")


def rebase_conditions(
    base: Collection[Mapping[str, Any]],
    ours: Collection[Mapping[str, Any]],
    theirs: Collection[Mapping[str, Any]],
) -> list[Mapping[str, Any]]:
    """The conditions to write: `ours` were computed from `base`, and the pool's are `theirs`
    now. Two writers (reconcile, the autoscaler's timer) each own some condition types, and
    each writes the whole list: a condition we changed, added or dropped goes as ours, every
    other as it is now, so neither writer undoes what the other wrote meanwhile."""

    def by_type(items: Collection[Mapping[str, Any]]) -> dict[str, Mapping[str, Any]]:
        return {str(c.get("type")): c for c in items if isinstance(c, Mapping)}

    was, mine, now = by_type(base), by_type(ours), by_type(theirs)
    out = dict(now)
    for kind in was.keys() | mine.keys():
        if was.get(kind) == mine.get(kind):
            continue  # not ours to change: as it is now
        if kind in mine:
            out[kind] = mine[kind]
        else:
            out.pop(kind, None)
    known = [out.pop(kind) for kind in ORDER if kind in out]
    return known + list(out.values())
