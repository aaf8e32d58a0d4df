"""Fair share across every router replica and worker, through the PostgreSQL ledger.

Each process admits a tier's requests in its own queue (router/tier_queue.py). Left alone,
every process would fill all of the tier's slots, and the nodes would serve the surplus first
come, first served. So every `period_s` each process publishes, per tier and tenant, the slots
it holds, the requests it has waiting and the tokens it served lately, and reads back every
live process's claims, in one round trip (`tiergate_share_exchange`,
router/ledger/postgres_schema.py). From them it works out the fleet's allotment
(router/fleet_allotment.py) and fills only its own part of each tier.

A request held over a part that moved away (the fleet holds its slot back where the part went)
ending makes the process exchange at once, not at its next period: the slot's new holder
learns sooner that it is free.

A claim lives `ttl_s` after it was published: a process that died stops claiming then, and its
slots go to the others. While the database cannot be reached (or does not answer within
`ttl_s`), the last allotment holds until it is `ttl_s` old; then each process fills the whole
tier on its own, as without a fleet, until an exchange succeeds again.
"""

from __future__ import annotations

import asyncio
import logging
import math
import time
from collections.abc import Callable, Mapping

from tiergate.router.base.background import LoopService
from tiergate.router.base.tiers import Tier
from tiergate.router.fleet_allotment import Claim, HolderSlots, allot
from tiergate.router.ledger.postgres import PostgresLedger
from tiergate.router.ledger.records import LedgerError
from tiergate.router.tenants.fleet_budgets import holder_id
from tiergate.router.tier_queue import FleetSlots, TierQueue

__all__ = ["FleetShare", "PERIOD_S"]

log = logging.getLogger("tiergate.router")

#: How often a process exchanges its claims.
PERIOD_S = 0.2
#: A claim not renewed for this many periods is void (at least a second).
TTL_PERIODS = 5
#: Tokens served count half as much after this long (which tenant the fleet served least
#: lately, for the slots fractions leave over).
SERVED_HALF_LIFE_S = 5.0
#: Recent service below this many tokens is forgotten.
_FORGET_TOKENS = 0.5


