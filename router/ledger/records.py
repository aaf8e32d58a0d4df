"""What the ledger records, whatever keeps it: one attempt's row, the totals read back, and
the UTC day rows and budgets are counted by."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from tiergate.router.base.tiers import Tier

__all__ = [
    "MAX_DAY",
    "LedgerError",
    "Outcome",
    "TierTotals",
    "UsageRecord",
    "UsageTotals",
    "utc_day",
]

#: How a request attempt ended. `shed`: refused by admission; `rejected`: refused before
#: routing (limits, budget); `client_disconnect`: the client went away mid-request;
#: `incomplete`: a stream in flight (its row is written from its first token on, and amended
#: as it goes); `interrupted`: a stream whose router process died before it ended, billed for
#: what it had relayed by then (the PostgreSQL ledger closes such rows once the process's lease
#: has expired; in the SQLite ledger they stay `incomplete`).
Outcome = Literal[
    "ok",
    "error",
    "upstream_error",
    "shed",
    "rejected",
    "client_disconnect",
    "incomplete",
    "interrupted",
]


class LedgerError(Exception):
    """The ledger cannot be opened or used."""


@dataclass(frozen=True, slots=True)
class UsageRecord:
    """One attempt of one request, as billed."""

    request_id: str  # router-generated; never a client-supplied id, which may repeat
    time_s: float  # Unix time the attempt finished; budgets bill it to that period
    tenant: str
    tier_requested: Tier
    tier_served: Tier | None  # None: never reached a pool
    pool: str | None
    endpoint: str | None
    prompt_tokens: int
    completion_tokens: int
    latency_s: float
    ttft_s: float | None  # None: no token was streamed
    cost_usd: float  # at the served tier's price
    http_status: int
    outcome: Outcome
    escalated: bool = False  # the cascade escalated this request (set on both attempts)
    attempt: int = 1


@dataclass(frozen=True, slots=True)
class TierTotals:
    """Usage served by one tier."""

    requests: int  # attempts served by this tier (a cascade counts on both tiers)
    prompt_tokens: int
    completion_tokens: int
    cost_usd: float


@dataclass(frozen=True, slots=True)
class UsageTotals:
    """A tenant's usage over the whole ledger."""

    requests: int  # distinct requests (first attempts)
    attempts: int  # rows, counting both attempts of a cascade
    prompt_tokens: int
    completion_tokens: int
    cost_usd: float
    by_tier_served: dict[Tier, TierTotals] = field(default_factory=dict)


def utc_day(time_s: float) -> int:
    """The UTC day of a Unix time, counted from 1970-01-01 (Unix days have 86,400 s)."""
    return int(time_s // 86400)


#: Beyond any day a Unix time of this era falls on (an open end for day ranges).
MAX_DAY = 1 << 40
