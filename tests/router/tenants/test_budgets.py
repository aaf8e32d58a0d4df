"""Budgets: UTC periods, enforcement, rollover, and enforcement that survives a restart."""

import dataclasses
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import AbstractContextManager
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx
import pytest
from tenant_router_helpers import KEY, tenant_router

from tiergate.router.base.errors import RouterError
from tiergate.router.ledger.sqlite import Ledger, UsageRecord
from tiergate.router.request.accounting import Accountant
from tiergate.router.request.exchange import Exchange
from tiergate.router.tenants.budgets import BudgetGuard, period_bounds
from tiergate.router.tenants.registry import ANONYMOUS, BudgetPeriod, Tenant

#: Real processes and servers, or seconds of work: left out of `make test-fast`.
pytestmark = pytest.mark.slow


@pytest.fixture
def ledger() -> Iterator[Ledger]:
    with Ledger(":memory:") as opened:
        yield opened


def ts(year: int, month: int, day: int, hour: int = 0, minute: int = 0, second: int = 0) -> float:
    return datetime(year, month, day, hour, minute, second, tzinfo=UTC).timestamp()


# Wednesday 2026-12-30 18:00 UTC
NOW = ts(2026, 12, 30, 18)
MONTHLY = Tenant("monthly", budget_usd=10.0, budget_period="month")


def spend(ledger: Ledger, tenant: str, time_s: float, cost_usd: float) -> None:
    ledger.record(
        UsageRecord(
            request_id=f"r-{time_s}", time_s=time_s, tenant=tenant, tier_requested="premium",
            tier_served="premium", pool="p", endpoint="e", prompt_tokens=1, completion_tokens=1,
            latency_s=1.0, ttft_s=0.1, cost_usd=cost_usd, http_status=200, outcome="ok",
        )
    )  # fmt: skip


@pytest.mark.parametrize(
    ("period", "start", "end"),
    [
        ("day", ts(2026, 12, 30), ts(2026, 12, 31)),
        ("week", ts(2026, 12, 28), ts(2027, 1, 4)),  # Monday to Monday
        ("month", ts(2026, 12, 1), ts(2027, 1, 1)),  # December rolls into a new year
    ],
)
def test_period_bounds_are_utc_calendar_periods(
    period: BudgetPeriod, start: float, end: float
) -> None:
    assert period_bounds(period, NOW) == (start, end)
    assert period_bounds(period, start) == (start, end)
    assert period_bounds(period, end)[0] == end
    assert period_bounds("total", NOW) == (0.0, None)


def _refused(guard: BudgetGuard, tenant: Tenant, now_s: float) -> RouterError:
    with pytest.raises(RouterError) as caught:
        guard.check(tenant, now_s)
    error = caught.value
    assert (error.status, error.type, error.code) == (429, "insufficient_quota", "budget_exceeded")
    return error


def test_spending_the_budget_refuses_until_the_next_period(ledger: Ledger) -> None:
    guard = BudgetGuard(ledger, clock=lambda: NOW)
    guard.check(MONTHLY, NOW)
    spend(ledger, "monthly", NOW, 9.99)
    guard.add(MONTHLY, 9.99, NOW)
    guard.check(MONTHLY, NOW)
    spend(ledger, "monthly", NOW + 1, 0.02)
    guard.add(MONTHLY, 0.02, NOW + 1)
    error = _refused(guard, MONTHLY, NOW + 2)
    assert error.headers == {"Retry-After": str(int(ts(2027, 1, 1) - (NOW + 2)))}
    assert "monthly budget" in error.message and "2027-01-01T00:00:00Z" in error.message
    guard.check(MONTHLY, ts(2027, 1, 1))  # a new month
    assert guard.status(MONTHLY, ts(2027, 1, 1)).spent_usd == 0.0


def test_retry_after_is_at_least_one_second(ledger: Ledger) -> None:
    guard = BudgetGuard(ledger, clock=lambda: NOW)
    broke = Tenant("broke", budget_usd=0.0, budget_period="day")
    assert _refused(guard, broke, ts(2026, 12, 30, 23, 59, 59) + 0.9).headers["Retry-After"] == "1"


