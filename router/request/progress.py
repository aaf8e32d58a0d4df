"""The record of one request (or one cascade attempt) as it goes through the router."""

from __future__ import annotations

from dataclasses import dataclass

from tiergate.router.base.tiers import Tier
from tiergate.router.discovery.view import RoutedPool
from tiergate.router.ledger.entry import LedgerEntry
from tiergate.router.ledger.records import Outcome


@dataclass
class Progress:
    """What happened to one request, filled in as it goes (for metrics and the ledger)."""

    outcome: Outcome = "error"
    status: int = 500
    tier_served: Tier | None = None
    pool: RoutedPool | None = None
    endpoint: str | None = None
    prompt_tokens: int = 0
    completion_tokens: int = 0
    ttft_s: float | None = None
    cost_usd: float = 0.0
    estimated_tokens: int = 0  # what the rate limiter charged up front
    attempt: int = 1  # 2 for the second attempt of an escalated cascade
    escalated: bool = False
    entry: LedgerEntry | None = None  # its row in the ledger, once written
    billed_usd: float = 0.0  # its cost counted against the tenant's budget so far
    accounted: bool = False  # counted and billed for good (router/request/accounting.py)
