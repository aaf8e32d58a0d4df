"""The operator's Prometheus metrics: reconciliations by handler and result, served on their
own port (`tiergate operator --metrics-port`); kopf exports none.

Results: `ok`; `invalid_spec` (the pool's spec cannot work: its status and a Warning event
say why; the user's to fix); `not_applied` (its objects could not be applied, e.g. a name
taken); `error` (the reconciliation raised, e.g. the API server refused a call; kopf retries).
The last two are the operator's problems, which an alert watches.
"""

from __future__ import annotations

from typing import Literal
from wsgiref.simple_server import WSGIServer

from prometheus_client import CollectorRegistry, Counter, start_http_server

from .reconcile import Outcome

__all__ = ["HANDLERS", "RESULTS", "OperatorMetrics", "result_of"]

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


class OperatorMetrics:
    """A registry of its own (tests build many), every series present from the start at
    zero, so `increase()` sees the first failure."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
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

    def count(self, handler: Handler, result: Result) -> None:
        self.reconciles.labels(handler, result).inc()

    def serve(self, port: int, host: str = "0.0.0.0") -> WSGIServer:
        """Serve /metrics on `port` from a daemon thread (for the life of the process, or
        until the server returned is shut down)."""
        server, _ = start_http_server(port, addr=host, registry=self.registry)
        return server
