"""Rate limits held across every router replica and worker, through the PostgreSQL ledger.

A tenant's requests-per-minute and tokens-per-minute buckets live in the database
(`rate_bucket`, refilled by the database's clock: router/ledger/postgres_schema.py
`tiergate_take_tokens`). Each replica takes tokens from them in slices and admits requests from
its slice with no round trip, as router/tenants/ratelimit.py does from a local bucket; it asks
again when its slice runs short. Tokens only ever leave the shared bucket, so the fleet admits
no more than one bucket would: a minute's allowance at once, then the steady rate. A slice a
replica did not use is given back at its next renewal (every `renew_s`); one a dead replica
held is lost, which admits less, never more.

While the database cannot be reached, each replica falls back to a bucket of its own at the
full rate (a tenant may then get up to one allowance per replica) until a round trip succeeds.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Collection
from dataclasses import dataclass

from tiergate.router.base.background import LoopService
from tiergate.router.ledger.postgres import PostgresLedger
from tiergate.router.ledger.records import LedgerError
from tiergate.router.tenants.ratelimit import RateLimiter, rate_limited
from tiergate.router.tenants.registry import Tenant

__all__ = ["FleetRateLimiter"]

log = logging.getLogger("tiergate.router")

#: A slice is this share of a bucket's capacity (at least what the request needs).
SLICE = 1 / 16
#: How often unused slices go back.
RENEW_S = 1.0


@dataclass(slots=True)
class _Slice:
    level: float = 0.0  # tokens this replica took and has not spent; negative: debt
    wait_s: float = 0.0  # from the last refusal: when the shared bucket will hold enough
    active: bool = False


class FleetRateLimiter(LoopService):
    """Requests/min and tokens/min per tenant over the fleet (a service: `start`, `stop`)."""

    task_name = "rate-slices"

    def __init__(
        self,
        ledger: PostgresLedger,
        clock: Callable[[], float] = time.monotonic,
        *,
        renew_s: float = RENEW_S,
    ) -> None:
        self._ledger = ledger
        self._clock = clock
        self._renew_s = renew_s
        self._local = RateLimiter(clock)  # while the database cannot be reached
        self._degraded = False
        self._slices: dict[tuple[str, str], _Slice] = {}
        self._capacity: dict[tuple[str, str], int] = {}
        self._locks: dict[str, asyncio.Lock] = {}
        self.round_trips = 0
        self.failures = 0

    def _needs(self, tenant: Tenant, estimated_tokens: int) -> list[tuple[str, int, float]]:
        """(kind, capacity, tokens short) for each bucket whose slice cannot admit now."""
        short = []
        for kind, capacity, need in (
            ("requests", tenant.requests_per_minute, 1.0),
            ("tokens", tenant.tokens_per_minute, float(estimated_tokens)),
        ):
            if capacity is None:
                continue
            need = min(need, float(capacity))
            have = self._slice(tenant.name, kind, capacity).level
            if have < need:
                short.append((kind, capacity, need - have))
        return short

    def _slice(self, name: str, kind: str, capacity: int) -> _Slice:
        key = (name, kind)
        self._capacity[key] = capacity
        got = self._slices.get(key)
        if got is None:
            got = self._slices[key] = _Slice()
        return got

    def needs_lease(self, tenant: Tenant, estimated_tokens: int) -> bool:
        if self._degraded or (
            tenant.requests_per_minute is None and tenant.tokens_per_minute is None
        ):
            return False
        return bool(self._needs(tenant, estimated_tokens))

    async def lease(self, tenant: Tenant, estimated_tokens: int) -> None:
        """Take slices from the shared buckets for what this request lacks."""
        lock = self._locks.setdefault(tenant.name, asyncio.Lock())
        async with lock:
            for kind, capacity, short in self._needs(tenant, estimated_tokens):
                want = short + capacity * SLICE
                if not await self._take(tenant.name, kind, capacity, 0.0, short, want):
                    return

    async def _take(
        self, name: str, kind: str, capacity: int, give: float, need: float, want: float
    ) -> bool:
        piece = self._slice(name, kind, capacity)
        try:
            pool = await self._ledger.connection_pool()
            row = await pool.fetchrow(
                "SELECT * FROM tiergate_take_tokens($1, $2, $3, $4, $5, $6)",
                name, kind, float(capacity), give, need, want,
            )  # fmt: skip
        except (LedgerError, OSError, TimeoutError) as exc:
            return self._failed(exc)
        except Exception as exc:  # asyncpg's errors
            if type(exc).__module__.startswith("asyncpg"):
                return self._failed(exc)
            raise
        self.round_trips += 1
        if self._degraded:
            log.warning("event=rate_limits_shared_again")
            self._degraded = False
        piece.level += float(row["granted"]) - give
        piece.wait_s = float(row["wait_s"])
        return True

    def _failed(self, exc: BaseException) -> bool:
        self.failures += 1
        if not self._degraded:
            reason = (str(exc).strip() or type(exc).__name__).splitlines()[0]
            log.warning("event=rate_limits_local error=%s", reason)
            self._degraded = True
        return False

    def check(self, tenant: Tenant, now_s: float | None = None, estimated_tokens: int = 0) -> None:
        """Admit one request from this replica's slices, or raise RouterError(429)."""
        if tenant.requests_per_minute is None and tenant.tokens_per_minute is None:
            return
        if self._degraded:
            self._local.check(tenant, now_s, estimated_tokens)
            return
        short = self._needs(tenant, estimated_tokens)
        if short:
            reasons, wait_s = [], 0.0
            for kind, capacity, _ in short:
                wait_s = max(wait_s, self._slices[(tenant.name, kind)].wait_s)
                reasons.append(f"{capacity} {kind} per minute")
            raise rate_limited(tenant, reasons, wait_s)
        if tenant.requests_per_minute is not None:
            piece = self._slices[(tenant.name, "requests")]
            piece.level -= 1.0
            piece.active = True
        if tenant.tokens_per_minute is not None:
            piece = self._slices[(tenant.name, "tokens")]
            piece.level -= estimated_tokens
            piece.active = True

    def settle(self, tenant: Tenant, now_s: float | None = None, token_delta: int = 0) -> None:
        """Correct this replica's token slice by `actual - estimated` tokens (debt is paid from
        the shared bucket with the next slice)."""
        tpm = tenant.tokens_per_minute
        if tpm is None or token_delta == 0:
            return
        if self._degraded:
            self._local.settle(tenant, now_s, token_delta)
            return
        self._slice(tenant.name, "tokens", tpm).level -= token_delta

    def prune(self, keep: Collection[str]) -> None:
        self._local.prune(keep)
        for key in [key for key in self._slices if key[0] not in keep]:
            del self._slices[key]

    # Renewing.

    async def stop(self) -> None:
        """Stop renewing and give back every slice."""
        await super().stop()
        await self.renew(everything=True)

    async def _run(self) -> None:
        while True:
            await asyncio.sleep(self._renew_s)
            await self.renew()

    async def renew(self, *, everything: bool = False) -> None:
        """Give back the slices not used since the last renewal (all of them: `everything`);
        while degraded, one round trip tells whether the database is back."""
        for (name, kind), piece in list(self._slices.items()):
            active, piece.active = piece.active, False
            if piece.level > 0 and (everything or not active):
                await self._take(name, kind, self._capacity[(name, kind)], piece.level, 0, 0)
        if self._degraded and not everything:
            await self._probe()

    async def _probe(self) -> None:
        try:
            pool = await self._ledger.connection_pool()
            await pool.fetchval("SELECT 1")
        except Exception as exc:  # still unreachable: stay local
            self.failures += 1
            log.debug("event=rate_limits_probe_failed error=%s", type(exc).__name__)
            return
        log.warning("event=rate_limits_shared_again")
        self._degraded = False