def test_a_total_budget_has_no_retry_after(ledger: Ledger) -> None:
    lifetime = Tenant("lifetime", budget_usd=1.0, budget_period="total")
    spend(ledger, "lifetime", ts(2020, 1, 1), 1.0)
    error = _refused(BudgetGuard(ledger, clock=lambda: NOW), lifetime, NOW)
    assert error.headers == {}
    assert "total budget" in error.message and "does not reset" in error.message


def test_a_restarted_router_still_enforces_the_budget(tmp_path: Path) -> None:
    path = tmp_path / "ledger.db"
    with Ledger(path) as ledger:
        spend(ledger, "monthly", ts(2026, 11, 30), 50.0)  # last month: does not count
        spend(ledger, "monthly", ts(2026, 12, 2), 6.0)
        spend(ledger, "monthly", ts(2026, 12, 29), 4.0)
        spend(ledger, "other", ts(2026, 12, 29), 40.0)
    with Ledger(path) as ledger:
        guard = BudgetGuard(ledger, clock=lambda: NOW, tenants=[MONTHLY])
        assert guard.status(MONTHLY).spent_usd == 10.0
        _refused(guard, MONTHLY, NOW)


def test_add_only_updates_tracked_tenants_and_the_ledger_fills_the_rest(ledger: Ledger) -> None:
    guard = BudgetGuard(ledger, clock=lambda: NOW)
    # Not yet checked: the guard learns this attempt from the ledger, not from add().
    spend(ledger, "monthly", NOW, 4.0)
    guard.add(MONTHLY, 4.0, NOW)
    assert guard.status(MONTHLY, NOW).spent_usd == 4.0
    # Rolled over inside add(): the next check reads the new period from the ledger.
    january = ts(2027, 1, 1, 0, 0, 1)
    spend(ledger, "monthly", january, 3.0)
    guard.add(MONTHLY, 3.0, january)
    assert guard.status(MONTHLY, january).spent_usd == 3.0


def test_a_reload_that_changes_the_period_reads_the_new_period(ledger: Ledger) -> None:
    guard = BudgetGuard(ledger, clock=lambda: NOW)
    spend(ledger, "monthly", ts(2026, 12, 2), 8.0)
    spend(ledger, "monthly", NOW - 60, 1.0)
    guard.check(MONTHLY, NOW)
    daily = dataclasses.replace(MONTHLY, budget_period="day", budget_usd=2.0)
    guard.check(daily, NOW)
    assert guard.status(daily, NOW).spent_usd == 1.0


def test_unlimited_tenants_are_never_refused(ledger: Ledger) -> None:
    spend(ledger, "anonymous", NOW, 1e6)
    guard = BudgetGuard(ledger, clock=lambda: NOW)
    guard.check(ANONYMOUS)
    status = guard.status(ANONYMOUS)
    assert (status.budget_usd, status.remaining_usd, status.spent_usd) == (None, None, 1e6)


def test_a_period_counts_from_its_first_second_to_its_last(ledger: Ledger) -> None:
    """Spend is kept per UTC day: the second before a week starts is last week's."""
    weekly = Tenant("weekly", budget_usd=10.0, budget_period="week")
    spend(ledger, "weekly", ts(2026, 12, 27, 23, 59, 59), 100.0)  # Sunday, last week
    spend(ledger, "weekly", ts(2026, 12, 28), 4.0)  # Monday 00:00: this week
    spend(ledger, "weekly", ts(2027, 1, 3, 23, 59, 59), 5.0)  # Sunday, this week
    spend(ledger, "weekly", ts(2027, 1, 4), 1000.0)  # next week
    assert BudgetGuard(ledger, clock=lambda: NOW).status(weekly).spent_usd == 9.0


