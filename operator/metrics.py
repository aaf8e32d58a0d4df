"""The operator's Prometheus metrics: reconciliations by handler and result, autoscaling
decisions by reason, and Deployments' replicas someone else set (`replicas_owner`), served
on their own port (`tiergate operator --metrics-port`); kopf exports none.

Each pool's conditions, as the operator last reconciled them, are a gauge too
(`tiergate_operator_pool_condition`): the alert on a pool without a ready endpoint leaves out a
pool that is starting or scaled to zero on purpose.

Results: `ok`; `invalid_spec` (the pool's spec cannot work: its status and a Warning event
say why; the user's to fix); `not_applied` (its objects could not be applied, e.g. a name
taken); `error` (the reconciliation raised, e.g. the API server refused a call; kopf retries).
The last two are the operator's problems, which an alert watches.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import Any, Literal
from wsgiref.simple_server import WSGIServer

from prometheus_client import CollectorRegistry, Counter, start_http_server
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from .autoscaling import REASONS
from .reconcile import Outcome

__all__ = ["HANDLERS", "RESULTS", "OperatorMetrics", "PoolConditions", "result_of"]

Handler = Literal["reconcile", "resync", "deployment_changed"]
Result = Literal["ok", "invalid_spec", "not_applied", "error"]
HANDLERS: tuple[Handler, ...] = ("reconcile", "resync", "deployment_changed")
RESULTS: tuple[Result, ...] = ("ok", "invalid_spec", "not_applied", "error")


def result_of(outcome: Outcome) -> Result:
    """What a finished reconciliation amounts to (an objects problem outranks a spec one)."""
    if outcome.alerts:
        return "not_applied"
    if outcome.permanent_error is not None:
        return "invalid_spec"
    return "ok"


class PoolConditions(Collector):
    """`tiergate_operator_pool_condition`: one series of value 1 per pool and condition type,
    labelled with the condition's status and reason as the operator last reconciled them.

    A pool not reconciled for `fresh_s` is left out: the resync timer reconciles every pool
    every period, so what is older belongs to a pool deleted unseen, or to a replica that lost
    its peering and stands by (what it last saw would otherwise hold an alert back for ever).
    A deleted pool's uid is remembered as long: a reconciliation still running when the pool
    went does not bring it back.
    """

    def __init__(self, fresh_s: float, clock: Callable[[], float] = time.monotonic) -> None:
        self.fresh_s = fresh_s
        self.clock = clock
        self._lock = threading.Lock()
        # (namespace, pool) -> (when, tier, ((type, status, reason), ...))
        self._pools: dict[tuple[str, str], tuple[float, str, tuple[tuple[str, str, str], ...]]] = {}
        self._deleted: dict[str, float] = {}  # uid -> when

    def record(
        self,
        namespace: str,
        pool: str,
        tier: str,
        conditions: Iterable[Mapping[str, Any]],
        uid: str | None = None,
    ) -> None:
        """The conditions a reconciliation of the pool (`uid`) wrote (its status' list)."""
        kept = tuple(
            (str(c.get("type")), str(c.get("status")), str(c.get("reason") or ""))
            for c in conditions
            if isinstance(c, Mapping) and c.get("type")
        )
        with self._lock:
            if uid is not None and uid in self._deleted:
                return
            self._pools[(namespace, pool)] = (self.clock(), tier, kept)

    def forget(self, namespace: str, pool: str, uid: str | None = None) -> None:
        """The pool (`uid`) was deleted."""
        now = self.clock()
        with self._lock:
            self._pools.pop((namespace, pool), None)
            self._deleted = {u: t for u, t in self._deleted.items() if now - t <= self.fresh_s}
            if uid is not None:
                self._deleted[uid] = now

    def collect(self) -> Iterator[GaugeMetricFamily]:
        family = GaugeMetricFamily(
            "tiergate_operator_pool_condition",
            "InferencePools' conditions as the operator last reconciled them: 1 per pool and "
            "condition type, labelled with its status and reason.",
            labels=["pool_namespace", "pool", "tier", "type", "status", "reason"],
        )
        now = self.clock()
        with self._lock:
            for (namespace, pool), (when, tier, conditions) in sorted(self._pools.items()):
                if now - when > self.fresh_s:
                    continue
                for kind, status, reason in conditions:
                    family.add_metric([namespace, pool, tier, kind, status, reason], 1)
        yield family


class OperatorMetrics:
    """A registry of its own (tests build many), every series present from the start at
    zero, so `increase()` sees the first failure. `fresh_s`: how long a pool's conditions are
    exported after its last reconciliation (`PoolConditions`)."""

    def __init__(self, fresh_s: float = 90.0, clock: Callable[[], float] = time.monotonic) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        self.pool_conditions = PoolConditions(fresh_s, clock)
        self.registry.register(self.pool_conditions)
        self.reconciles = Counter(
            "tiergate_operator_reconciles",
            "Reconciliations of InferencePools by handler and result (ok, invalid_spec, "
            "not_applied, error).",
            ["handler", "result"],
            registry=self.registry,
        )
        for handler in HANDLERS:
            for result in RESULTS:
                self.reconciles.labels(handler, result)
        self.autoscale_decisions = Counter(
            "tiergate_operator_autoscale_decisions",
            "Autoscaling decisions of InferencePools by reason (the Autoscaling condition's: "
            "ScaledUp, Holding, SloUnreachable, ...; error: the tick raised).",
            ["reason"],
            registry=self.registry,
        )
        for reason in (*REASONS, "error"):
            self.autoscale_decisions.labels(reason)
        self.replicas_overridden = Counter(
            "tiergate_operator_replicas_overridden",
            "Times another manager (an HPA aimed at the Deployment, kubectl scale deployment) "
            "set a pool's Deployment's replicas, which the operator then set back.",
            ["pool_namespace", "pool", "manager"],
            registry=self.registry,
        )

    def count(self, handler: Handler, result: Result) -> None:
        self.reconciles.labels(handler, result).inc()

    def count_override(self, namespace: str, pool: str, manager: str) -> None:
        self.replicas_overridden.labels(namespace, pool, manager).inc()

    def count_decision(self, reason: str) -> None:
        """One autoscaling tick, by its decision's reason (`error`: it raised)."""
        self.autoscale_decisions.labels(reason).inc()

    def serve(self, port: int, host: str = "0.0.0.0") -> WSGIServer:
        """Serve /metrics on `port` from a daemon thread (for the life of the process, or
        until the server returned is shut down)."""
        server, _ = start_http_server(port, addr=host, registry=self.registry)
        return server
