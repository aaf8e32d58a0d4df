"""A tenant's budget of cascade check time: spent by what its checks hold, refilled by time."""

from __future__ import annotations

import pytest

from tiergate.router.request.check_budget import CheckBudget


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_a_tenant_spends_its_budget_and_gets_it_back_over_time() -> None:
    clock = Clock()
    budget = CheckBudget(capacity_s=2.0, refill_per_s=0.1, clock=clock)
    assert budget.left_s("mallory") == 2.0 and not budget.spent("mallory")
    budget.charge("mallory", 1.0)
    assert budget.left_s("mallory") == pytest.approx(1.0) and not budget.spent("mallory")
    budget.charge("mallory", 1.5)  # a check may cost more than what was left: debt
    assert budget.left_s("mallory") == pytest.approx(-0.5) and budget.spent("mallory")
    assert budget.spent_tenants() == ["mallory"]
    clock.now += 5.0  # the debt paid back, nothing more
    assert budget.left_s("mallory") == pytest.approx(0.0) and budget.spent("mallory")
    clock.now += 1.0
    assert budget.left_s("mallory") == pytest.approx(0.1) and not budget.spent("mallory")
    assert budget.spent_tenants() == []
    clock.now += 1000.0  # never more than the capacity
    assert budget.left_s("mallory") == 2.0


def test_tenants_have_budgets_of_their_own() -> None:
    clock = Clock()
    budget = CheckBudget(capacity_s=1.0, refill_per_s=0.1, clock=clock)
    budget.charge("mallory", 1.0)
    budget.charge("alice", 0.0003)
    assert budget.spent_tenants() == ["mallory"]
    assert budget.left_s("alice") == pytest.approx(0.9997)
    assert budget.left_s("trudy") == 1.0


def test_a_budget_needs_a_positive_capacity_and_refill() -> None:
    for capacity_s, refill_per_s in ((0.0, 0.1), (1.0, 0.0)):
        with pytest.raises(ValueError):
            CheckBudget(capacity_s=capacity_s, refill_per_s=refill_per_s)