def test_requests_in_flight_hold_their_most_against_the_budget(ledger: Ledger) -> None:
    guard = BudgetGuard(ledger, clock=lambda: NOW)
    # $10 a month; each request may cost up to $4 (its max_tokens at the dearest price).
    holds = [guard.check(MONTHLY, NOW, 4.0) for _ in range(3)]  # $0 + $8 held < $10
    error = _refused(guard, MONTHLY, NOW)  # $12 held: a burst cannot overspend
    assert error.headers == {"Retry-After": "1"}  # not the end of the month: they will end
    assert "in flight" in error.message and "$12.0000 held" in error.message
    # One ends having cost $1: its hold goes, its cost stays. $1 spent + $8 held < $10.
    spend(ledger, "monthly", NOW, 1.0)
    guard.add(MONTHLY, 1.0, NOW)
    guard.release(MONTHLY, holds.pop())
    holds.append(guard.check(MONTHLY, NOW, 4.0))
    _refused(guard, MONTHLY, NOW)  # $1 + $12 held
    for hold in holds:
        guard.release(MONTHLY, hold)
    assert guard.check(MONTHLY, NOW, 4.0) == 4.0  # all ended: $1 of $10 spent
    assert guard.status(MONTHLY, NOW).spent_usd == 1.0  # holds are not spend


def test_what_a_stream_bills_as_it_goes_moves_from_its_hold_to_the_spend(ledger: Ledger) -> None:
    """A stream's row is billed from its first token on: the part billed is spend, and its
    hold keeps only the rest, so the two together never count it twice."""
    guard = BudgetGuard(ledger, clock=lambda: NOW)
    hold = guard.check(MONTHLY, NOW, 6.0)
    spend(ledger, "monthly", NOW, 2.5)  # billed so far
    guard.add(MONTHLY, 2.5, NOW)
    guard.shrink_hold(MONTHLY, 2.5)
    guard.check(MONTHLY, NOW, 6.0)  # $2.5 spent + $3.5 held < $10: admitted
    error = _refused(guard, MONTHLY, NOW)
    assert "$2.5000 spent" in error.message and "$9.5000 held" in error.message
    guard.release(MONTHLY, hold - 2.5)  # the stream ends having cost what it billed
    guard.release(MONTHLY, 6.0)
    guard.check(MONTHLY, NOW, 7.5)
    assert "$7.5000 held" in _refused(guard, MONTHLY, NOW).message  # the others' holds: gone
    assert guard.status(MONTHLY, NOW).spent_usd == 2.5


def test_a_burst_of_concurrent_requests_cannot_overspend_the_budget(
    tmp_path: Path, served: Callable[[Any], AbstractContextManager[str]]
) -> None:
    # $1 per output token: a 5-token reply costs $5, the whole budget.
    with tenant_router(
        served,
        tmp_path / "ledger.sqlite",
        tmp_path,
        budget="budgetUsd: 5, budgetPeriod: day",
        pool="billing: {outputPerMillionUsd: 1000000}",
        max_num_seqs=32,
    ) as (_, url):
        body = {"model": "coder", "messages": [{"role": "user", "content": "hi"}],
                "max_tokens": 5, "ignore_eos": True}  # fmt: skip

        def ask(_: int) -> httpx.Response:
            return httpx.post(url + "/v1/chat/completions", json=body, headers=KEY, timeout=60)

        with ThreadPoolExecutor(20) as pool:
            replies = list(pool.map(ask, range(20)))
        spent = httpx.get(url + "/v1/usage", headers=KEY).json()["budget"]["spent_usd"]
    served_ok = [r for r in replies if r.status_code == 200]
    refused = [r for r in replies if r.status_code == 429]
    assert len(served_ok) + len(refused) == 20
    # The first holds $5 while it runs: the others are refused, not served on credit.
    assert len(served_ok) == 1 and spent == pytest.approx(5.0, rel=0.01)
    assert all(r.json()["error"]["code"] == "budget_exceeded" for r in refused)


