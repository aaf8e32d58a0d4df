"""kopf handlers: thin wrappers that hand an InferencePool to `reconcile` and write back.

- `inferencepool_reconcile`: on create, on spec change and on operator start (resume).
- `inferencepool_resync`: a timer that reconciles every `RESYNC_S`: repairs drift (a deleted
  or edited Deployment is re-applied) and refreshes readiness in the status.
- `inferencepool_deleted`: a pool was deleted: its conditions leave the operator's metrics.
- `deployment_changed`: a Deployment the operator owns changed (pods became ready, someone
  deleted it or set its replicas): reconcile its pool at once rather than at the next timer.
  Replicas someone else set are set back, and told (`_tell_override`).
- With `OperatorMemo.gateway`, each reconciliation of a pool of the routers' namespace also
  keeps the Gateway API Inference Extension InferencePool there (`gateway_pool`).
- `inferencepool_autoscale`: a timer on pools with `spec.autoscaling`, every interval the
  operator is given (`register_autoscaler`): performs `autoscale`'s tick (status first, then
  the scale); the routers' queues count when `OperatorMemo.routers` says where the routers run.

Operator settings (`configure`): watch timeouts so a silently stalled watch is re-opened,
progress kept in annotations (the CRD's structural schema would prune kopf's `status.kopf`),
and peering so that only one operator replica writes (see commands/operator_cmd.py).
"""

from __future__ import annotations

import datetime
import logging
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, cast

import kopf

from tiergate.pools import GROUP, PLURAL, VERSION
from tiergate.sim_nodes.catalogs import Catalog

from .autoscale import MetricsScraper, Routers, Scrape, autoscale
from .gateway_pool import GatewayPool, GatewayPoolMissing, sync_gateway_pool
from .images import ImagePolicy
from .kube import ApplyRejected, Cluster, KubeCluster
from .metrics import Handler, OperatorMetrics, result_of
from .reconcile import Outcome, reconcile
from .render import FIELD_MANAGER, PodSettings

__all__ = ["OperatorMemo", "configure", "register_autoscaler"]

log = logging.getLogger("tiergate.operator")

#: Seconds between two reconciliations of an idle pool (drift repair, readiness refresh).
RESYNC_S = 30
#: A pool whose Deployment's replicas another manager keeps setting (an HPA aimed at the
#: Deployment syncs every 15 s) gets one Warning event per manager in this many seconds.
OVERRIDE_WARN_EVERY_S = 600
#: The API server ends each watch after this long; kopf then re-opens it.
WATCH_SERVER_TIMEOUT_S = 270
#: A watch silent for longer than this is presumed stalled and re-opened.
WATCH_CLIENT_TIMEOUT_S = 300


#: kopf logs each successful run of a handler at INFO. For these that is every resync of every
#: pool (every RESYNC_S) and every change of every Deployment (its pods' readiness): routine,
#: so shown only when the operator logs at DEBUG. Failures are always shown.
ROUTINE_SUCCESSES = frozenset(
    {
        "Timer 'inferencepool_resync' succeeded.",
        "Timer 'inferencepool_autoscale' succeeded.",
        "Handler 'deployment_changed' succeeded.",
    }
)


