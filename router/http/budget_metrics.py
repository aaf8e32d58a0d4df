"""Each tenant's spend budget on /metrics: the budget and what it has spent in the current
period, read when scraped, so a dashboard can show budget use and an alert can warn before a
tenant's requests start being refused (429 `budget_exceeded`)."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator

from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from tiergate.router.ledger.records import LedgerError
from tiergate.router.tenants.guards import Budgets
from tiergate.router.tenants.registry import Tenant

__all__ = ["BudgetCollector"]


class BudgetCollector(Collector):
    """`tiergate_tenant_budget_usd` and `tiergate_tenant_budget_spent_usd`, by tenant and
    period, for every tenant with a budget."""

    def __init__(
        self,
        tenants: Callable[[], Iterable[Tenant]],
        budgets: Callable[[], Budgets],
        now: Callable[[], float],
    ) -> None:
        self._tenants, self._budgets, self._now = tenants, budgets, now

    def collect(self) -> Iterator[GaugeMetricFamily]:
        labels = ["tenant", "period"]
        budget = GaugeMetricFamily(
            "tiergate_tenant_budget_usd",
            "A tenant's spend budget per period, USD (budgetUsd); tenants without one are "
            "not listed.",
            labels=labels,
        )
        spent = GaugeMetricFamily(
            "tiergate_tenant_budget_spent_usd",
            "What a tenant has spent in its current budget period, USD, as this router knows "
            "it (with a shared PostgreSQL ledger: as of its last lease, plus its own spend "
            "since).",
            labels=labels,
        )
        now_s, budgets = self._now(), self._budgets()
        for tenant in self._tenants():
            if tenant.budget_usd is None:
                continue
            values = [tenant.name, tenant.budget_period]
            budget.add_metric(values, tenant.budget_usd)
            try:
                spent_usd = budgets.spent_usd(tenant, now_s)
            except LedgerError:
                continue  # an unreadable ledger fails requests loudly; /metrics still answers
            if spent_usd is not None:
                spent.add_metric(values, spent_usd)
        yield budget
        yield spent