def test_an_auto_request_holds_the_price_of_the_dearest_tier_it_may_move_to(
    tmp_path: Path, served: Callable[[Any], AbstractContextManager[str]]
) -> None:
    # `service_tier: auto` resolves to batched (almost free) but may move to premium ($1 per
    # 1,000 output tokens) when batched is busy: 2,000 tokens there cost $2, over the $1 budget.
    with tenant_router(
        served,
        tmp_path / "ledger.sqlite",
        tmp_path,
        budget="budgetUsd: 1, budgetPeriod: day",
        pool="billing: {outputPerMillionUsd: 1}",
        premium="billing: {outputPerMillionUsd: 1000}",
    ) as (_, url):
        body = {"model": "coder", "messages": [{"role": "user", "content": "hi"}],
                "max_tokens": 2000, "ignore_eos": True, "service_tier": "auto"}  # fmt: skip
        with httpx.stream("POST", url + "/v1/chat/completions", json={**body, "stream": True},
                          headers=KEY, timeout=60) as first:  # fmt: skip
            assert first.status_code == 200
            lines = first.iter_lines()  # kept: a dropped iterator closes the stream
            next(lines)  # in flight, holding
            second = httpx.post(url + "/v1/chat/completions", json=body, headers=KEY, timeout=60)
        assert second.status_code == 429, second.text
        assert second.headers["retry-after"] == "1"
        assert "in flight" in second.json()["error"]["message"]
        # Without `auto` the request can only be served on batched: it holds batched's price.
        plain = {k: v for k, v in body.items() if k != "service_tier"}
        with httpx.stream("POST", url + "/v1/chat/completions", json={**plain, "stream": True},
                          headers=KEY, timeout=60) as first:  # fmt: skip
            lines = first.iter_lines()
            next(lines)
            second = httpx.post(url + "/v1/chat/completions", json=plain, headers=KEY, timeout=60)
        assert second.status_code == 200, second.text


def test_a_second_spelling_of_the_output_cap_cannot_spend_past_the_budget(
    tmp_path: Path, served: Callable[[Any], AbstractContextManager[str]]
) -> None:
    """A completions body that says `max_completion_tokens: 1` and `max_tokens: 2000`: the
    router holds (and the node is sent) one cap, so ten at once spend at most the budget and
    one request's most."""
    with tenant_router(
        served,
        tmp_path / "ledger.sqlite",
        tmp_path,
        budget="budgetUsd: 5, budgetPeriod: day",
        pool="billing: {outputPerMillionUsd: 1000000}",  # $1 an output token; prompts are free
        max_num_seqs=32,
    ) as (_, url):
        body = {"model": "coder", "prompt": "hi", "max_completion_tokens": 1, "max_tokens": 2000,
                "ignore_eos": True}  # fmt: skip

        def ask(_: int) -> httpx.Response:
            return httpx.post(url + "/v1/completions", json=body, headers=KEY, timeout=60)

        with ThreadPoolExecutor(10) as pool:
            replies = list(pool.map(ask, range(10)))
        spent = httpx.get(url + "/v1/usage", headers=KEY).json()["budget"]["spent_usd"]
    served_ok = [r for r in replies if r.status_code == 200]
    assert served_ok and all(r.status_code in (200, 429) for r in replies)
    assert all(r.json()["usage"]["completion_tokens"] == 1 for r in served_ok)
    assert spent <= 5 + 1  # the budget, and one request's hold ($1)


def test_a_request_without_an_output_cap_is_capped_at_what_the_budget_pays(
    tmp_path: Path, served: Callable[[Any], AbstractContextManager[str]]
) -> None:
    """A backend may fill the whole context when a request sets no cap (vLLM does): at $10 per
    million output tokens a 131,072-token context costs $1.31. With $0.001 of budget left the
    router sends the node a cap of the 100 tokens that pays for (finish_reason `length`), so
    the budget is spent to the token, not overshot by a context; then it is spent."""
    with tenant_router(
        served,
        tmp_path / "ledger.sqlite",
        tmp_path,
        budget="budgetUsd: 0.001, budgetPeriod: day",
        pool="billing: {outputPerMillionUsd: 10, inputPerMillionUsd: 0}",
        node_default_max_tokens=60_000,
    ) as (_, url):
        body = {"model": "coder", "messages": [{"role": "user", "content": "hi"}],
                "ignore_eos": True}  # fmt: skip
        reply = httpx.post(url + "/v1/chat/completions", json=body, headers=KEY, timeout=60)
        assert reply.status_code == 200, reply.text
        assert reply.json()["usage"]["completion_tokens"] == 100
        assert reply.json()["choices"][0]["finish_reason"] == "length"
        spent = httpx.get(url + "/v1/usage", headers=KEY).json()["budget"]["spent_usd"]
        assert spent == pytest.approx(0.001)
        after = httpx.post(url + "/v1/chat/completions", json=body, headers=KEY, timeout=60)
        assert after.status_code == 429, after.text
        assert after.json()["error"]["code"] == "budget_exceeded"


