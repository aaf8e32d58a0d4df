"""The metrics each stage of the request path reports, as protocols.

A stage names the few counters and histograms it updates; `RouterMetrics`
(router/http/metrics.py) has them all and is what the app passes in. So a stage reports its
events without importing the app's metrics module, which reads every other part.
"""

from __future__ import annotations

from typing import Protocol

from prometheus_client import Counter, Histogram

__all__ = ["AccountingMetrics", "CascadeMetrics", "RelayMetrics", "RequestMetrics"]


class AccountingMetrics(Protocol):
    """Counted for each request as it is accounted for (router/request/accounting.py)."""

    requests: Counter
    ttft: Histogram
    cost: Counter
    tokens: Counter
    accounting_errors: Counter
    ledger_refusals: Counter


class RelayMetrics(Protocol):
    """Counted while a reply is relayed (router/request/relay.py)."""

    tpot: Histogram
    midstream_errors: Counter


class CascadeMetrics(Protocol):
    """Counted when a cascade escalates (router/request/cascade.py)."""

    escalations: Counter


class RequestMetrics(AccountingMetrics, RelayMetrics, CascadeMetrics, Protocol):
    """Everything the request path counts (router/handler.py), its stages' included."""

    shed: Counter
    admission_wait: Histogram
    attained: Counter
    spills: Counter
    retries: Counter
