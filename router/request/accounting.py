"""Accounting for a request's attempts: metrics, the rate limiter's correction, the ledger row
and the tenant's budget, once per attempt.

A billing failure is loud (a metric, a log line), never fatal to the reply or to a cascade's
second attempt. The ledger row goes in before the budget counts the cost, with no await in
between (router/tenants/budgets.py's contract), and even a row the ledger refused counts against the
budget: a ledger failure must not lift one.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from tiergate.router.base.errors import RouterError
from tiergate.router.base.metrics import AccountingMetrics
from tiergate.router.base.tiers import DEFAULT_TIER
from tiergate.router.ledger.records import LedgerError, Outcome, UsageRecord
from tiergate.router.ledger.store import LedgerStore
from tiergate.router.request.exchange import Exchange
from tiergate.router.request.progress import Progress
from tiergate.router.tenants.guards import Budgets, Limits

__all__ = ["Accountant", "ledger_unavailable"]

log = logging.getLogger("tiergate.router")


class Accountant:
    """Counts and bills the attempts of every request."""

    def __init__(
        self,
        ledger: LedgerStore,
        budgets: Budgets,
        limiter: Limits,
        metrics: AccountingMetrics,
        clock: Callable[[], float],
        wall: Callable[[], float],
    ) -> None:
        self.ledger, self.budgets, self.limiter, self.metrics = ledger, budgets, limiter, metrics
        self._clock, self._wall = clock, wall

    async def settle(self, ex: Exchange) -> None:
        """Account for the attempt being served and wait for its row to be committed: awaited
        before a reply's last bytes go out, so a reply the client has whole is in the ledger
        even if the router is killed right after. RouterError 503 `ledger_unavailable` when
        the row could be made durable nowhere (the shared ledger is away and the spool full):
        the reply's end must not go out."""
        self.account(ex, ex.done)
        try:
            await self.ledger.committed()
        except LedgerError as exc:
            self.metrics.ledger_refusals.inc()
            log.error("event=reply_withheld request_id=%s error=%s", ex.request_id, exc)
            self._withheld(ex)
            raise ledger_unavailable() from None

    def _withheld(self, ex: Exchange) -> None:
        """The reply's end does not go out, and its row says so: an `error`, and for a whole
        reply, which the client never has, a 503 billed nothing (a client that retries it is
        billed once). A stream is billed for what it relayed, which the client has."""
        done = ex.done
        if ex.tenant is None or ex.choice is None or done.entry is None:
            return
        done.outcome = "error"
        if ex.request is None or not ex.request.stream:
            done.status, done.cost_usd = 503, 0.0
        try:
            self._bill(ex, done, done.outcome)
        except Exception:
            self._failed(ex)

    def account(self, ex: Exchange, done: Progress) -> None:
        """Count and bill one attempt of `ex`, once (later calls for it do nothing)."""
        if done.accounted:
            return
        done.accounted = True
        try:
            choice = ex.choice
            requested = choice.tier if choice is not None else DEFAULT_TIER
            self.metrics.requests.labels(requested, done.tier_served or "none", done.outcome).inc()
            if done.tier_served is not None:
                tier = done.tier_served
                if done.ttft_s is not None:
                    self.metrics.ttft.labels(tier).observe(done.ttft_s)
                self.metrics.cost.labels(tier).inc(done.cost_usd)
                self.metrics.tokens.labels(tier, "prompt").inc(done.prompt_tokens)
                self.metrics.tokens.labels(tier, "completion").inc(done.completion_tokens)
            if ex.tenant is None or choice is None:
                return  # unauthenticated or unparsable: no tenant to bill
            actual = done.prompt_tokens + done.completion_tokens
            self.limiter.settle(ex.tenant, self._clock(), actual - done.estimated_tokens)
            self._bill(ex, done, done.outcome)
        except Exception:
            self._failed(ex)

    def bill_so_far(self, ex: Exchange) -> None:
        """A stream's row as it stands: written at its first token and amended as it goes, so
        a router killed mid-stream has billed what it relayed. What it bills moves from the
        request's budget hold to the tenant's spend."""
        if ex.tenant is None or ex.choice is None:
            return
        done = ex.done
        grew_usd = done.cost_usd - done.billed_usd
        try:
            self._bill(ex, done, "incomplete")
        except Exception:
            self._failed(ex)
        if ex.hold_usd is not None:
            moved_usd = min(grew_usd, ex.hold_usd)
            self.budgets.shrink_hold(ex.tenant, moved_usd)
            ex.hold_usd -= moved_usd

    def release(self, ex: Exchange) -> None:
        """End the request's budget hold (its attempts' costs are counted by now)."""
        if ex.hold_usd is not None and ex.tenant is not None:
            self.budgets.release(ex.tenant, ex.hold_usd)
        ex.hold_usd = None

    def _bill(self, ex: Exchange, done: Progress, outcome: Outcome) -> None:
        """Write the attempt's row as `done` says now (its first write adds it, later ones
        amend it), then count what its cost grew by against the tenant's budget."""
        assert ex.tenant is not None and ex.choice is not None
        usage = UsageRecord(
            request_id=ex.request_id,
            time_s=self._wall(),
            tenant=ex.tenant.name,
            tier_requested=ex.choice.tier,
            tier_served=done.tier_served,
            pool=done.pool.spec.name if done.pool else None,
            endpoint=done.endpoint,
            prompt_tokens=done.prompt_tokens,
            completion_tokens=done.completion_tokens,
            latency_s=self._clock() - ex.started_s,
            ttft_s=done.ttft_s,
            cost_usd=done.cost_usd,
            http_status=done.status,
            outcome=outcome,
            escalated=done.escalated,
            attempt=done.attempt,
        )
        grew_usd = done.cost_usd - done.billed_usd
        try:
            if done.entry is None:
                done.entry = self.ledger.add(usage)
            else:
                self.ledger.amend(done.entry, usage)
        finally:
            if grew_usd:
                self.budgets.add(ex.tenant, grew_usd, usage.time_s)
            done.billed_usd = done.cost_usd

    def _failed(self, ex: Exchange) -> None:
        self.metrics.accounting_errors.inc()
        log.exception("event=accounting_failed request_id=%s", ex.request_id)


def ledger_unavailable() -> RouterError:
    """The refusal of a request whose usage cannot be recorded durably now."""
    return RouterError(
        503,
        "the usage ledger cannot record requests now; retry shortly",
        type="server_error",
        code="ledger_unavailable",
        headers={"Retry-After": "1"},
    )