def test_uncapped_requests_in_flight_share_what_the_budget_has_left(
    tmp_path: Path, served: Callable[[Any], AbstractContextManager[str]]
) -> None:
    """The first uncapped stream holds the whole budget ($1: 100,000 tokens at $10 a
    million), so a second request finds nothing left and waits for it, where before the cap
    it would have been served on credit."""
    with tenant_router(
        served,
        tmp_path / "ledger.sqlite",
        tmp_path,
        budget="budgetUsd: 1, budgetPeriod: day",
        pool="billing: {outputPerMillionUsd: 10, inputPerMillionUsd: 0}",
        # The first stream is still going when the second request comes, however busy the
        # machine: it would run for tens of seconds (it is closed long before).
        node_default_max_tokens=60_000,
    ) as (_, url):
        body = {"model": "coder", "messages": [{"role": "user", "content": "hi"}]}
        with httpx.stream("POST", url + "/v1/chat/completions", json={**body, "stream": True},
                          headers=KEY, timeout=60) as first:  # fmt: skip
            assert first.status_code == 200
            lines = first.iter_lines()  # kept: a dropped iterator closes the stream
            next(lines)  # in flight, holding
            second = httpx.post(url + "/v1/chat/completions", json=body, headers=KEY, timeout=60)
        assert second.status_code == 429, second.text
        assert "in flight" in second.json()["error"]["message"]


@pytest.mark.parametrize("stream", [False, True])
def test_every_hold_is_released_even_one_of_nothing(
    tmp_path: Path, served: Callable[[Any], AbstractContextManager[str]], stream: bool
) -> None:
    """A free pool's requests hold $0 against a budget; each hold is still counted in and out,
    so none is left behind once the requests end (a stream's, billed as it goes, too)."""
    with tenant_router(
        served,
        tmp_path / "ledger.sqlite",
        tmp_path,
        budget="budgetUsd: 5, budgetPeriod: day",
        pool="billing: {outputPerMillionUsd: 0}",
    ) as (app, url):
        body = {"model": "coder", "messages": [{"role": "user", "content": "hi"}],
                "max_tokens": 3, "stream": stream}  # fmt: skip
        for _ in range(3):
            r = httpx.post(url + "/v1/chat/completions", json=body, headers=KEY, timeout=60)
            assert r.status_code == 200, r.text
            assert app.router.budgets._held == {}


def test_a_budget_a_reload_adds_keeps_the_holds_taken_under_it(ledger: Ledger) -> None:
    """Requests admitted while the tenant had no budget held nothing: ending after a reload
    gave it one, they release nothing of the holds its requests took since."""
    guard = BudgetGuard(ledger, clock=lambda: NOW)
    accountant = Accountant(ledger, guard, None, None, lambda: 0.0, lambda: NOW)  # type: ignore[arg-type]

    def admitted(tenant: Tenant) -> Exchange:
        ex = Exchange("r", 0.0, {}, receive=None, send=None, tenant=tenant)  # type: ignore[arg-type]
        ex.hold_usd = guard.check(tenant, NOW, 4.0)
        return ex

    unbudgeted = dataclasses.replace(MONTHLY, budget_usd=None)
    before = [admitted(unbudgeted) for _ in range(3)]
    assert [ex.hold_usd for ex in before] == [None] * 3  # nothing held
    after = [admitted(MONTHLY) for _ in range(2)]  # $8 of its $10 held
    for ex in before:
        accountant.release(ex)
    after.append(admitted(MONTHLY))  # $8 < $10: one more, now $12 held
    _refused(guard, MONTHLY, NOW)  # the holds taken under the budget still count