class FleetShare(LoopService):
    """This process's part of each tier's slots, exchanged every `period_s` (a service:
    `start`, `stop`)."""

    task_name = "fair-share"

    def __init__(
        self,
        ledger: PostgresLedger,
        queues: Callable[[], Mapping[str, TierQueue]],
        *,
        period_s: float = PERIOD_S,
        holder: str | None = None,
        monotonic: Callable[[], float] = time.monotonic,
    ) -> None:
        self._ledger = ledger
        self._queues = queues
        self.period_s = period_s
        self.ttl_s = max(1.0, TTL_PERIODS * period_s)
        self.holder = holder or holder_id()
        self._monotonic = monotonic
        #: Whether the queues fill the fleet's allotment now (else each the whole tier).
        self.shared = False
        self.exchanges = 0
        self.failures = 0
        self.exchange_seconds = 0.0
        self._last_ok_s = -math.inf
        self._recent: dict[tuple[str, str], float] = {}
        self._counted: dict[tuple[str, str], int] = {}
        self._decayed_at_s: float | None = None
        #: Set when a request held over a moved part ends: exchange before the next period.
        self._soon = asyncio.Event()
        self.early_exchanges = 0

    # Claims.

    def claims(self) -> list[tuple[str, Claim]]:
        """What this process claims now, by queue (a tier's, or one of its sets of pools,
        router/admission.py): a mark that it serves the queue (tenant ''), and the counts of
        each tenant holding, waiting for or lately served its slots."""
        self._decay()
        out: list[tuple[str, Claim]] = []
        for tier, queue in self._queues().items():
            out.append((tier, Claim(self.holder, "", 1.0, 0, 0)))
            served = {t for (q, t) in self._recent if q == tier}
            for tenant in sorted({*queue.tenants(), *served}):
                claim = Claim(
                    self.holder, tenant, queue.weight_of(tenant), queue.holding_of(tenant),
                    queue.waiting_of(tenant), self._recent.get((tier, tenant), 0.0),
                )  # fmt: skip
                out.append((tier, claim))
        return out

    def _decay(self) -> None:
        """Bring the recent service up to now: what each queue served since, added to what it
        had, halved every SERVED_HALF_LIFE_S."""
        now_s = self._monotonic()
        since = 0.0 if self._decayed_at_s is None else now_s - self._decayed_at_s
        self._decayed_at_s = now_s
        factor = 0.5 ** (since / SERVED_HALF_LIFE_S)
        for key in self._recent:
            self._recent[key] *= factor
        for tier, queue in self._queues().items():
            for tenant, total in queue.served.items():
                key = (tier, tenant)
                grown = total - self._counted.get(key, 0)
                self._counted[key] = total
                if grown > 0:
                    self._recent[key] = self._recent.get(key, 0.0) + grown
        for key in [k for k, v in self._recent.items() if v < _FORGET_TOKENS]:
            del self._recent[key]

    # Exchanging.

    async def exchange(self) -> bool:
        """Publish this process's claims, read everyone's and apply the allotment; False if
        the database failed (the queues then keep the last allotment until it is stale)."""
        found = self.claims()
        claims = [c for _, c in found]
        columns = (
            [str(tier) for tier, _ in found],
            [c.tenant for c in claims],
            [c.weight for c in claims],
            [c.holding for c in claims],
            [c.waiting for c in claims],
            [c.served for c in claims],
        )
        asked_s = self._monotonic()
        try:
            async with asyncio.timeout(self.ttl_s):
                pool = await self._ledger.connection_pool()
                rows = await pool.fetch(
                    "SELECT * FROM tiergate_share_exchange($1, $2, $3, $4, $5, $6, $7, $8)",
                    self.holder, self.ttl_s, *columns,
                )  # fmt: skip
        except (LedgerError, OSError, TimeoutError) as exc:
            return self._failed(exc)
        except Exception as exc:  # asyncpg's errors
            if type(exc).__module__.startswith("asyncpg"):
                return self._failed(exc)
            raise
        answered_s = self._monotonic()
        self.exchanges += 1
        self.exchange_seconds += answered_s - asked_s
        self._last_ok_s = answered_s
        self.apply(
            [(str(r["tier"]), Claim(str(r["holder"]), str(r["tenant"]), float(r["weight"]),
                                    int(r["holding"]), int(r["waiting"]), float(r["served"])))
             for r in rows]
        )  # fmt: skip
        return True

    def apply(self, rows: list[tuple[str, Claim]]) -> None:
        """Fill each tier's part of the allotment that every live process's claims (`rows`:
        tier, claim) give this process."""
        by_tier: dict[str, list[Claim]] = {}
        for tier, claim in rows:
            by_tier.setdefault(tier, []).append(claim)
        for tier, queue in self._queues().items():
            found = by_tier.get(tier, [])
            if not any(c.holder == self.holder for c in found):
                queue.share_fleet(None)  # new since the claims: alone until it is claimed
                continue
            claims = [c for c in found if c.tenant]
            queue.on_held_over_ended = self._soon.set
            shared = max(queue.capacity - queue.headroom, 0)
            try:
                mine = allot(shared, claims, {c.holder for c in found}).get(self.holder)
            except ValueError as exc:  # a process's claims it should never have published
                log.warning("event=fair_share_claims_refused tier=%s error=%s", tier, exc)
                queue.share_fleet(None)
                continue
            queue.share_fleet(_slots(mine or HolderSlots({}, 0), shared, claims, self.holder))
        if not self.shared:
            log.info("event=fair_share_fleet holder=%s period_s=%s", self.holder, self.period_s)
            self.shared = True

    def allotted(self) -> dict[Tier, int]:
        """The slots of each tier this process fills now, headroom aside (none while it
        fills the whole tier on its own), over the tier's queues."""
        out: dict[Tier, int] = {}
        for queue in self._queues().values():
            if (fleet := queue.fleet) is not None:
                out[queue.tier] = out.get(queue.tier, 0) + fleet.total
        return out

    def _failed(self, exc: BaseException) -> bool:
        self.failures += 1
        if self.shared and self._monotonic() - self._last_ok_s >= self.ttl_s:
            self._local()
            reason = (str(exc).strip() or type(exc).__name__).splitlines()[0]
            log.warning("event=fair_share_local error=%s failures=%d", reason, self.failures)
        return False

    def _local(self) -> None:
        """Every queue fills its whole tier again, on its own."""
        for queue in self._queues().values():
            queue.share_fleet(None)
        self.shared = False

    # Running.

    async def _run(self) -> None:
        next_s = self._monotonic()
        while True:
            self._soon.clear()
            await self.exchange()
            now_s = self._monotonic()
            if next_s <= now_s:
                next_s += self.period_s
                if next_s < now_s:  # an exchange took longer than a period: start afresh
                    next_s = now_s
            try:
                async with asyncio.timeout(next_s - now_s):
                    await self._soon.wait()  # a request held over a moved part ended
                self.early_exchanges += 1
            except TimeoutError:
                pass

    async def stop(self) -> None:
        """Stop exchanging and withdraw this process's claims (they expire anyway)."""
        await super().stop()
        self._local()
        try:
            pool = await self._ledger.connection_pool()
            await pool.execute("DELETE FROM fair_share WHERE holder = $1", self.holder)
        except Exception as exc:  # they expire by themselves
            log.warning("event=fair_share_claims_not_withdrawn error=%s", type(exc).__name__)


def _slots(mine: HolderSlots, shared: int, claims: list[Claim], holder: str) -> FleetSlots:
    weights: dict[str, float] = {}
    holding: dict[str, int] = {}
    for c in claims:
        if c.holder == holder or not c.demand:
            continue
        weights[c.tenant] = max(weights.get(c.tenant, 0.0), c.weight)
        holding[c.tenant] = holding.get(c.tenant, 0) + c.holding
    return FleetSlots(
        dict(mine.tenants), mine.spare, shared, weights, holding, dict(mine.held_over)
    )