class _QuietRoutine(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        if record.levelno == logging.INFO and record.getMessage() in ROUTINE_SUCCESSES:
            return log.isEnabledFor(logging.DEBUG)
        return True


_QUIET_ROUTINE = _QuietRoutine()


@dataclass
class OperatorMemo:
    """What every handler needs, passed as kopf's `memo`."""

    catalog: Catalog
    images: ImagePolicy
    cluster: Cluster | None = None  # built on first use (needs the kube config loaded)
    warn: Callable[..., None] = kopf.warn  # posts a Warning event on the pool (tests: a list)
    inform: Callable[..., None] = kopf.info  # posts a Normal event on the pool
    namespaced: bool = False  # watching named namespaces only (no cluster-wide permissions)
    metrics: OperatorMetrics = field(default_factory=lambda: OperatorMetrics(3 * RESYNC_S))
    scrape: Scrape = field(default_factory=MetricsScraper)  # a pod's /metrics text
    #: Where the routers run, whose queues count in the pools' demand (None: not read).
    routers: Routers | None = None
    clock: Callable[[], datetime.datetime] = lambda: datetime.datetime.now(datetime.UTC)
    #: What every pool's pods get: their user, the weights' cache, the pull secrets.
    pods: PodSettings = field(default_factory=PodSettings)
    #: The GIE InferencePool to keep beside the routers' pools (None: none).
    gateway: GatewayPool | None = None
    #: Why the GIE pool could not be kept, last time (logged when it changes, not each resync).
    gateway_problem: str | None = None
    #: The GIE pool's owners (uids) as last applied, and when (monotonic seconds): a resync of
    #: a pool among them within RESYNC_S of it leaves the GIE pool alone.
    gateway_owners: frozenset[str] = frozenset()
    gateway_kept_at: float | None = None
    monotonic: Callable[[], float] = time.monotonic
    #: (pool uid, manager) -> (the time of its override last told, when it was warned of in
    #: monotonic seconds): each override is counted once, warned of once a period.
    overrides: dict[tuple[str, str], tuple[str, float | None]] = field(default_factory=dict)

    def api(self) -> Cluster:
        if self.cluster is None:
            self.cluster = KubeCluster()
        return self.cluster


def _now() -> str:
    return datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def configure(settings: kopf.OperatorSettings, *, namespaced: bool = False) -> None:
    """Production settings (called at startup; also by tests).

    `namespaced`: the operator watches named namespaces and may not list namespaces or CRDs
    cluster-wide (the chart grants it a Role per namespace), so kopf must not scan for them:
    it would be refused, retry with backoff, and start reconciling half a minute late.
    """
    settings.watching.server_timeout = WATCH_SERVER_TIMEOUT_S
    settings.watching.client_timeout = WATCH_CLIENT_TIMEOUT_S
    settings.watching.connect_timeout = 10
    settings.networking.request_timeout = 60
    settings.persistence.progress_storage = kopf.AnnotationsProgressStorage(prefix=GROUP)
    settings.persistence.diffbase_storage = kopf.AnnotationsDiffBaseStorage(
        prefix=GROUP, key="last-handled-configuration"
    )
    settings.posting.level = logging.INFO
    settings.networking.error_backoffs = [1, 2, 5, 10, 30]  # transient API errors back off
    settings.scanning.disabled = namespaced
    logging.getLogger("kopf.objects").addFilter(_QUIET_ROUTINE)  # once: the same filter


@kopf.on.startup()
def operator_startup(settings: kopf.OperatorSettings, memo: OperatorMemo, **_: Any) -> None:
    configure(settings, namespaced=memo.namespaced)


def _run(body: kopf.Body, memo: OperatorMemo, *, report: bool) -> None:
    """Reconcile and write the status; with `report`, post Warning events and raise
    PermanentError for a spec that cannot work (the timer re-checks silently: one event per
    change, not one per resync)."""
    outcome = _reconcile(dict(body), memo, "reconcile" if report else "resync")
    namespace, name = body.metadata.namespace, body.metadata.name
    if outcome.superseded:
        log.info("event=reconcile_superseded pool=%s/%s generation=%s",
                 namespace, name, body.metadata.get("generation"))  # fmt: skip
        return
    # Written here rather than in kopf's patch (which replaces the conditions whole): rebased
    # on what the autoscaler's timer wrote since `body` was read.
    if namespace is not None and name is not None:
        memo.api().patch_pool_status(namespace, name, outcome.status, base=_status_of(body))
        _export_conditions(body, outcome, memo)
    _alert(body, outcome, memo)
    _tell_override(body, outcome, memo)
    _keep_gateway_pool(body, memo, report=report)
    if not report:
        return
    for reason, message in outcome.warnings:
        memo.warn(body, reason=reason, message=message)
    if outcome.permanent_error is not None:
        raise kopf.PermanentError(outcome.permanent_error)


def _keep_gateway_pool(body: kopf.Body, memo: OperatorMemo, *, report: bool) -> None:
    """Apply the GIE InferencePool for the pools of the routers' namespace (with
    `memo.gateway`). A missing CRD or a refused manifest is logged when it first happens and
    posted on the pool reconciled for a spec change, and does not fail the pool's handler; a
    transient API error does, and kopf retries it with its backoff. A pool's resync applies
    it only when no sync of the pools it already serves came within a resync period."""
    gateway = memo.gateway
    if gateway is None or body.metadata.namespace != gateway.namespace:
        return
    now, kept_at = memo.monotonic(), memo.gateway_kept_at
    recent = kept_at is not None and now - kept_at < RESYNC_S
    if not report and recent and body.metadata.uid in memo.gateway_owners:
        return  # every pool's resync would list and apply it again: once a resync period
    try:
        memo.gateway_owners = sync_gateway_pool(gateway, memo.api())
        memo.gateway_kept_at = now
    except (GatewayPoolMissing, ApplyRejected) as exc:
        problem = str(exc)
        if problem != memo.gateway_problem:
            log.warning("event=gateway_pool_not_kept pool=%s/%s message=%s",
                        gateway.namespace, gateway.name, problem)  # fmt: skip
        memo.gateway_problem = problem
        if report:
            memo.warn(body, reason="GatewayPoolNotKept", message=problem)
        return
    if memo.gateway_problem is not None:
        log.info("event=gateway_pool_kept pool=%s/%s", gateway.namespace, gateway.name)
    memo.gateway_problem = None


def _reconcile(pool: dict[str, Any], memo: OperatorMemo, handler: Handler) -> Outcome:
    """`reconcile`, counted in the operator's metrics by its result."""
    try:
        outcome = reconcile(
            pool,
            memo.api(),
            memo.catalog,
            memo.images,
            _now,
            pods=memo.pods,
        )
    except Exception:
        memo.metrics.count(handler, "error")
        raise
    memo.metrics.count(handler, result_of(outcome))
    return outcome


def _export_conditions(
    pool: kopf.Body | dict[str, Any], outcome: Outcome, memo: OperatorMemo
) -> None:
    """The conditions just written, in the operator's metrics (`PoolConditions`)."""
    meta, spec = pool.get("metadata") or {}, pool.get("spec") or {}
    memo.metrics.pool_conditions.record(
        str(meta.get("namespace")), str(meta.get("name")), str(spec.get("tier") or ""),
        outcome.status.get("conditions") or [], uid=meta.get("uid"),
    )  # fmt: skip


def _alert(pool: kopf.Body | dict[str, Any], outcome: Outcome, memo: OperatorMemo) -> None:
    """Post (and log, naming the pool) what the pool's status did not say before."""
    meta = pool.get("metadata") or {}
    for reason, message in outcome.alerts:
        log.warning(
            "event=pool_not_applied pool=%s/%s reason=%s message=%s",
            meta.get("namespace"), meta.get("name"), reason, message,
        )  # fmt: skip
        memo.warn(pool, reason=reason, message=message)


def _tell_override(pool: kopf.Body | dict[str, Any], outcome: Outcome, memo: OperatorMemo) -> None:
    """Count, log and post (once per `OVERRIDE_WARN_EVERY_S` and manager) that someone else
    set the pool's Deployment's replicas, which the reconciliation set back."""
    override = outcome.override
    meta = pool.get("metadata") or {}
    if override is None:
        return
    key = (str(meta.get("uid")), override.manager)
    told, warned_at = memo.overrides.get(key, ("", None))
    if told == override.time and told:
        return  # the same override, read again before the operator's apply took the field
    namespace, name = str(meta.get("namespace")), str(meta.get("name"))
    memo.metrics.count_override(namespace, name, override.manager)
    now = memo.monotonic()
    if warned_at is not None and now - warned_at < OVERRIDE_WARN_EVERY_S:
        memo.overrides[key] = (override.time, warned_at)
        return
    memo.overrides[key] = (override.time, now)
    log.warning(
        "event=replicas_overridden pool=%s/%s manager=%s subresource=%s",
        namespace, name, override.manager, override.subresource or "-",
    )  # fmt: skip
    memo.warn(pool, reason="ReplicasOverridden", message=override.message)


@kopf.on.resume(GROUP, VERSION, PLURAL)
@kopf.on.create(GROUP, VERSION, PLURAL)
@kopf.on.update(GROUP, VERSION, PLURAL, field="spec")
def inferencepool_reconcile(
    body: kopf.Body, patch: kopf.Patch, memo: OperatorMemo, **_: Any
) -> None:
    _run(body, memo, report=True)


@kopf.timer(GROUP, VERSION, PLURAL, interval=RESYNC_S, initial_delay=RESYNC_S)
def inferencepool_resync(body: kopf.Body, patch: kopf.Patch, memo: OperatorMemo, **_: Any) -> None:
    """Reconcile the pool as it is now. kopf hands a timer the body it last saw, and the timer
    runs beside the handler of an edit: applied from that body, the pool's Deployment could go
    back to the spec before the edit for a moment, stopping pods of the new one."""
    namespace, name = body.metadata.namespace, body.metadata.name
    stored = memo.api().pool(namespace, name) if namespace and name else None
    _run(body if stored is None else kopf.Body(cast(kopf.RawBody, stored)), memo, report=False)


@kopf.on.delete(GROUP, VERSION, PLURAL, optional=True)
def inferencepool_deleted(body: kopf.Body, memo: OperatorMemo, **_: Any) -> None:
    """Stop exporting the pool's conditions (a deletion not seen: they age out)."""
    namespace, name = body.metadata.namespace, body.metadata.name
    if namespace is not None and name is not None:
        memo.metrics.pool_conditions.forget(namespace, name, body.metadata.uid)
    memo.overrides = {k: v for k, v in memo.overrides.items() if k[0] != body.metadata.uid}


def _status_of(pool: kopf.Body | dict[str, Any]) -> dict[str, Any]:
    """The status a handler computed its own from (what its write is rebased from)."""
    status = pool.get("status")
    return dict(status) if isinstance(status, Mapping) else {}


def _owned_pool(body: kopf.Body) -> str | None:
    for ref in body.metadata.get("ownerReferences") or []:
        if ref.get("kind") == "InferencePool" and ref.get("apiVersion", "").startswith(GROUP):
            return str(ref["name"])
    return None


@kopf.on.event("apps", "v1", "deployments", labels={"app.kubernetes.io/managed-by": FIELD_MANAGER})
def deployment_changed(event: kopf.RawEvent, body: kopf.Body, memo: OperatorMemo, **_: Any) -> None:
    """Re-reconcile the owning pool (re-creating a deleted Deployment, refreshing status)."""
    pool = _owned_pool(body)
    namespace = body.metadata.namespace
    if pool is None or namespace is None:
        return
    cluster = memo.api()
    obj = cluster.pool(namespace, pool)
    if obj is None or obj.get("metadata", {}).get("deletionTimestamp"):
        return  # the pool is gone: garbage collection removes its objects
    outcome = _reconcile(obj, memo, "deployment_changed")
    if outcome.superseded:
        return  # a newer generation's handler applied and writes the status
    cluster.patch_pool_status(namespace, pool, outcome.status, base=_status_of(obj))
    _export_conditions(obj, outcome, memo)
    _alert(obj, outcome, memo)
    _tell_override(obj, outcome, memo)
    log.debug("event=deployment_changed pool=%s/%s type=%s", namespace, pool, event.get("type"))


def _autoscaled(spec: kopf.Spec, **_: Any) -> bool:
    return bool(spec.get("autoscaling"))


def register_autoscaler(interval_s: float, registry: kopf.OperatorRegistry | None = None) -> None:
    """Run `inferencepool_autoscale` on each autoscaled pool every `interval_s` seconds, the
    first an interval after the operator sees the pool (in `registry`, default kopf's own)."""
    kopf.timer(
        GROUP, VERSION, PLURAL, interval=interval_s, initial_delay=interval_s, when=_autoscaled,
        registry=registry,
    )(inferencepool_autoscale)  # fmt: skip


def inferencepool_autoscale(body: kopf.Body, memo: OperatorMemo, **_: Any) -> None:
    """Decide the pool's replicas; write the status, then scale, then tell."""
    namespace, name = body.metadata.namespace, body.metadata.name
    if namespace is None or name is None:
        return
    cluster = memo.api()
    try:
        tick = autoscale(dict(body), cluster, memo.catalog, memo.scrape, memo.clock(), memo.routers)
        if tick is None:
            return
        cluster.patch_pool_status(namespace, name, tick.status, base=_status_of(body))
        if tick.replicas is not None:
            cluster.scale_pool(namespace, name, tick.replicas)
    except Exception:
        memo.metrics.count_decision("error")
        raise
    memo.metrics.count_decision(tick.decision.reason)
    if tick.replicas is not None:
        log.info(
            "event=pool_scaled pool=%s/%s replicas=%d reason=%s",
            namespace, name, tick.replicas, tick.decision.reason,
        )  # fmt: skip
    for kind, reason, message in tick.events:
        post = memo.inform if kind == "Normal" else memo.warn
        post(body, reason=reason, message=message)
