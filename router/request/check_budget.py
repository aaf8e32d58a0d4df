"""Each tenant's budget of cascade check time, in worker-seconds.

A check runs for as long as the client's schema makes it, up to its deadline, and the tenant
pays for the CPU time it used (router/request/tool_check.py says what else costs) from a
bucket: `capacity_s` worker-seconds when full, refilled at `refill_per_s` worker-seconds a
second. A tenant whose bucket is empty (or in debt: a check may cost more than what was left)
has spent its budget. The checker gives such a tenant's checks up at once, without a worker,
until the bucket refills, so no tenant can keep the workers (and the CPU) busy for longer than
its budget, however many checks it sends.
The bucket's level is also the tenant's standing when workers are handed out: the tenant
that has spent the least goes first (router/request/check_share.py).

Pure: the clock is passed in. The budget is per router process, as the workers it protects.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

__all__ = ["CheckBudget"]


@dataclass(slots=True)
class _Bucket:
    level_s: float
    at: float


class CheckBudget:
    """Worker-seconds left per tenant; a tenant never seen (or long idle) has a full bucket."""

    def __init__(
        self,
        *,
        capacity_s: float,
        refill_per_s: float,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if capacity_s <= 0 or refill_per_s <= 0:
            raise ValueError("a check budget needs a positive capacity and refill rate")
        self.capacity_s = capacity_s
        self.refill_per_s = refill_per_s
        self._clock = clock
        self._buckets: dict[str, _Bucket] = {}  # only tenants whose bucket is not full

    def left_s(self, tenant: str) -> float:
        """Worker-seconds the tenant may still spend (negative: in debt)."""
        bucket = self._buckets.get(tenant)
        if bucket is None:
            return self.capacity_s
        now = self._clock()
        level = bucket.level_s + (now - bucket.at) * self.refill_per_s
        if level >= self.capacity_s:
            del self._buckets[tenant]  # as good as new
            return self.capacity_s
        bucket.level_s, bucket.at = level, now
        return level

    def spent(self, tenant: str) -> bool:
        """Whether the tenant has spent its budget: its checks are to be given up."""
        return self.left_s(tenant) <= 0

    def charge(self, tenant: str, worker_s: float) -> None:
        """The tenant held a worker for `worker_s` seconds."""
        level = self.left_s(tenant) - max(0.0, worker_s)
        if level < self.capacity_s:
            self._buckets[tenant] = _Bucket(level, self._clock())

    def spent_tenants(self) -> list[str]:
        """The tenants whose budget is spent now, by name."""
        return sorted(t for t in list(self._buckets) if self.spent(t))
